"""`latchwork node start`: joins membership and the election; SIGTERM leaves at once, exit 0."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from coord import Session, read_leader, read_members
from coord.testing import NodeProcess
from coord.testing.plugin import ZkNamespace
from messaging.testing.plugin import AmqpNamespace


@contextmanager
def zk_behind_a_proxy(zk_namespace: ZkNamespace) -> Iterator[tuple[Any, str]]:
    """A TCP proxy in front of the namespace's first ZooKeeper server (to cut the link), and
    the ``zk_hosts`` that reach it."""
    from coord.testing.proxy import TcpProxy

    servers, _, chroot = zk_namespace.hosts.partition("/")
    with TcpProxy(int(servers.split(",")[0].rsplit(":", 1)[1])) as proxy:
        yield proxy, f"127.0.0.1:{proxy.port}/{chroot}"


def node_env(zk_hosts: str, cluster: str, amqp_vhost: AmqpNamespace,
             tmp_path: os.PathLike[str]) -> dict[str, str]:
    """A node's environment with a 3 s session, for the tests that cut its ZooKeeper link."""
    return {**os.environ, "LATCHWORK_ZK_HOSTS": zk_hosts, "LATCHWORK_CLUSTER": cluster,
            "LATCHWORK_SESSION_TIMEOUT": "3", "LATCHWORK_AMQP_URL": amqp_vhost.url,
            "LATCHWORK_GRAPH": os.path.join(tmp_path, "graph.db")}

def test_nodes_join_elect_a_master_and_leave_cleanly_on_sigterm(
        zk_namespace: ZkNamespace, amqp_vhost: AmqpNamespace, tmp_path: os.PathLike[str],
        spawn_node: Callable[..., NodeProcess]) -> None:
    env = {**os.environ, "LATCHWORK_ZK_HOSTS": zk_namespace.hosts, "LATCHWORK_CLUSTER": "demo",
           "LATCHWORK_SESSION_TIMEOUT": "4", "LATCHWORK_AMQP_URL": amqp_vhost.url,
           "LATCHWORK_GRAPH": os.path.join(tmp_path, "graph.db")}
    nodes = {}
    for i in range(2):
        node = spawn_node(["-m", "runner.cli", "node", "start"], name=f"node{i}", env=env,
                          ready_prefix="latchwork node")
        nodes[node.lines[-1].split()[2]] = node
    with Session(zk_namespace.hosts, "demo") as reader:
        assert set(read_members(reader)) == set(nodes)
        deadline = time.monotonic() + 5
        while read_leader(reader) not in nodes and time.monotonic() < deadline:
            time.sleep(0.02)
        master = read_leader(reader)
        assert master in nodes
        stopped = time.monotonic()
        assert nodes[master].terminate(timeout=10) == 0
        (other,) = [m for m in nodes if m != master]
        while read_leader(reader) != other and time.monotonic() - stopped < 2:
            time.sleep(0.01)
        # handed over well before the 4 s session timeout could have expired anything
        assert read_leader(reader) == other
        assert time.monotonic() - stopped < 2
        assert set(read_members(reader)) == {other}
        assert "became master" in nodes[master].stderr_tail(50)
        assert nodes[other].terminate(timeout=10) == 0
        assert read_members(reader) == {}


def test_a_node_stopped_while_its_zookeeper_is_silent_exits_within_its_shutdown_bound(
        zk_namespace: ZkNamespace, amqp_vhost: AmqpNamespace, tmp_path: os.PathLike[str],
        spawn_node: Callable[..., NodeProcess]) -> None:
    """SIGTERM while the node's ZooKeeper answers nothing (its link silenced, as a network
    partition does): the node does not wait for ZooKeeper to tidy up (its mailbox, its member
    and latch nodes, which the master prunes or the session's expiry removes): once the
    session is seen not connected it is closed first, and the node exits 0 within about the
    session timeout, saying what it left. (It waited for ever: the mailbox's delete, a MASTER
    handler's ZooKeeper call, the latch's worker.)"""
    with zk_behind_a_proxy(zk_namespace) as (proxy, zk_hosts):
        node = spawn_node(["-m", "runner.cli", "node", "start"], name="silent",
                          env=node_env(zk_hosts, "silent", amqp_vhost, tmp_path),
                          ready_prefix="latchwork node")
        proxy.blackhole()
        stopped = time.monotonic()
        assert node.terminate(timeout=30) == 0
        took = time.monotonic() - stopped
        log = node.stderr_tail(60)
        # within the session's 3 s: the session is closed once ZooKeeper is seen not
        # answering, and every ZooKeeper call still waiting fails at once
        assert took < 8, (took, log)
        assert "its session is closed first" in log and "left" in log, log
        proxy.heal()


