"""Reliability II: a routine ZooKeeper blip costs no work, a paused owner's cheap cancellation
check sees the pause, and a paused schedule stops its pending fires. Real ZooKeeper (an
ensemble whose leader is killed -9), node processes frozen with SIGSTOP, an embedded graph."""

from __future__ import annotations

import json
import os
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from coord import Session, SessionState
from coord.testing import NodeProcess, ZooKeeperCluster, wait_until
from coord.testing.plugin import ZkNamespace
from messaging.testing.plugin import AmqpNamespace
from runner.store import AttemptStatus, Store, Task, codec, open_store
from runner.tasks import TaskContext, TaskRegistry
from runner.tasks.master.schedules import LOOKAHEAD
from runner.tasks.worker.loop import LoopSettings, TaskLoop
from runner.testing.cluster import Cluster


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(str(tmp_path / "graph.db")) as s:
        yield s


@pytest.mark.slow
def test_handlers_ending_during_a_zookeeper_leader_election_succeed_once(
        zookeeper_ensemble: ZooKeeperCluster, ensemble_namespace: ZkNamespace,
        store: Store) -> None:
    """The ensemble's leader is killed -9 while two handlers end: one simply returns, the
    other calls ``ctx.check()`` and ``ctx.complete()``, both while the session is SUSPENDED.
    The session survives the election, so both attempts SUCCEED and each handler ran once.
    (Before: the end's lock check and ``ctx.check()`` cancelled on any SUSPENDED, and the
    same node ran the task again: its effect twice.)"""
    runs: Counter[str] = Counter()
    state_at_end: dict[str, SessionState] = {}
    suspended = threading.Event()
    go = threading.Event()
    session = Session(ensemble_namespace.hosts, "blip", timeout=4.0)

    def wait_for_the_blip(ctx: TaskContext) -> None:
        runs[ctx.task.id] += 1
        assert go.wait(30)
        assert suspended.wait(10), "the session never saw the leader go"

    def ends(ctx: TaskContext, payload: dict[str, Any]) -> None:
        wait_for_the_blip(ctx)
        state_at_end.setdefault(ctx.task.id, session.state)

    def checks_and_completes(ctx: TaskContext, payload: dict[str, Any]) -> None:
        wait_for_the_blip(ctx)
        state_at_end.setdefault(ctx.task.id, session.state)
        ctx.check()
        ctx.complete(lambda g: g.add_v("blip_effect").property("effect_task", ctx.task.id))

    registry = TaskRegistry()
    registry.register("blip.ends", ends)
    registry.register("blip.completes", checks_and_completes)
    session.add_listener(lambda s: suspended.set() if s is SessionState.SUSPENDED else None)
    with session:
        plain = store.tasks.create("blip.ends")
        completing = store.tasks.create("blip.completes")
        loop = TaskLoop(session, "m1", store, registry,
                        LoopSettings(workers=2, scan_interval=60)).start()
        victim = None
        try:
            assert wait_until(lambda: len(store.attempts.running()) == 2, 15)
            victim = zookeeper_ensemble.leader()
            victim.kill()
            go.set()
            assert wait_until(lambda: store.tasks.get(plain.id).finished
                              and store.tasks.get(completing.id).finished, 20)
            assert session.state is SessionState.CONNECTED
        finally:
            go.set()
            if victim is not None:
                victim.start()
                victim.wait_ready()
            loop.close()
    assert runs == {plain.id: 1, completing.id: 1}
    for task in (plain, completing):
        assert [a.status for a in store.attempts.for_task(task.id)] == [
            AttemptStatus.SUCCEEDED]
    # both handlers really ended while the connection was down
    assert state_at_end == {plain.id: SessionState.SUSPENDED,
                            completing.id: SessionState.SUSPENDED}
    effects = store.graph.read(lambda g: g.V().has_label("blip_effect")
                               .values("effect_task").to_list())
    assert effects == [completing.id]


