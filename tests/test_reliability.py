"""Reliability defects found by a chaos run, each tried against real ZooKeeper and an embedded
graph: the reaper's member snapshot, the lost-lock window of a start, and handlers fencing their
own effects (``ctx.check()``, fenced store writes)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

import runner.tasks.master.duties as master_module
import runner.tasks.worker.claim as claim_module
from coord import LeaderLatch, Membership, Session, TaskLock, force_release, lock_owner
from coord.testing import wait_until
from coord.testing.plugin import ZkNamespace
from runner.errors import StaleFencingToken, StoreUnavailable
from runner.store import AttemptStatus, Store, open_store
from runner.tasks import Observer, TaskCancelled, TaskContext, TaskRegistry
from runner.tasks.features.diag import effects, register_diagnostics
from runner.tasks.master.duties import MasterDuties, Pruning
from runner.tasks.worker.loop import LoopSettings, TaskLoop


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(str(tmp_path / "graph.db")) as s:
        yield s


def session(ns: ZkNamespace) -> Session:
    return Session(ns.hosts, "rel", timeout=4.0)


def test_the_reaper_does_not_take_a_member_that_joined_during_its_pass_for_dead(
        zk_namespace: ZkNamespace, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A member joins and takes a lock right after the reaper read the members: listing the
    locks after that read took the newcomer's lock for a dead member's and freed it."""
    task = store.tasks.create("t")
    heard: list[tuple[str, str]] = []

    class Heard(Observer):  # the master's duties report through the observer seam
        def on_lock_freed(self, task_id: str, owner: str) -> None:
            heard.append((task_id, owner))

    with session(zk_namespace) as s, session(zk_namespace) as other:
        duties = MasterDuties(LeaderLatch(s, "master"), store, observers=[Heard()])
        real = master_module.read_members
        joined: list[tuple[Membership, TaskLock]] = []

        def read_then_someone_joins(sess: Session) -> Any:
            members = real(sess)
            if not joined:
                newcomer = Membership(other).start()
                lock = TaskLock(other, task.id, newcomer.member_id)
                assert lock.try_acquire() is not None
                joined.append((newcomer, lock))
            return members

        monkeypatch.setattr(master_module, "read_members", read_then_someone_joins)
        assert duties.reap() == []
        (newcomer, lock), = joined
        assert lock.verify() and lock_owner(s, task.id) == newcomer.member_id
        # a later pass sees it alive too; once it is gone, its lock is freed
        assert duties.reap() == []
        newcomer.close()
        assert wait_until(lambda: duties.reap() == [task.id], 10)
        assert lock_owner(s, task.id) is None
        assert heard == [(task.id, newcomer.member_id)]


