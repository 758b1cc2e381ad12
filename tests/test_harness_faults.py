"""Each fault injector of runner.testing works against the real servers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pika
import pika.exceptions
import pytest
from kazoo.client import KazooClient, KazooState

from coord.testing import NodeProcess, ZooKeeperCluster, expire_session, kill_ensemble_leader
from coord.testing.plugin import TEST_TICK_MS, ZkNamespace
from messaging.testing import RabbitMQServer, broker_outage
from messaging.testing.plugin import AmqpNamespace


def test_expired_session_is_seen_as_lost_and_its_ephemeral_node_goes(
        zk_namespace: ZkNamespace) -> None:
    victim = zk_namespace.client()
    states: list[str] = []
    victim.add_listener(states.append)
    victim.start()
    observer = zk_namespace.client()
    observer.start()
    try:
        victim.create("/member", ephemeral=True)
        expire_session(victim)
        assert KazooState.LOST in states
        assert observer.exists("/member") is None
    finally:
        for client in (victim, observer):
            client.stop()
            client.close()


def _watch_deletion(client: KazooClient, path: str) -> tuple[threading.Event, list[float]]:
    gone = threading.Event()
    when: list[float] = []

    def watcher(event: object) -> None:
        when.append(time.monotonic())
        gone.set()

    assert client.exists(path, watch=watcher) is not None
    return gone, when


def test_killed_node_ephemeral_vanishes_within_session_timeout_plus_a_tick(
        zk_namespace: ZkNamespace, zk_client: KazooClient,
        spawn_node: Callable[..., NodeProcess]) -> None:
    session_timeout = 2.0
    node = spawn_node(["-m", "coord.testing.ephemeral", zk_namespace.hosts, "/members/victim",
                       str(session_timeout)], name="victim")
    gone, when = _watch_deletion(zk_client, "/members/victim")
    killed_at = time.monotonic()
    node.kill()
    assert node.returncode() == -9
    assert gone.wait(session_timeout * 3)
    elapsed = when[0] - killed_at
    # Expiry is rounded up to the next tick; the watch needs a moment to arrive.
    assert elapsed <= session_timeout + TEST_TICK_MS / 1000 + 0.3, elapsed
    assert zk_client.exists("/members/victim") is None


def test_frozen_node_loses_its_session_and_learns_it_after_thawing(
        zk_namespace: ZkNamespace, zk_client: KazooClient,
        spawn_node: Callable[..., NodeProcess]) -> None:
    node = spawn_node(["-m", "coord.testing.ephemeral", zk_namespace.hosts, "/members/frozen",
                       "2.0"], name="frozen")
    gone, _ = _watch_deletion(zk_client, "/members/frozen")
    node.pause()
    assert gone.wait(10), "the server never expired the frozen node's session"
    node.resume()
    node.wait_for_line("STATE LOST", 15)
    assert node.is_alive()
    assert node.terminate() == 0


def test_pika_client_sees_the_broker_go_and_come_back(amqp_vhost: AmqpNamespace) -> None:
    rabbitmq: RabbitMQServer = amqp_vhost.server
    params = pika.URLParameters(amqp_vhost.url)
    connection = pika.BlockingConnection(params)
    channel = connection.channel()
    channel.queue_declare("durable-q", durable=True)
    channel.confirm_delivery()
    channel.basic_publish("", "durable-q", b"kept", pika.BasicProperties(delivery_mode=2))
    with broker_outage(rabbitmq):
        with pytest.raises(pika.exceptions.AMQPError):
            connection.process_data_events(time_limit=5)
            channel.basic_publish("", "durable-q", b"lost", pika.BasicProperties(delivery_mode=2))
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(params)
    again = pika.BlockingConnection(params)
    try:
        method, _, body = again.channel().basic_get("durable-q", auto_ack=True)
        assert method is not None and body == b"kept"
    finally:
        again.close()


@pytest.mark.slow
def test_ensemble_survives_its_leader_dying_and_so_does_the_session(
        zookeeper_ensemble: ZooKeeperCluster) -> None:
    client = KazooClient(hosts=zookeeper_ensemble.hosts, timeout=10.0)
    states: list[str] = []
    client.add_listener(states.append)
    client.start()
    try:
        path = client.create("/survivor-", ephemeral=True, sequence=True)
        session_before = client.client_id[0]
        victim = kill_ensemble_leader(zookeeper_ensemble)
        try:
            # The client notices (its server dropped it or lost quorum) and reconnects.
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                if client.connected and client.exists(path) is not None:
                    break
                time.sleep(0.05)
            assert client.client_id[0] == session_before
            assert client.exists(path) is not None
            assert KazooState.LOST not in states
            assert zookeeper_ensemble.leader() is not victim
        finally:
            victim.start()
            victim.wait_ready()
    finally:
        client.stop()
        client.close()


_KILLED_OWNER = """
import sys, time
from pathlib import Path
from coord.testing import guard
from coord.testing.nodeprocess import NodeProcess
from coord.testing.processes import spawn
guard.enable()
out = Path(sys.argv[1])
_, server = spawn("sleeper", ["sleep", "300"], out / "sleeper.log")
node = NodeProcess(["-c", "import time; print('READY', flush=True); "
                    "time.sleep(300)"], out / "node.log", name="node")
node.start()
print(server.pid, node.pid, flush=True)
time.sleep(300)
"""


def test_a_test_process_killed_takes_the_servers_and_nodes_it_started_with_it(
        tmp_path: Path) -> None:
    """A test process that is killed (SIGTERM before pytest's finalizers, -9, a worker whose
    controller died) runs no finalizer; the servers it spawned and the nodes it started are
    ended all the same, by the guard it told of them (:mod:`coord.testing.guard`). Before,
    they ran on with their ports held."""
    import os
    import signal
    import subprocess
    import sys

    from coord.testing import wait_until
    from coord.testing.guard import proc_start_ticks

    owner = subprocess.Popen([sys.executable, "-c", _KILLED_OWNER, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parent.parent)
    try:
        assert owner.stdout is not None
        server, node = (int(pid) for pid in owner.stdout.readline().split())
        assert proc_start_ticks(server) is not None and proc_start_ticks(node) is not None
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(10)
        assert wait_until(lambda: proc_start_ticks(server) is None
                          and proc_start_ticks(node) is None, 10), "left running"
    finally:
        owner.kill()
        owner.wait(10)
        if owner.stdout is not None:
            owner.stdout.close()
