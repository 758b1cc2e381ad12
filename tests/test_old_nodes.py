"""A node of an older release beside new ones after a migration (issue 70, item 12): it
joined, accepted a submit, and its task stayed WAITING with no attempt while a new node ran
beside it, and nothing said why. The old member is simulated by what it leaves in ZooKeeper
(membership data without a store format, as every release before 0.2.0 wrote it) and in the
graph (an open task as a format-0 node wrote it: ``runner.testing.formats``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from coord import LeaderLatch, Membership, Session
from coord.testing import wait_until
from runner.store.gremlin.incidents import Incident
from runner.tasks.master.layout import MEMBER_FORMAT
from runner.testing.cluster import CLUSTER, SESSION, Cluster
from runner.testing.formats import write_format_0_open_task


@contextmanager
def old_member(cluster: Cluster, master: bool = False) -> Iterator[Membership]:
    """A member as an older release registers (version 0.1.0, no ``store_format``); with
    ``master``, it also wins the latch first."""
    with Session(cluster.env["LATCHWORK_ZK_HOSTS"], CLUSTER, timeout=SESSION) as session:
        member = Membership(session, version="0.1.0", details={}).start()
        latch = LeaderLatch(session, member.member_id).start() if master else None
        try:
            yield member
        finally:
            if latch is not None:
                latch.close()
            member.close()


def format_incidents(cluster: Cluster, member_id: str) -> list[Incident]:
    return [i for i in cluster.store.incidents.open()
            if i.kind == MEMBER_FORMAT and i.task_id == member_id]


def test_an_old_member_is_raised_and_its_old_layout_task_runs(cluster: Cluster) -> None:
    node = cluster.start_node()
    with old_member(cluster) as old:
        assert wait_until(lambda: format_incidents(cluster, old.member_id), 30, 0.2)
        (incident,) = format_incidents(cluster, old.member_id)
        assert "latchwork 0.1.0" in incident.detail and "no store format" in incident.detail
        # a task it wrote: in no ready bucket, found by the master's round and run
        write_format_0_open_task(cluster.store.graph, "old-open-1", "diag.sleep",
                                 {"seconds": 0})
        with cluster.client() as client:
            assert client.wait("old-open-1", 30).succeeded
        log = cluster.nodes[node].log_path.read_text()
        assert "task old-open-1 (diag.sleep) was written in an older store layout" in log
        assert f"incident {old.member_id}:{MEMBER_FORMAT}" in log
        status = cluster.cli("cluster", "status")
        assert old.member_id in status.output
    # it left: the incident resolves itself
    assert wait_until(lambda: not format_incidents(cluster, old.member_id), 30, 0.2)


def test_a_new_node_that_joins_beside_an_old_master_raises_it(cluster: Cluster) -> None:
    """An old master raises nothing; the new node does, as it joins."""
    with old_member(cluster, master=True) as old:
        node = cluster.start_node()
        assert format_incidents(cluster, old.member_id)  # written before it said it joined
        log = cluster.nodes[node].log_path.read_text()
        assert "no store format (a release from before store formats)" in log
