"""A real round trip through ZooKeeper (coord's session, over kazoo) and RabbitMQ (pika), for
``latchwork dev check``."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import pika

from coord import Session, markers
from runner.errors import SmokeCheckFailed


@dataclass(frozen=True)
class CheckResult:
    service: str
    detail: str


def check_zookeeper(hosts: str, timeout: float = 10.0) -> CheckResult:
    """Open a session, create an ephemeral node, read it back, delete it."""
    session = Session(hosts, "smoke", timeout=timeout, connect_timeout=timeout)
    try:
        started = time.monotonic()
        session.start()
        name, token = uuid.uuid4().hex, uuid.uuid4().hex
        if not markers.place(session, "checks", name, token):
            raise SmokeCheckFailed(f"ZooKeeper says checks/{name} is taken")
        data = markers.read(session, "checks").get(name)
        if data != token:
            raise SmokeCheckFailed(f"ZooKeeper returned {data!r} for checks/{name}")
        markers.remove(session, "checks", name)
        elapsed = (time.monotonic() - started) * 1000
        return CheckResult("zookeeper", f"ephemeral create/read/delete ok in {elapsed:.0f} ms "
                                        f"(session 0x{session.session_id or 0:x})")
    except SmokeCheckFailed:
        raise
    except Exception as exc:
        raise SmokeCheckFailed(f"zookeeper at {hosts}: {type(exc).__name__}: {exc}") from exc
    finally:
        session.close()


def check_rabbitmq(url: str, timeout: float = 10.0) -> CheckResult:
    """Publish one persistent message with a publisher confirm, get it back, ack it."""
    params = pika.URLParameters(url)
    params.socket_timeout = timeout
    params.blocked_connection_timeout = timeout
    try:
        started = time.monotonic()
        connection = pika.BlockingConnection(params)
        try:
            channel = connection.channel()
            channel.confirm_delivery()
            queue = channel.queue_declare("", exclusive=True).method.queue
            body = uuid.uuid4().bytes
            channel.basic_publish("", queue, body,
                                  pika.BasicProperties(delivery_mode=2), mandatory=True)
            method, _, got = channel.basic_get(queue, auto_ack=False)
            if method is None or got != body:
                raise SmokeCheckFailed(f"RabbitMQ returned {got!r} from {queue}")
            channel.basic_ack(method.delivery_tag)
        finally:
            connection.close()
        elapsed = (time.monotonic() - started) * 1000
        return CheckResult("rabbitmq", f"confirmed publish/get/ack ok in {elapsed:.0f} ms")
    except SmokeCheckFailed:
        raise
    except Exception as exc:
        raise SmokeCheckFailed(f"rabbitmq at {params.host}:{params.port}: "
                               f"{type(exc).__name__}: {exc}") from exc


def check_graph(url: str, timeout: float = 10.0) -> CheckResult:
    """Add a vertex to a remote graph, read it back, drop it (plain requests: this checks the
    protocol and the traversals, not transactions)."""
    from runner.store import ServerOptions, open_graph

    try:
        started = time.monotonic()
        graph = open_graph(url, ServerOptions(atomicity="serial", timeout=timeout))
        try:
            token = uuid.uuid4().hex
            graph.write(lambda g: g.add_v("smoke_check").property("smoke", token).iterate())
            found = graph.read(lambda g: g.V().has("smoke", token).values("smoke").to_list())
            graph.write(lambda g: g.V().has("smoke", token).drop().iterate())
            if found != [token]:
                raise SmokeCheckFailed(f"the Gremlin Server at {url} returned {found!r}")
        finally:
            graph.close()
        elapsed = (time.monotonic() - started) * 1000
        return CheckResult("graph", f"vertex add/read/drop ok in {elapsed:.0f} ms")
    except SmokeCheckFailed:
        raise
    except Exception as exc:
        raise SmokeCheckFailed(f"graph at {url}: {type(exc).__name__}: {exc}") from exc