@pytest.mark.slow
def test_a_join_that_becomes_ready_during_a_zookeeper_leader_election_runs_once(
        zookeeper_ensemble: ZooKeeperCluster, ensemble_namespace: ZkNamespace,
        store: Store) -> None:
    """Issue 72: the two members of a fan-out end while the ensemble's leader is killed -9
    (made to land there: both handlers wait for the kill). Their ends release the join in the
    same write; the join then runs once, and each member succeeded once."""
    from runner.tasks import chord, flows, group, step

    runs: Counter[str] = Counter()
    suspended = threading.Event()
    go = threading.Event()
    session = Session(ensemble_namespace.hosts, "blip", timeout=4.0)

    def member(ctx: TaskContext, payload: dict[str, Any]) -> int:
        runs[ctx.task.id] += 1
        assert go.wait(30)
        assert suspended.wait(10), "the session never saw the leader go"
        return int(payload["n"])

    def join(ctx: TaskContext, payload: dict[str, Any]) -> int:
        runs[ctx.task.id] += 1
        return sum(value for _, value in ctx.results())

    registry = TaskRegistry()
    registry.register("blip.member", member)
    registry.register("blip.join", join)
    session.add_listener(lambda s: suspended.set() if s is SessionState.SUSPENDED else None)
    with session:
        ref = flows.submit_flow(store, registry, chord(group([
            step("blip.member", {"n": 1}), step("blip.member", {"n": 2})]),
            then=step("blip.join")), "blip-join")
        loop = TaskLoop(session, "m1", store, registry,
                        LoopSettings(workers=2, scan_interval=60)).start()
        victim = None
        try:
            assert wait_until(lambda: len(store.attempts.running()) == 2, 15)
            victim = zookeeper_ensemble.leader()
            victim.kill()
            go.set()
            assert wait_until(lambda: store.tasks.get(ref.members[-1]).finished, 30)
        finally:
            go.set()
            if victim is not None:
                victim.start()
                victim.wait_ready()
            loop.close()
    assert runs == {task_id: 1 for task_id in ref.members}
    for task_id in ref.members:
        assert [a.status for a in store.attempts.for_task(task_id)] == [
            AttemptStatus.SUCCEEDED]
    joined = store.attempts.result(ref.members[-1])
    assert joined is not None and joined.text == "3"


PROBE = '''
    """A handler written the way docs/runner.md tells users to: it polls ``ctx.cancel``."""
    import time
    from pathlib import Path

    from pydantic import BaseModel

    from runner.tasks import TaskContext, task


    class Probe(BaseModel):
        out: str
        wait: float


    def note(path: str, line: str) -> None:
        with open(path, "a") as out:
            out.write(line + "\\n")


    @task("probe.pause", payload=Probe)
    def pause_probe(ctx: TaskContext, payload: Probe) -> None:
        note(payload.out, f"waiting {ctx.attempt.id}")
        woke = ctx.cancel.wait(payload.wait)
        seen = ctx.cancel.cancelled  # the first look after the wait
        note(payload.out, f"woke {ctx.attempt.id} {woke} {seen} {time.time()}")
'''


@pytest.fixture
def probe_cluster(zk_namespace: ZkNamespace, amqp_vhost: AmqpNamespace, tmp_path: Path,
                  spawn_node: Callable[..., NodeProcess]) -> Iterator[Cluster]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "probe.py").write_text(textwrap.dedent(PROBE))
    c = Cluster(zk_namespace.hosts, amqp_vhost, tmp_path, spawn_node,
                tasks=json.dumps(["probe"]))
    c.env["PYTHONPATH"] = os.pathsep.join([str(site), c.env.get("PYTHONPATH", "")])
    yield c
    c.store.close()