def test_node_start_rejects_bad_configuration(tmp_path: os.PathLike[str]) -> None:
    import subprocess
    import sys
    env = {**os.environ, "LATCHWORK_WORKERS": "zero"}
    result = subprocess.run([sys.executable, "-m", "runner.cli", "node", "start"], env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2  # input the user must change
    assert "workers" in result.stderr and "invalid configuration" in result.stderr


def test_a_node_has_a_lifecycle_started_once(zk_namespace: ZkNamespace,
                                              amqp_vhost: AmqpNamespace,
                                              tmp_path: os.PathLike[str]) -> None:
    """LATENT, STARTED, CLOSED (Curator's model, like the coord recipes'): a second start, or
    a start after close, is refused; close is idempotent."""
    import pytest

    from coord import LifecycleError
    from runner.config import Settings
    from runner.node.node import Node, NodeState

    settings = Settings.load(cluster="life", zk_hosts=zk_namespace.hosts, amqp_url=amqp_vhost.url,
                             graph=str(os.path.join(tmp_path, "graph.db")), session_timeout=2,
                             data_dir=str(os.path.join(tmp_path, "data")))
    node = Node(settings)
    assert node.state is NodeState.LATENT
    with node:
        assert node.state is NodeState.STARTED
        with pytest.raises(LifecycleError, match="STARTED"):
            node.start()
        assert node.member_id in read_members(node.session)
    assert node.state is NodeState.CLOSED
    node.close()  # again: nothing
    with pytest.raises(LifecycleError, match="CLOSED"):
        node.start()


def test_the_observers_a_node_is_given_hear_attempts_scans_commands_and_deliveries(
        zk_namespace: ZkNamespace, amqp_vhost: AmqpNamespace,
        tmp_path: os.PathLike[str]) -> None:
    """One observer seam: the list a node builds once (its metrics, then ``Node(observers=)``)
    reaches the task loop (an attempt's start and end, scans), the declared broadcasts'
    handlers (``after_command``) and, through one adapter, the bus (``on_delivery``)."""
    import threading

    from coord.testing import wait_until
    from coord.testing.ports import free_ports
    from messaging import DeliveryOutcome
    from runner.config import Settings
    from runner.node.node import Node
    from runner.requests import TaskSubmit
    from runner.tasks.observer import Observer

    class Recorder(Observer):
        def __init__(self) -> None:
            self.heard: list[tuple[str, ...]] = []
            self.lock = threading.Lock()

        def note(self, *what: str) -> None:
            with self.lock:
                self.heard.append(what)

        def before_attempt(self, ctx: object) -> None:
            self.note("before", ctx.task.id)  # type: ignore[attr-defined]

        def after_attempt(self, ctx: object, status: object, error: object) -> None:
            self.note("after", ctx.task.id, status.value)  # type: ignore[attr-defined]

        def after_scan(self, seconds: float) -> None:
            self.note("scan")

        def after_command(self, name: str, seconds: float, result: str) -> None:
            self.note("command", name, result)

        def on_delivery(self, delivery: object, envelope: object, outcome: DeliveryOutcome,
                        detail: str) -> None:
            command = getattr(envelope, "command", "")
            self.note("delivery", command, outcome.value)

        def has(self, *what: str) -> bool:
            with self.lock:
                return what in self.heard

    recorder = Recorder()
    settings = Settings.load(cluster="seam", zk_hosts=zk_namespace.hosts,
                             amqp_url=amqp_vhost.url, metrics_port=free_ports(1)[0],
                             graph=str(os.path.join(tmp_path, "graph.db")), session_timeout=2,
                             data_dir=str(os.path.join(tmp_path, "data")))
    with Node(settings, observers=[recorder]) as node:
        task = node.submit(TaskSubmit(type="diag.sleep", payload={"seconds": 0}))
        assert wait_until(lambda: recorder.has("after", task.id, "SUCCEEDED"), 30, 0.02)
        assert recorder.has("before", task.id) and recorder.has("scan")
        node.bus.broadcast("UPDATE_CACHE", {"reason": "the seam test"})
        assert wait_until(lambda: recorder.has("delivery", "UPDATE_CACHE", "handled"), 30, 0.02)
        assert recorder.has("command", "UPDATE_CACHE", "ok")
        metrics = node.metrics
        assert metrics is not None and node._started().observers == [metrics, recorder]


def test_an_attempts_end_is_logged_when_written_not_when_the_zookeeper_link_returns(
        zk_namespace: ZkNamespace, amqp_vhost: AmqpNamespace, tmp_path: os.PathLike[str],
        spawn_node: Callable[..., NodeProcess]) -> None:
    """Issue 70, item 8: a node cut off from ZooKeeper (a black-holed link, no RST) declares its
    session LOST within its timeout and cancels its task, whose end is written to the graph at
    once; its "attempt 1 CANCELLED_BY_SYSTEM" line appeared only when the link healed (28 s
    later there), after the lock's release got through. The link stays cut here until that
    line is in the log (or 20 s pass): it must come while the link is down."""
    from coord.testing import wait_until
    from runner.client import Client

    with zk_behind_a_proxy(zk_namespace) as (proxy, zk_hosts):
        node = spawn_node(["-m", "runner.cli", "node", "start"], name="cut",
                          env=node_env(zk_hosts, "cut", amqp_vhost, tmp_path),
                          ready_prefix="latchwork node")
        with Client(amqp_vhost.url, "cut", timeout=30) as client:
            task = client.submit("diag.sleep", {"seconds": 120})
            assert wait_until(lambda: client.get(task.id).task.state == "running", 30, 0.1)
        proxy.blackhole()
        ended = "attempt 1 CANCELLED_BY_SYSTEM"
        try:
            assert wait_until(lambda: ended in node.log_path.read_text(), 20, 0.1), \
                node.stderr_tail(40)
        finally:
            proxy.heal()
        assert node.terminate(timeout=30) == 0