def test_the_reaper_reads_every_lock_only_when_a_member_left_or_joined_or_its_time_came(
        zk_namespace: ZkNamespace, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``reap_interval`` the reaper read every held lock and every RUNNING attempt: its
    cost grew with the locks held, all the time. A pass now reads the member ids first and
    goes no further while they are those its last full pass began with (nobody left: no lock
    can have lost its owner), except every ``FULL_REAP_INTERVAL``; a member that leaves makes
    the next pass a full one, which frees its lock; so does a new mastership."""
    task = store.tasks.create("t")
    full: list[float] = []
    real = master_module.held_locks

    def counted(*args: Any, **kwargs: Any) -> Any:
        full.append(time.monotonic())
        return real(*args, **kwargs)

    monkeypatch.setattr(master_module, "held_locks", counted)
    monkeypatch.setattr(master_module, "FULL_REAP_INTERVAL", 1.5)
    with session(zk_namespace) as s, session(zk_namespace) as other:
        duties = MasterDuties(LeaderLatch(s, "master"), store)
        member = Membership(other).start()
        lock = TaskLock(other, task.id, member.member_id)
        assert lock.try_acquire() is not None
        assert duties.reap() == [] and len(full) == 1
        assert duties.reap() == [] and duties.reap() == [] and len(full) == 1
        assert wait_until(lambda: duties.reap() == [] and len(full) == 2, 5)  # its time came
        # a lock of a member id that never was (no membership change announces it): freed
        # by the next full pass, not before
        ghost = TaskLock(other, store.tasks.create("t").id, "ghost:1:dead")
        assert ghost.try_acquire() is not None
        assert duties.reap() == [] and len(full) == 2
        assert wait_until(lambda: duties.reap() == [ghost.task_id], 5) and len(full) == 3
        member.close()  # the member leaves: the next pass is full and frees its lock
        assert duties.reap() == [task.id] and len(full) == 4
        assert lock_owner(s, task.id) is None
        duties._gained()  # a new mastership's first pass is full too
        assert duties.reap() == [] and len(full) == 5


class RecordingLock(TaskLock):
    made: ClassVar[list[TaskLock]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        RecordingLock.made.append(self)


def test_a_lock_lost_between_acquire_and_claim_still_cancels_the_attempt(
        zk_namespace: ZkNamespace, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lost-lock listener used to be registered after the claim: a loss in between was
    never delivered, and the handler ran to SUCCEEDED without its lock. Here the session
    expires (its locks go with it) after the batch's locks were taken and before its claims are
    written: the claim is written, and the handler is cancelled all the same (its attempt
    CANCELLED_BY_SYSTEM), never SUCCEEDED."""
    from coord.testing import expire_session

    registry = TaskRegistry()
    register_diagnostics(registry)
    task = store.tasks.create("diag.sleep", {"seconds": 3})
    RecordingLock.made = []
    monkeypatch.setattr(claim_module, "TaskLock", RecordingLock)
    real_claim = store.claim_many

    with session(zk_namespace) as s:
        def claim_after_the_lock_is_gone(*args: Any, **kwargs: Any) -> Any:
            expire_session(s.client)
            lock = RecordingLock.made[-1]
            assert wait_until(lambda: not lock.is_held, 10), "the loss never reached the lock"
            return real_claim(*args, **kwargs)

        monkeypatch.setattr(store, "claim_many", claim_after_the_lock_is_gone)
        processor = TaskLoop(s, "m1", store, registry,
                             LoopSettings(workers=1, scan_interval=60)).start()
        try:
            assert wait_until(lambda: [a.status for a in store.attempts.for_task(task.id)]
                              == [AttemptStatus.CANCELLED_BY_SYSTEM], 10)
        finally:
            processor.close()
    (attempt,) = store.attempts.for_task(task.id)
    assert "lock was lost" in (attempt.error or "") or "session" in (attempt.error or "")
    assert not store.tasks.get(task.id).finished


def test_ctx_check_and_fenced_writes_stop_an_owner_that_lost_its_task(
        zk_namespace: ZkNamespace, store: Store) -> None:
    """A handler asks ``ctx.check()`` before its effect and writes through its fence: once the
    master closed its attempt (the fence moved) or its lock node went, neither goes through,
    and the effect is not written. A handler that still owns its task passes both."""
    go = threading.Event()
    seen: dict[str, str] = {}

    def write_vertex(ctx: TaskContext, label: str) -> None:
        ctx.store.fenced_write(ctx.fence, lambda g: g.add_v(label)
                               .property("effect_task", ctx.task.id)
                               .property("effect_attempt", ctx.attempt.id)
                               .property("effect_token", "0").property("effect_at", "-")
                               .iterate())

    def effect_after_go(ctx: TaskContext, payload: dict[str, Any]) -> None:
        go.wait(20)
        key = f"{payload['name']}#{ctx.attempt.seq}"
        try:
            ctx.check()
        except TaskCancelled as exc:
            seen[key] = f"check refused: {exc}"
            try:  # a handler that went on anyway: its fenced write
                write_vertex(ctx, "probe")
                seen[key] += ", write passed"
            except StaleFencingToken:
                seen[key] += ", write refused"
            raise
        seen[key] = "check passed"
        write_vertex(ctx, "diag_effect")

    registry = TaskRegistry()
    registry.register("e", effect_after_go)
    fenced_off = store.tasks.create("e", {"name": "fenced-off"})
    lock_gone = store.tasks.create("e", {"name": "lock-gone"})
    owner = store.tasks.create("e", {"name": "owner"})
    with session(zk_namespace) as s, session(zk_namespace) as master:
        processor = TaskLoop(s, "m1", store, registry,
                             LoopSettings(workers=3, scan_interval=60)).start()
        try:
            assert wait_until(lambda: len(store.attempts.running()) == 3, 10)
            store.close_attempts(fenced_off.id, AttemptStatus.CANCELLED_BY_SYSTEM,
                                 "master: owner left", executor="m1")
            force_release(master, lock_gone.id)
            go.set()
            assert wait_until(lambda: all(store.tasks.get(t.id).finished
                                          for t in (owner, fenced_off, lock_gone)), 20), seen
        finally:
            processor.close()
    assert seen["owner#1"] == "check passed", seen
    assert seen["fenced-off#1"].startswith("check refused"), seen
    assert "superseded" in seen["fenced-off#1"] and seen["fenced-off#1"].endswith(
        "write refused"), seen
    # a lost lock alone does not move the fence (nobody else owns the task yet): the check is
    # what stops this one
    assert seen["lock-gone#1"].startswith("check refused"), seen
    assert "lock was lost" in seen["lock-gone#1"], seen
    # each task's effect was written once, by the attempt that succeeded (the two that lost
    # their task were taken up again)
    by_task = {e.task_id: e.attempt_id for e in effects(store)}
    assert len(effects(store)) == 3 and set(by_task) == {owner.id, fenced_off.id, lock_gone.id}
    for task_id, attempt_id in by_task.items():
        assert store.attempts.get(attempt_id).status is AttemptStatus.SUCCEEDED
        assert store.tasks.get(task_id).finished
    assert [a.status for a in store.attempts.for_task(fenced_off.id)] == [
        AttemptStatus.CANCELLED_BY_SYSTEM, AttemptStatus.SUCCEEDED]


def test_an_owner_whose_attempt_the_master_closed_cannot_finish_the_task(
        zk_namespace: ZkNamespace, store: Store) -> None:
    """The first-round defect, made deterministic: the handler succeeds only after the master
    closed its attempt (the owner was frozen past its session, say). The owner used to re-read
    the task and finish it with its old token (``finished``, its only attempt
    CANCELLED_BY_SYSTEM); the close now moves the fence, and the owner writes nothing.

    And it takes the task up again by itself: a fresh-clone CI run once left the task WAITING
    past the test's 10 s. The refused end counted as FINISHED, so the worker's follow-up scan
    only walked what was left of its old listing, and listed again only within its relisting
    budget (a listing slowed by a loaded box used it up): the task waited for the interval
    scan. A refused end is now a lost task (CANCELLED: a full scan a moment later). The budget
    is set here so that a follow-up scan never lists again, which made that run's timing the
    rule."""
    go, returned = threading.Event(), threading.Event()

    def succeed_after_go(ctx: TaskContext, payload: dict[str, Any]) -> None:
        go.wait(20)
        returned.set()

    registry = TaskRegistry()
    registry.register("t", succeed_after_go)
    task = store.tasks.create("t")
    with session(zk_namespace) as s:
        processor = TaskLoop(s, "m1", store, registry,
                             LoopSettings(workers=1, scan_interval=60, relist_share=1e-9)).start()
        try:
            assert wait_until(lambda: len(store.attempts.running()) == 1, 10)
            duties = MasterDuties(LeaderLatch(s, "master"), store)
            duties._close_attempts(task.id, "m1")  # what reap() does for a dead owner
            go.set()
            assert returned.wait(10)
            # the task is taken up again (it is WAITING and active) and finished by an attempt
            # that succeeded: never by the closed one
            assert wait_until(lambda: store.tasks.get(task.id).finished, 10)
            assert [a.status for a in store.attempts.for_task(task.id)] == [
                AttemptStatus.CANCELLED_BY_SYSTEM, AttemptStatus.SUCCEEDED]
        finally:
            go.set()
            processor.close()


def test_the_master_prunes_processed_message_records_by_age(
        zk_namespace: ZkNamespace, store: Store) -> None:
    """The processed-message log grew without bound; the master now deletes records older than
    the retention, every prune interval, and keeps the newer ones (a redelivery within the
    retention is still recognised)."""
    import time
    import uuid

    from messaging import ZkProcessedLog

    with session(zk_namespace) as s:
        log = ZkProcessedLog(s)
        old = [uuid.uuid4() for _ in range(3)]
        for message_id in old:
            assert log.record(message_id, "m1")
        time.sleep(1.2)  # records carry the server's creation time: let them age
        new = uuid.uuid4()
        assert log.record(new, "m1")
        duties = MasterDuties(LeaderLatch(s, "master"), store,
                              pruning=Pruning(log, retention=1.0, interval=0.0))
        duties.reap()
        assert not any(log.contains(m) for m in old)
        assert log.contains(new)
        assert not log.record(new, "m2")  # still recognised as processed


def test_ctx_complete_writes_the_effect_and_the_success_together_or_neither(
        zk_namespace: ZkNamespace, store: Store) -> None:
    """An owner killed between its effect and its success used to leave the effect behind and
    the task to run again (a second effect). ``ctx.complete()`` writes both at once; an owner
    whose attempt was closed first (the master took the task back) writes neither."""
    go = threading.Event()
    refused: list[str] = []

    def complete_after_go(ctx: TaskContext, payload: dict[str, Any]) -> None:
        go.wait(20)
        try:
            ctx.complete(lambda g: g.add_v("diag_effect").property("effect_task", ctx.task.id)
                         .property("effect_attempt", ctx.attempt.id)
                         .property("effect_token", "0").property("effect_at", "-"))
        except TaskCancelled as exc:
            refused.append(f"{ctx.task.id}: {exc}")
            raise

    registry = TaskRegistry()
    registry.register("e", complete_after_go)
    closed, kept = store.tasks.create("e"), store.tasks.create("e")
    with session(zk_namespace) as s:
        processor = TaskLoop(s, "m1", store, registry,
                             LoopSettings(workers=2, scan_interval=60)).start()
        try:
            assert wait_until(lambda: len(store.attempts.running()) == 2, 10)
            store.close_attempts(closed.id, AttemptStatus.CANCELLED_BY_SYSTEM,
                                 "master: owner left", executor="m1")
            go.set()
            # no master here to broadcast TRIGGER_SCAN once the refused attempt is written (the
            # follow-up scan of the kept task may run while this one is still in hand)
            assert wait_until(lambda: bool(refused)
                              and closed.id not in processor.running_tasks(), 20)
            processor.trigger()
            assert wait_until(lambda: store.tasks.get(closed.id).finished
                              and store.tasks.get(kept.id).finished, 20)
        finally:
            processor.close()
    assert len(refused) == 1 and refused[0].startswith(closed.id)
    assert "closed by someone else" in refused[0]
    records = {e.task_id: e.attempt_id for e in effects(store)}
    assert len(effects(store)) == 2 and set(records) == {closed.id, kept.id}
    for task_id in (closed.id, kept.id):
        final = store.attempts.for_task(task_id)[-1]
        assert final.status is AttemptStatus.SUCCEEDED and records[task_id] == final.id
    assert [a.status for a in store.attempts.for_task(closed.id)] == [
        AttemptStatus.CANCELLED_BY_SYSTEM, AttemptStatus.SUCCEEDED]


@pytest.mark.parametrize("applied", [False, True], ids=["not_written", "answer_lost"])
def test_ctx_complete_with_the_graph_out_of_reach_is_a_system_cancellation(
        zk_namespace: ZkNamespace, store: Store, applied: bool) -> None:
    """The graph goes out of reach under ``ctx.complete()`` (a cut link, a server restart:
    ``StoreUnavailable``), before its write ran or after it ran with its answer lost. Which
    one cannot be known then, and it is no fault of the handler: the attempt is cancelled by
    the system (it was recorded FAILED with the error, and the task stopped). Not written: the
    attempt is closed CANCELLED_BY_SYSTEM and the task runs again, its effect written once by
    the next attempt. Written: the attempt stays SUCCEEDED (the cancellation's end is refused)
    and the task finished, its effect once."""
    calls: list[str] = []
    registry = TaskRegistry()

    def completes(ctx: TaskContext, payload: dict[str, Any]) -> None:
        calls.append(ctx.attempt.id)
        ctx.complete(lambda g: g.add_v("diag_effect").property("effect_task", ctx.task.id)
                     .property("effect_attempt", ctx.attempt.id)
                     .property("effect_token", "0").property("effect_at", "-"))

    registry.register("e", completes)
    original = store.complete
    failures = [1]

    def unreachable(*args: Any) -> Any:
        if failures[0]:
            failures[0] -= 1
            if applied:
                original(*args)
            raise StoreUnavailable("Gremlin Server unreachable: no answer in time")
        return original(*args)

    store.complete = unreachable  # type: ignore[method-assign]
    task = store.tasks.create("e")
    with session(zk_namespace) as s:
        processor = TaskLoop(s, "m1", store, registry,
                             LoopSettings(workers=1, scan_interval=60)).start()
        try:
            assert wait_until(lambda: store.tasks.get(task.id).finished, 20)
            assert wait_until(lambda: not processor.running_tasks(), 10)
        finally:
            processor.close()
    attempts = store.attempts.for_task(task.id)
    records = effects(store)
    assert len(records) == 1 and records[0].attempt_id == attempts[-1].id
    if applied:
        assert [a.status for a in attempts] == [AttemptStatus.SUCCEEDED]
        assert len(calls) == 1
    else:
        assert [a.status for a in attempts] == [AttemptStatus.CANCELLED_BY_SYSTEM,
                                                AttemptStatus.SUCCEEDED]
        assert "out of reach" in (attempts[0].error or "")
        assert len(calls) == 2


def test_closing_the_master_duties_waits_for_their_on_master_action(
        zk_namespace: ZkNamespace, store: Store) -> None:
    """The on-master action (publish SYNCHRONIZE_MODEL) runs on a thread of its own, using the
    bus, which the node closes right after the duties: a node closed just after it became
    master closed the bus under that publish (pika failed in another thread, seen in a full
    suite's run). close() now returns only once the action has ended."""
    began, finished = threading.Event(), threading.Event()

    def announce() -> None:
        began.set()
        time.sleep(0.5)  # a publish waiting for its confirm
        finished.set()

    with session(zk_namespace) as s:
        latch = LeaderLatch(s, "master").start()
        duties = MasterDuties(latch, store, on_master=announce).start()
        try:
            assert began.wait(10)
        finally:
            duties.close()
            assert finished.is_set(), "close() returned while the on-master action ran"
            latch.close()