@pytest.mark.slow
def test_a_handler_paused_past_its_session_sees_itself_cancelled_on_its_first_look(
        probe_cluster: Cluster, tmp_path: Path) -> None:
    """The node is SIGSTOPped past its session while its handler sleeps in
    ``ctx.cancel.wait()``; on SIGCONT the wait, or the handler's first look at
    ``ctx.cancel.cancelled`` after it, reports cancelled, whether or not the session's
    watchdog thread has run yet. (Before: the wait returned False and ``cancelled`` was still
    False, so the handler went on to its effect.)"""
    member = probe_cluster.start_node()
    out = tmp_path / "probe.log"
    # the wait must still run when the SIGSTOP lands and must end during the stop (6 s):
    # 4 s leaves a busy box 4 s to land it (it was 1.5 s)
    task_id = probe_cluster.submit("probe.pause", {"out": str(out), "wait": 4.0})
    assert wait_until(lambda: out.exists() and "waiting" in out.read_text(), 30)
    probe_cluster.pause(member)
    time.sleep(3 * 2.0)  # the cluster's session is 2 s
    probe_cluster.nodes[member].resume()
    first = out.read_text().split()[1]  # the attempt that was paused
    assert wait_until(lambda: f"woke {first}" in out.read_text(), 15)
    (woke_line,) = [line for line in out.read_text().splitlines()
                    if line.startswith(f"woke {first}")]
    _, attempt_id, woke, seen, _at = woke_line.split()
    assert (woke, seen) != ("False", "False"), "the handler did not see its session was gone"
    assert wait_until(lambda: probe_cluster.store.attempts.get(attempt_id).status
                      is not AttemptStatus.RUNNING, 15)
    attempt = probe_cluster.store.attempts.get(attempt_id)
    assert attempt.status is AttemptStatus.CANCELLED_BY_SYSTEM
    assert attempt.task_id == task_id


def schedule_tasks(cluster: Cluster, name: str) -> list[Task]:
    return [t for t in cluster.store.tasks.all("diag.sleep")
            if (t.unique_key or "").startswith(f"schedule:{name}:")]


@pytest.mark.slow
def test_pausing_or_removing_a_schedule_stops_its_fires_made_ahead(cluster: Cluster) -> None:
    """The master makes a schedule's fires up to LOOKAHEAD seconds ahead; a pause (and a
    removal) stops those that have not started, with a reason ``task show`` prints, so none of
    them runs after it. (Before: fires made ahead ran 1.6 s and 3.6 s after the pause.)"""
    cluster.start_node()
    for name in ("tick", "tock"):
        added = cluster.cli("schedule", "add", name, "--every", "2s", "--type", "diag.sleep",
                            "--payload", '{"seconds": 0}')
        assert added.exit_code == 0, added.output

    def made_ahead(name: str) -> list[Task]:
        now = codec.now()
        return [t for t in schedule_tasks(cluster, name) if t.run_at and t.run_at > now]

    assert wait_until(lambda: made_ahead("tick") and made_ahead("tock"), 20)
    assert cluster.cli("schedule", "pause", "tick").exit_code == 0
    assert cluster.cli("schedule", "remove", "tock").exit_code == 0
    stopped_at = codec.now()
    time.sleep(LOOKAHEAD + 2)  # every fire made before the pause is due by now
    for name, why in (("tick", "schedule tick paused"), ("tock", "schedule tock removed")):
        tasks = schedule_tasks(cluster, name)
        late = [a for t in tasks for a in cluster.store.attempts.for_task(t.id)
                if a.started_at > stopped_at]
        assert late == [], f"{name}: fires ran after it was stopped"
        stopped = [t for t in tasks if not t.active]
        assert stopped, f"{name}: no fire made ahead was stopped"
        assert all(t.stop_reason == why and not t.finished and t.attempts == 0
                   for t in stopped)
    shown = cluster.cli("task", "show", stopped[0].id)
    assert "schedule tock removed" in shown.output, shown.output
    # resuming makes new fires; the stopped ones stay stopped
    assert cluster.cli("schedule", "pause", "tick", "--resume").exit_code == 0
    before = {t.id for t in schedule_tasks(cluster, "tick")}
    assert wait_until(lambda: any(t.finished for t in schedule_tasks(cluster, "tick")
                                  if t.id not in before), 20)
    assert all(not t.active for t in schedule_tasks(cluster, "tick")
               if t.id in before and t.stop_reason)
