"""A cluster on a Gremlin Server whose server or link fails: silenced, killed -9, restarted.

Each test has a server of its own (TinkerPop 3.5.1, TinkerGraph, one traversal at a time), so
that it can be killed, and the nodes reach it through a TCP proxy that can silence the link
(:class:`~coord.testing.proxy.TcpProxy`). What every fault must leave: nodes still running and
members, every end of an attempt written once the graph answers again (retried with backoff
meanwhile, nothing reported before it is written), no attempt left RUNNING, and a CLI that
says the graph is unreachable in one line.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from coord.testing import NodeProcess, TcpProxy, wait_until
from coord.testing.plugin import ZkNamespace
from messaging.testing.plugin import AmqpNamespace
from runner.errors import StoreUnavailable
from runner.store import AttemptStatus
from runner.store.server.graph import RemoteGraph
from runner.testing.cluster import Cluster
from runner.testing.gremlinserver import GremlinServer


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[GremlinServer]:
    server = GremlinServer(tmp_path / "gremlin-server")
    server.start()
    yield server
    server.kill()


@pytest.fixture
def link(own_server: GremlinServer) -> Iterator[TcpProxy]:
    with TcpProxy(own_server.port) as proxy:
        yield proxy


@pytest.fixture
def server_cluster(zk_namespace: ZkNamespace, amqp_vhost: AmqpNamespace, tmp_path: Path,
                   spawn_node: Callable[..., NodeProcess], link: TcpProxy) -> Iterator[Cluster]:
    c = Cluster(zk_namespace.hosts, amqp_vhost, tmp_path, spawn_node,
                graph=f"ws://127.0.0.1:{link.port}/gremlin", graph_timeout="2",
                graph_retry_for="30")
    yield c
    c.store.close()


def _unreachable_in_one_line(cluster: Cluster) -> None:
    listing = cluster.cli("task", "list", timeout=60)
    lines = [line for line in listing.output.splitlines() if line.strip()]
    assert listing.exit_code != 0 and len(lines) == 1, listing.output
    assert "unreachable" in lines[0] or "cannot reach" in lines[0], lines[0]


def _all_ended_once(cluster: Cluster, task_ids: list[str]) -> None:
    for task_id in task_ids:
        statuses = [a.status for a in cluster.store.attempts.for_task(task_id)]
        assert statuses.count(AttemptStatus.SUCCEEDED) == 1, (task_id, statuses)
        assert AttemptStatus.RUNNING not in statuses, (task_id, statuses)


def test_a_silenced_link_delays_the_ends_and_loses_none(
        server_cluster: Cluster, link: TcpProxy) -> None:
    """The link to the graph goes silent (nothing answers, nothing is closed) while four
    handlers end: their ends time out (graph_timeout 2 s), are tried again with backoff, and
    are written once the link heals; the requests held by the silent link are delivered then
    too (a late duplicate of an end finds the attempt already ended as this node ends it).
    No task runs twice, none is left RUNNING, and both nodes are still members."""
    members = [server_cluster.start_node(), server_cluster.start_node()]
    tasks = [server_cluster.submit("diag.sleep", {"seconds": 2.0}) for _ in range(4)]
    assert wait_until(lambda: sum(
        1 for t in tasks for a in server_cluster.store.attempts.for_task(t)
        if a.status is AttemptStatus.RUNNING) == 4, 30, 0.1)
    link.blackhole()
    try:
        time.sleep(1.0)
        _unreachable_in_one_line(server_cluster)
        time.sleep(max(0.0, 6.0))  # the handlers end meanwhile; their ends keep retrying
    finally:
        link.heal()
    for task_id in tasks:
        server_cluster.wait_finished(task_id, timeout=60)
    _all_ended_once(server_cluster, tasks)
    assert all(node.is_alive() for node in server_cluster.nodes.values())
    status = server_cluster.cli("cluster", "status")
    assert status.exit_code == 0 and all(m in status.output for m in members), status.output


def test_a_call_over_a_silenced_link_keeps_its_deadline_when_it_connects_anew(
        link: TcpProxy) -> None:
    """Every call has its deadline, the connect of a new connection included: over a link
    gone silent, each read times out whether it finds an open connection in the pool or must
    open one (the pool opens its connections as they are first used; the driver's own
    connect waited up to 300 s for a handshake: the first read here took 300.7 s); once the
    link heals, reads work again."""
    graph = RemoteGraph(f"ws://127.0.0.1:{link.port}/gremlin", atomicity="serial",
                        timeout=1.0)
    try:
        assert graph.read(lambda g: g.inject(1).to_list()) == [1]
        link.blackhole()
        try:
            for _ in range(3):
                began = time.monotonic()
                with pytest.raises(StoreUnavailable, match="no answer in time"):
                    graph.read(lambda g: g.inject(2).to_list())
                assert time.monotonic() - began < 10.0
        finally:
            link.heal()
        assert wait_until(lambda: _answers(graph), 30, 0.2)
    finally:
        graph.close()


def _answers(graph: RemoteGraph) -> bool:
    try:
        return bool(graph.read(lambda g: g.inject(3).to_list()) == [3])
    except StoreUnavailable:
        return False


def test_a_graph_server_restarted_cleanly_keeps_its_data_and_the_cluster_goes_on(
        server_cluster: Cluster, own_server: GremlinServer) -> None:
    """SIGTERM and start again (TinkerGraph writes its data file on the stop and reads it at
    the start): the tasks submitted before are still there, the ends of the attempts that
    ended during the restart are written after it, and each task succeeds once."""
    server_cluster.start_node()
    server_cluster.start_node()
    tasks = [server_cluster.submit("diag.sleep", {"seconds": 1.5}) for _ in range(4)]
    assert wait_until(lambda: all(server_cluster.store.attempts.for_task(t) for t in tasks),
                      30, 0.1)
    own_server.stop()
    _unreachable_in_one_line(server_cluster)
    time.sleep(2.0)  # the handlers end while the server is down
    own_server.start()
    for task_id in tasks:
        server_cluster.wait_finished(task_id, timeout=60)
    _all_ended_once(server_cluster, tasks)
    assert all(node.is_alive() for node in server_cluster.nodes.values())


def test_a_graph_server_killed_loses_what_it_held_in_memory_and_the_nodes_go_on(
        server_cluster: Cluster, own_server: GremlinServer) -> None:
    """kill -9 and start again: TinkerGraph kept everything in memory, and what was written
    since its last clean stop is lost (here: every task and attempt; a production graph
    server keeps its data: docs/graph.md). What the test holds the nodes to: they keep
    running through the outage (the CLI says the graph is unreachable in one line), an end
    that cannot be written is given up after graph_retry_for without crashing anything, and
    the next tasks run on the restarted server, each once."""
    server_cluster.env["LATCHWORK_GRAPH_RETRY_FOR"] = "3"
    server_cluster.start_node()
    server_cluster.start_node()
    before = [server_cluster.submit("diag.sleep", {"seconds": 1.0}) for _ in range(2)]
    assert wait_until(lambda: all(server_cluster.store.attempts.for_task(t) for t in before),
                      30, 0.1)
    own_server.kill()
    _unreachable_in_one_line(server_cluster)
    time.sleep(5.0)  # the handlers end, their ends are tried for 3 s and given up
    own_server.start()
    assert server_cluster.store.tasks.all() == []  # what an in-memory server loses
    after = [server_cluster.submit("diag.sleep", {"seconds": 0.2}) for _ in range(4)]
    for task_id in after:
        server_cluster.wait_finished(task_id, timeout=60)
    _all_ended_once(server_cluster, after)
    assert all(node.is_alive() for node in server_cluster.nodes.values())
