"""TaskLoop in-process against real ZooKeeper and an embedded graph file:
priorities, per-type slots across nodes, hooks, cancellation."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from coord import Session, TaskLock, lock_owner
from coord.testing import wait_until
from coord.testing.plugin import ZkNamespace
from runner.store import (
    Attempt,
    AttemptStatus,
    Conclusion,
    Store,
    Task,
    TaskStatus,
    codec,
    open_store,
)
from runner.tasks import TaskContext, TaskRegistry
from runner.tasks.observer import Hooks
from runner.tasks.worker.backlog import Backlog, candidates, preferred_index
from runner.tasks.worker.loop import Admission, LoopSettings, TaskLoop
from runner.tasks.worker.running import Ending
from runner.tasks.worker.timing import DueTimer


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(str(tmp_path / "graph.db")) as s:
        yield s


def session(ns: ZkNamespace) -> Session:
    """Not started: ``with session(ns) as s`` starts it."""
    return Session(ns.hosts, "p1", timeout=4.0)


def held_until_close(ran: list[str]) -> Callable[[TaskContext, object], None]:
    """A handler that records its task and then holds its worker until the processor closes:
    a finished worker would scan again and could take the tasks the test left to others."""
    def handler(ctx: TaskContext, payload: object) -> None:
        ran.append(ctx.task.id)
        ctx.cancel.wait(60)
    return handler


def test_higher_priority_first_and_hooks_unwind_in_reverse(
        zk_namespace: ZkNamespace, store: Store) -> None:
    order: list[str] = []
    registry = TaskRegistry()
    registry.register("t", lambda ctx, p: order.append(f"run {p['name']}"))
    for name, priority in (("low", 0), ("high", 9), ("mid", 5)):
        store.tasks.create("t", {"name": name}, priority=priority)

    def before(tag: str):  # type: ignore[no-untyped-def]
        return lambda ctx: order.append(f"before {tag} {ctx.task.payload['name']}")

    def after(tag: str):  # type: ignore[no-untyped-def]
        return lambda ctx, status, error: order.append(
            f"after {tag} {ctx.task.payload['name']} {status.value}")

    with session(zk_namespace) as s:
        processor = TaskLoop(s, "m1", store, registry, LoopSettings(workers=1, scan_interval=60),
                             observers=[Hooks(before("a"), after("a")),
                                        Hooks(before("b"), after("b"))]).start()
        try:
            assert wait_until(lambda: len(store.tasks.unfinished()) == 0, 30)
        finally:
            processor.close()
    runs = [line for line in order if line.startswith("run")]
    assert runs == ["run high", "run mid", "run low"]
    for name in ("high", "mid", "low"):  # each attempt's hooks unwind in reverse, once written
        assert [line for line in order if line.endswith((name, f"{name} SUCCEEDED"))] == [
            f"before a {name}", f"before b {name}", f"run {name}",
            f"after b {name} SUCCEEDED", f"after a {name} SUCCEEDED"]


def test_a_type_slot_limits_concurrency_across_nodes(
        zk_namespace: ZkNamespace, store: Store) -> None:
    running = 0
    peak = 0
    lock = threading.Lock()

    def limited(ctx: TaskContext, payload: dict[str, object]) -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        ctx.cancel.wait(0.3)
        with lock:
            running -= 1

    for _ in range(4):
        store.tasks.create("limited")
    processors = []
    sessions = [session(zk_namespace).start() for _ in range(2)]
    try:
        for i, s in enumerate(sessions):
            registry = TaskRegistry()
            registry.register("limited", limited, slot_limit=1)
            processors.append(TaskLoop(s, f"m{i}", store, registry,
                                       LoopSettings(workers=3, scan_interval=0.2)).start())
        assert wait_until(lambda: len(store.tasks.unfinished()) == 0, 60)
    finally:
        for p in processors:
            p.close()
        for s in sessions:
            s.close()
    assert peak == 1
    executors = {a.executor for t in store.tasks.all() for a in store.attempts.for_task(t.id)}
    assert executors <= {"m0", "m1"}


def test_close_cancels_running_handlers_and_writes_their_attempts(
        zk_namespace: ZkNamespace, store: Store) -> None:
    started = threading.Event()

    def slow(ctx: TaskContext, payload: dict[str, object]) -> None:
        started.set()
        ctx.cancel.wait(60)
        ctx.cancel.raise_if_cancelled()

    registry = TaskRegistry()
    registry.register("slow", slow)
    task = store.tasks.create("slow")
    with session(zk_namespace) as s:
        processor = TaskLoop(s, "m1", store, registry, LoopSettings(scan_interval=60)).start()
        assert started.wait(30)
        processor.close(timeout=10)
        assert s.client.get_children("/locks/tasks") == []
    (attempt,) = store.attempts.for_task(task.id)
    assert attempt.status is AttemptStatus.CANCELLED_BY_SYSTEM
    assert attempt.error == "cancelled by system: node shutting down"
    assert store.tasks.get(task.id).open


def test_an_old_listing_is_rechecked_before_locking(
        zk_namespace: ZkNamespace, store: Store) -> None:
    """Tasks another node claimed since the listing are dropped by one read, not by a lock
    and a failed claim each."""
    ran: list[str] = []
    registry = TaskRegistry()
    registry.register("t", held_until_close(ran))
    tasks = [store.tasks.create("t") for _ in range(6)]
    with session(zk_namespace) as s:
        # six workers: the first version read covers the whole old listing
        processor = TaskLoop(s, "m1", store, registry, LoopSettings(workers=6, scan_interval=600))
        listed = time.monotonic() - 1.0  # the old listing, a second ago
        processor.backlog.load(candidates(store.tasks.unfinished(), None, processor.member_id,
                                          processor.settings.workers), listed)
        for task in tasks[:4]:  # meanwhile another node claimed four of them
            store.tasks.update(task.id, 0, 9, owner="m2")
        try:
            assert processor.scan(relist=False) == 2  # works through the old listing
            assert wait_until(lambda: len(ran) == 2, 30)
        finally:
            processor.close()
    assert sorted(ran) == sorted(t.id for t in tasks[4:])
    assert processor.stats["skipped_stale"] == 4
    assert processor.stats["stale"] == 0 and processor.stats["lock_busy"] == 0


def test_a_listing_that_goes_stale_during_the_scan_is_rechecked(
        zk_namespace: ZkNamespace, store: Store) -> None:
    """Right after this node listed the open tasks another node claimed four of them: one scan
    walking its listing drops them by a version read, not by a lock and a failed claim each."""
    ran: list[str] = []
    registry = TaskRegistry()
    registry.register("t", held_until_close(ran))
    tasks = [store.tasks.create("t") for _ in range(6)]
    taken = {t.id for t in tasks[:4]}

    with session(zk_namespace) as s:
        processor = TaskLoop(s, "m1", store, registry,
                             LoopSettings(workers=6, scan_interval=600, fresh_for=0.0))
        real_read = processor.backlog.ready.read

        def listing_then_others_claim(limit: int, startable: Callable[[Task], bool],
                                      ahead: bool = True,
                                      shards: Sequence[str] | None = None) -> list[Task]:
            listing = real_read(limit, startable, ahead=ahead, shards=shards)
            for task_id in taken:
                store.tasks.update(task_id, 0, 9, owner="m2")
            return listing

        processor.backlog.ready.read = listing_then_others_claim  # type: ignore[method-assign]
        try:
            assert processor.scan() == 2
            assert wait_until(lambda: len(ran) == 2, 30)
        finally:
            processor.close()
    assert sorted(ran) == sorted(t.id for t in tasks[4:])
    assert processor.stats["skipped_stale"] == 4
    assert processor.stats["stale"] == 0 and processor.stats["lock_busy"] == 0


def scan_stale_backlog(zk_namespace: ZkNamespace, store: Store,
                       listed: tuple[float, float] | None = None
                       ) -> tuple[TaskLoop, str, set[str]]:
    """One worker, and a listing of 20 tasks from a second ago, of which another node has since
    run and finished the first 16 in the order this node would try them; ``listed`` stands for
    the last listing (when it ended, how long it took). Scans once; returns the processor, the
    task it ran and the 4 tasks left."""
    ran: list[str] = []
    registry = TaskRegistry()
    registry.register("t", held_until_close(ran))
    for _ in range(20):
        store.tasks.create("t")
    with session(zk_namespace) as s:
        processor = TaskLoop(s, "m1", store, registry, LoopSettings(workers=1, scan_interval=600))
        old = time.monotonic() - 1.0
        processor.backlog.load(candidates(store.tasks.unfinished(), None, processor.member_id,
                                          processor.settings.workers), old)
        order = [t for t, _, _ in processor.backlog.items]
        for task in order[:16]:
            store.tasks.update(task.id, 0, 9, owner="m2", finished=True)
        if listed is not None:
            processor.backlog.listed = listed
        try:
            assert processor.scan(relist=False) == 1
            assert wait_until(lambda: len(ran) == 1, 30)
        finally:
            processor.close()
    return processor, ran[0], {t.id for t in order[16:]}


def test_a_backlog_found_stale_is_listed_again_instead_of_read_in_growing_chunks(
        zk_namespace: ZkNamespace, store: Store) -> None:
    """The first version read (4 candidates for one free worker) finds only tasks another node
    took: the rest of the backlog is likely gone too, so the open tasks are listed again
    rather than checked 8, 16, ... at a time."""
    processor, ran, left = scan_stale_backlog(zk_namespace, store)
    assert ran in left
    assert processor.stats["skipped_stale"] == 4  # one read of 4, then the listing
    assert processor.stats["listings"] == 1
    assert processor.stats["stale"] == 0 and processor.stats["lock_busy"] == 0


def test_a_stale_backlog_is_not_listed_again_when_listing_would_take_too_much_of_the_time(
        zk_namespace: ZkNamespace, store: Store) -> None:
    """A listing that took long (a big queue) is not repeated sooner than ``relist_share``
    allows: the version reads grow instead (4, 8, then the 8 left)."""
    # as if the last listing had just taken a minute
    processor, ran, left = scan_stale_backlog(zk_namespace, store, (time.monotonic(), 60.0))
    assert ran in left
    assert processor.stats["skipped_stale"] == 16
    assert processor.stats["listings"] == 0


def preferred_split(store: Store, members: list[str], each: int) -> dict[str, list[Task]]:
    """Tasks created until every member is the preferred one of at least ``each``."""
    split: dict[str, list[Task]] = {m: [] for m in members}
    for _ in range(200):
        task = store.tasks.create("t")
        split[sorted(members)[preferred_index(task.id, len(members))]].append(task)
        if all(len(v) >= each for v in split.values()):
            return split
    raise AssertionError("crc32 never spread 200 ids over the members")


def test_a_node_starts_its_preferred_tasks_first_and_the_others_when_none_is_left(
        zk_namespace: ZkNamespace, store: Store) -> None:
    """Two live members: m1 claims the tasks it is preferred for first and, while a listing
    holds any of its own, leaves m2's to m2 (so two nodes walking one queue do not race for the
    same tasks); with workers left, the next listing holds only m2's: m1 takes their oldest."""
    ran: list[str] = []
    registry = TaskRegistry()
    registry.register("t", held_until_close(ran))
    split = preferred_split(store, ["m1", "m2"], 2)
    own, others = split["m1"], split["m2"]
    with session(zk_namespace) as s:
        for member in ("m1", "m2"):
            s.client.create(f"/members/{member}", b"{}", ephemeral=True, makepath=True)
        processor = TaskLoop(s, "m1", store, registry,
                             LoopSettings(workers=len(own) + 2, scan_interval=600))
        try:
            assert processor.scan() == len(own)  # m2's left to m2, workers free or not
            assert processor.stats["deferred_others"] == len(others)
            assert wait_until(lambda: len(ran) == len(own), 30)
            assert processor.scan() == 2  # a listing of m2's tasks alone: none is deferred
            assert wait_until(lambda: len(ran) == len(own) + 2, 30)
        finally:
            processor.close()
    assert {t.id for t in own} <= set(ran)
    taken = [t for t in others if t.id in ran]
    assert len(taken) == 2
    started = {t.id: store.attempts.for_task(t.id)[0].started_at for t in own + taken}
    assert max(started[t.id] for t in own) < min(started[t.id] for t in taken)
    assert processor.stats["lock_busy"] == 0 and processor.stats["stale"] == 0


def test_the_others_tasks_are_taken_once_left_listed_for_steal_after(store: Store) -> None:
    """While a listing holds tasks of this member's, another member's tasks are left to it
    only for ``steal_after`` seconds from when this member first listed them: a preferred
    member that is stopped or slow (its session still alive) holds its tasks back that long
    at most. A listing with none of this member's leaves nothing back. (A backlog of its own:
    a running loop's scans would list meanwhile.)"""
    split = preferred_split(store, ["m1", "m2"], 2)
    mine, theirs = split["m1"], split["m2"]
    backlog = Backlog(store, "m1", DueTimer(lambda: None), Counter(), lambda task_id: False,
                      settings=LoopSettings(workers=1))
    listing = [(t, True) for t in mine] + [(t, False) for t in theirs]
    own = listing[:len(mine)]
    assert backlog._deferring_others(listing, 100.0) == own
    assert backlog._deferring_others(listing, 100.0 + backlog.steal_after / 2) == own
    assert backlog._deferring_others(listing, 100.0 + backlog.steal_after) == listing
    fresh = [(t, False) for t in theirs]  # listed anew, alone: taken at once
    backlog._first_listed.clear()
    assert backlog._deferring_others(fresh, 200.0) == fresh


def test_a_listing_reads_its_own_shards_and_every_task_each_steal_after(
        store: Store) -> None:
    """Two live members: m1's listings read only its own shards' tasks (the others' are
    neither read nor deferred again) but every ``steal_after`` seconds, when one reads every
    task and takes the others' it first listed that long ago; membership unknown: every
    listing reads every task."""
    split = preferred_split(store, ["m1", "m2"], 3)
    mine, theirs = {t.id for t in split["m1"]}, {t.id for t in split["m2"]}
    stats: Counter[str] = Counter()
    backlog = Backlog(store, "m1", DueTimer(lambda: None), stats, lambda task_id: False,
                      settings=LoopSettings(workers=1, steal_after=0.5))
    live = {"m1", "m2"}

    def listed() -> set[str]:
        return {t.id for t, _, _ in backlog.items}
    assert backlog.list_open(live)  # the first: every task, the others' left to m2
    assert stats["full_listings"] == 1 and stats["deferred_others"] == len(theirs)
    assert listed() == mine
    assert backlog.list_open(live)  # its own only: the others' not even read
    assert (stats["full_listings"], stats["deferred_others"]) == (1, len(theirs))
    assert listed() == mine
    time.sleep(0.5)
    assert backlog.list_open(live)  # steal_after on: every task, the others' taken now
    assert stats["full_listings"] == 2 and listed() == mine | theirs
    assert backlog.list_open(None) and stats["full_listings"] == 3


def test_the_others_task_is_taken_while_this_members_own_keep_coming(
        zk_namespace: ZkNamespace, store: Store) -> None:
    """Two live members, m2 never taking anything (stopped with its session alive): m1's own
    tasks keep coming faster than it runs them, so its own listings never run out, yet it takes
    m2's oldest task: a listing of every task comes every ``steal_after`` (an own listing alone
    would leave it there as long as m1's own come). Measured here, it is taken 5-25 s in (its
    own come first in a listing; m2's once they stayed listed ``steal_after``)."""
    ran: list[str] = []
    registry = TaskRegistry()

    def handler(ctx: TaskContext, payload: object) -> None:
        ran.append(ctx.task.id)
        time.sleep(0.2)
    registry.register("t", handler)
    made: list[Task] = []
    with session(zk_namespace) as s:
        for member in ("m1", "m2"):
            s.client.create(f"/members/{member}", b"{}", ephemeral=True, makepath=True)
        processor = TaskLoop(s, "m1", store, registry,
                             LoopSettings(workers=2, scan_interval=600, steal_after=0.3))
        try:
            deadline = time.monotonic() + 45  # taken after 5-25 s here
            # m1 runs 10 tasks/s; the loop makes 10 a round, half m1's: 50/s at 0.1 s a round,
            # still 16/s at 0.3 s (a loaded box: at 5 a round and 40/s run, m1's own ran out)
            while time.monotonic() < deadline:
                made += [store.tasks.create("t") for _ in range(10)]
                processor.scan()
                theirs = [t for t in made if preferred_index(t.id, 2) == 1]
                if theirs and theirs[0].id in ran:
                    break
                time.sleep(0.05)
            waiting_own = [t for t in made if preferred_index(t.id, 2) == 0 and t.id not in ran]
        finally:
            processor.close()
    assert theirs and theirs[0].id in ran, "m2's oldest task was never taken"
    assert len(waiting_own) >= 10, waiting_own  # m1's own had not run out
    assert processor.stats["full_listings"] >= 2


def test_a_listing_after_a_finished_task_reads_up_to_now_and_keeps_what_was_planned(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A listing no write asked for (after a finished task, the interval's) walks past now
    only ``AHEAD_EVERY`` seconds after the last that did; one a write asked for always does.
    One that ended at now keeps the tasks planned before on the due timer (a task due in 40 s
    still starts at its time), and a task ready now is listed either way."""
    from runner.tasks.worker import ready

    timer = DueTimer(lambda: None)
    backlog = Backlog(store, "m1", timer, Counter(), lambda task_id: False,
                      settings=LoopSettings(workers=1))
    soon = store.tasks.create("t", run_at=codec.now() + timedelta(seconds=40))

    def planned() -> list[str]:
        return [task.id for _, task, _ in timer._future]
    try:
        assert backlog.list_open({"m1"}) and backlog.ready.read_ahead
        assert planned() == [soon.id]
        sooner = store.tasks.create("t", run_at=codec.now() + timedelta(seconds=30))
        now = store.tasks.create("t")
        assert backlog.list_open({"m1"}) and not backlog.ready.read_ahead
        assert [t.id for t, _, _ in backlog.items] == [now.id]
        assert planned() == [soon.id]  # kept, sooner not read
        assert backlog.list_open({"m1"}, ahead=True) and backlog.ready.read_ahead
        assert planned() == [sooner.id, soon.id]
        monkeypatch.setattr(ready, "AHEAD_EVERY", 0.2)
        store.tasks.create("t", run_at=codec.now() + timedelta(seconds=20))
        time.sleep(0.25)
        assert backlog.list_open({"m1"}) and backlog.ready.read_ahead
        assert len(planned()) == 3
    finally:
        timer.close()


def test_a_listing_no_write_asked_for_reads_only_the_lanes_that_held_tasks(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lanes that held nothing are probed by a listing a write asked for, or the first
    ``PROBE_EVERY`` seconds after the last probe (which need not read ahead of now): a
    listing after a finished task reads the lanes its last walk found tasks in (a task
    written there is listed at once), and one of those finds a task written in a lane that
    was empty."""
    from runner.tasks.worker import ready

    timer = DueTimer(lambda: None)
    backlog = Backlog(store, "m1", timer, Counter(), lambda task_id: False,
                      settings=LoopSettings(workers=1))
    probes: list[list[str]] = []
    lanes = store.tasks.lanes
    monkeypatch.setattr(store.tasks, "lanes", lambda asked: probes.append(asked) or lanes(asked))

    def listed() -> list[str]:
        return [t.id for t, _, _ in backlog.items]
    try:
        first = store.tasks.create("t")
        assert backlog.list_open({"m1"}) and listed() == [first.id] and len(probes) == 1
        urgent = store.tasks.create("t", priority=5)  # a lane that held nothing
        same = store.tasks.create("t")  # the lane the last walk found a task in
        assert backlog.list_open({"m1"}) and not backlog.ready.read_ahead
        assert len(probes) == 1 and set(listed()) == {first.id, same.id}
        assert backlog.list_open({"m1"}, ahead=True) and len(probes) == 2
        assert listed()[0] == urgent.id  # the higher lane first
        monkeypatch.setattr(ready, "PROBE_EVERY", 0.2)
        lower = store.tasks.create("t", priority=-3)
        assert backlog.list_open({"m1"}) and lower.id not in listed() and len(probes) == 2
        time.sleep(0.25)
        assert backlog.list_open({"m1"}) and not backlog.ready.read_ahead and len(probes) == 3
        assert lower.id in listed()
    finally:
        timer.close()


def test_priority_comes_before_preference(zk_namespace: ZkNamespace, store: Store) -> None:
    split = preferred_split(store, ["m1", "m2"], 1)
    urgent = store.tasks.create("t", priority=5)
    with session(zk_namespace) as s:
        processor = TaskLoop(s, "m1", store, TaskRegistry(), LoopSettings(workers=1))
        order = candidates(store.tasks.unfinished(), {"m1", "m2"}, processor.member_id,
                           processor.settings.workers)
        alone = candidates(store.tasks.unfinished(), {"m1"}, processor.member_id,
                           processor.settings.workers)
        unknown = candidates(store.tasks.unfinished(), None, processor.member_id,
                           processor.settings.workers)
        processor.close()
    assert (order[0][0].id, order[0][1]) == (urgent.id, preferred_index(urgent.id, 2) == 0)
    flags = [own for _, own in order[1:]]
    assert flags == sorted(flags, reverse=True)  # this member's first, then the others'
    assert {t.id for t, own in order[1:] if own} == {t.id for t in split["m1"]}
    assert len(order) == len(alone) == len(unknown) == len(split["m1"]) + len(split["m2"]) + 1
    assert not any(own for _, own in alone + unknown)  # one member or none: nobody preferred


def test_the_watched_membership_view_is_used_and_read_when_it_has_not_reported(
        zk_namespace: ZkNamespace, store: Store) -> None:
    view: dict[str, set[str] | None] = {"live": None}
    with session(zk_namespace) as s:
        s.client.create("/members/m1", b"{}", ephemeral=True, makepath=True)
        processor = TaskLoop(s, "m1", store, TaskRegistry(), live_members=lambda: view["live"])
        try:
            assert processor.scanner._live() == {"m1"}  # no report yet: one read
            view["live"] = {"m1", "m2"}
            assert processor.scanner._live() == {"m1", "m2"}  # no read: m2 has no node
        finally:
            processor.close()


def test_tasks_running_under_another_live_member_are_not_tried(
        zk_namespace: ZkNamespace, store: Store) -> None:
    """A listed RUNNING task of a live member is skipped without a lock try; one whose owner
    left, and one this member owns but does not run (its end was never written), are run."""
    ran: list[str] = []
    registry = TaskRegistry()
    registry.register("t", lambda ctx, payload: ran.append(ctx.task.id))
    live, gone, mine = (store.tasks.create("t") for _ in range(3))
    for task, owner in ((live, "m2"), (gone, "m9"), (mine, "m1")):
        store.tasks.update(task.id, 0, None, status=TaskStatus.RUNNING, owner=owner)
    with session(zk_namespace) as s:
        s.client.create("/members/m2", b"{}", ephemeral=True, makepath=True)
        processor = TaskLoop(s, "m1", store, registry, LoopSettings(workers=4, scan_interval=600))
        try:
            assert processor.scan() == 2
            assert wait_until(lambda: len(ran) == 2, 30)
        finally:
            processor.close()
    assert sorted(ran) == sorted([gone.id, mine.id])
    assert processor.stats["lock_busy"] == 0
    assert store.tasks.get(live.id).status is TaskStatus.RUNNING


def test_a_commit_conflict_is_retried_as_a_new_claim_unless_the_task_was_stopped_meanwhile(
        zk_namespace: ZkNamespace, store: Store) -> None:
    """A retry after a commit conflict claims the task as its owner last wrote it: attempts
    numbered 1, 2, 3 and the task counts them. If an operator stops the task during the
    backoff, there is no new attempt: the task stays stopped and its lock is released."""
    from runner.tasks import TaskConflict

    failing_left = {"retried": 2}
    waiting = threading.Event()
    release = threading.Event()

    def retried(ctx: TaskContext, payload: object) -> None:
        if failing_left["retried"]:
            failing_left["retried"] -= 1
            raise TaskConflict(f"conflict before attempt {ctx.attempt.seq + 1}")

    def stopped(ctx: TaskContext, payload: object) -> None:
        waiting.set()
        release.wait(30)
        raise TaskConflict("conflict while the operator stops the task")

    registry = TaskRegistry()
    registry.register("retried", retried)
    registry.register("stopped", stopped)
    first = store.tasks.create("retried")
    second = store.tasks.create("stopped")
    with session(zk_namespace) as s:
        processor = TaskLoop(s, "m1", store, registry,
                             LoopSettings(scan_interval=60, conflict_backoff=(0.5, 0.5))).start()
        try:
            assert waiting.wait(30)
            store.tasks.deactivate(second.id)  # while its attempt runs
            release.set()
            assert wait_until(lambda: store.tasks.get(first.id).finished, 30)
            assert wait_until(lambda: store.attempts.running() == []
                              and s.client.get_children("/locks/tasks") == [], 30)
        finally:
            processor.close()
    attempts = store.attempts.for_task(first.id)
    assert [(a.seq, a.status) for a in attempts] == [
        (1, AttemptStatus.FAILED), (2, AttemptStatus.FAILED), (3, AttemptStatus.SUCCEEDED)]
    assert store.tasks.get(first.id).attempts == 3
    stopped_task = store.tasks.get(second.id)
    assert not stopped_task.active and stopped_task.status is TaskStatus.WAITING
    assert [a.status for a in store.attempts.for_task(second.id)] == [AttemptStatus.FAILED]


def test_progress_is_throttled_and_the_last_value_wins(
        zk_namespace: ZkNamespace, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A handler may report on every row: writes stay about one a second (on the node's
    progress writer, never in the handler's time), the value kept back by the throttle is
    written with the attempt's end (no write of its own), and a report after someone else
    closed the attempt cancels the handler once its write is refused."""
    writes: list[tuple[int, int | None]] = []
    real = store.attempts.progress

    def counting(attempt_id: str, done: int, total: int | None, message: str) -> bool:
        writes.append((done, total))
        return real(attempt_id, done, total, message)

    monkeypatch.setattr(store.attempts, "progress", counting)
    seen: dict[str, str] = {}

    def rows(ctx: TaskContext, payload: dict[str, int]) -> None:
        for done in range(payload["rows"]):
            ctx.progress(done, None, f"row {done}")
        if payload.get("wait_for_close"):
            assert wait_until(lambda: store.attempts.get(ctx.attempt.id).ended_at is not None,
                              10)
            ctx.progress(2, 2)  # its attempt was closed meanwhile (a final report: not held)
            assert ctx.cancel.wait(10)  # the writer's refused write cancels it
            seen["cancelled"] = ctx.cancel.reason

    registry = TaskRegistry()
    registry.register("rows", rows)
    quick = store.tasks.create("rows", {"rows": 5000})
    with session(zk_namespace) as s:
        processor = TaskLoop(s, "m1", store, registry,
                             LoopSettings(workers=1, scan_interval=60)).start()
        try:
            assert wait_until(lambda: store.tasks.get(quick.id).finished, 30)
            (attempt,) = store.attempts.for_task(quick.id)
            assert attempt.progress is not None
            assert (attempt.progress.done, attempt.progress.message) == (4999, "row 4999")
            # the first report, maybe a few more; the last one went with the end
            assert 1 <= len(writes) <= 10 and (4999, None) not in writes
            closed = store.tasks.create("rows", {"rows": 1, "wait_for_close": 1})
            processor.trigger()
            assert wait_until(lambda: len(store.attempts.for_task(closed.id)) == 1, 10)
            store.close_attempts(closed.id, AttemptStatus.CANCELLED_BY_SYSTEM, "master: test",
                                 executor="m1")
            assert wait_until(lambda: "cancelled" in seen, 10)
        finally:
            processor.close()
    assert seen["cancelled"] == "its attempt was closed by someone else"


def test_a_holder_cut_off_after_its_last_check_cannot_record_a_success_over_the_next_holder(
        zk_namespace: ZkNamespace, store: Store) -> None:
    """The chaos suite's ``resource_holders_overlapping`` on CI (2026-11-23), after the task lock
    was confirmed before every success: a holder can still lose its session *between* that
    confirmation and its write, and another task can claim the resource meanwhile. Here the
    holder's after-attempt hook (which runs between the two) has the server expire its session
    and waits until another node has claimed a task that needs the same resource. Before, the
    holder then wrote SUCCEEDED over the other's start. Now each claim records its attempt as
    the resource's holder in the store, in the claim's own write: the late success is refused
    (ResourceTaken), the attempt ends CANCELLED_BY_SYSTEM, and the task runs again later.
    The cut comes right before the end is handed to the group commit (the observers hear the
    end only once it is written), and they hear the status written."""
    told: list[AttemptStatus] = []

    def cut_off(attempt: Attempt, status: AttemptStatus) -> None:
        if attempt.seq == 1 and pair.task_b is None:  # once (the refusal ends it again)
            assert status is AttemptStatus.SUCCEEDED  # the handler ended, its lock confirmed
            pair.cut()

    def hear(ctx: TaskContext, status: AttemptStatus, error: str | None) -> None:
        if ctx.attempt.seq == 1:
            told.append(status)

    with HolderAndNext(zk_namespace, store, lambda ctx, p: None, after=[hear],
                       before_end=cut_off) as pair:
        task_a = store.tasks.create("a", resources=["ontology:brick"])
        first = pair.first_attempt(task_a)
        assert first.status is AttemptStatus.CANCELLED_BY_SYSTEM, first
        assert "resource 'ontology:brick' was claimed by another attempt" in (first.error or "")
        assert not store.tasks.get(task_a.id).finished
        assert told == [AttemptStatus.CANCELLED_BY_SYSTEM]  # as written, not as the handler
        pair.finish()  # B ends; A, back in the queue, runs again once the resource is free
    held = sorted((a for t in (task_a, pair.task_b) for a in store.attempts.for_task(t.id)
                   if a.status is AttemptStatus.SUCCEEDED), key=lambda a: a.started_at)
    assert len(held) == 2
    assert held[0].ended_at is not None and held[0].ended_at <= held[1].started_at


class HolderAndNext:
    """Two task loops on sessions of their own: ``m1`` runs type ``a`` (the resource holder a
    test cuts off), ``m2`` type ``b`` (the next holder, held running until :meth:`finish`).
    :meth:`cut` has the server expire ``m1``'s session (its lock and holds go with it), submits
    a ``b`` task that needs the same resource and waits until ``m2`` runs it."""

    def __init__(self, ns: ZkNamespace, store: Store,
                 handler: Callable[[TaskContext, object], None],
                 after: list[Callable[[TaskContext, AttemptStatus, str | None], None]]
                 | None = None,
                 before_end: Callable[[Attempt, AttemptStatus], None] | None = None) -> None:
        self.store = store
        self.release_b = threading.Event()
        self.task_b: Task | None = None
        registry_a, registry_b = TaskRegistry(), TaskRegistry()
        registry_a.register("a", handler)
        registry_b.register("b", lambda ctx, p: self.release_b.wait(30))
        self.sessions = [session(ns).start(), session(ns).start()]
        self.loops = [
            TaskLoop(self.sessions[0], "m1", store, registry_a,
                     LoopSettings(workers=1, scan_interval=0.2),
                     observers=[Hooks(after=hook) for hook in after or []]).start(),
            TaskLoop(self.sessions[1], "m2", store, registry_b,
                     LoopSettings(workers=1, scan_interval=0.2)).start()]
        if before_end is not None:  # between the handler's end and the write of that end
            commits = self.loops[0].commits
            for name in ("submit", "conclude"):
                setattr(commits, name, self._before(before_end, getattr(commits, name)))

    @staticmethod
    def _before(before_end: Callable[[Attempt, AttemptStatus], None],
                hand: Callable[[Ending], Any]) -> Callable[[Ending], Any]:
        """``hand`` (the group commit's way in), with ``before_end`` called first."""
        def handed(ending: Ending) -> Any:
            if isinstance(ending.write, Conclusion):
                before_end(ending.claim.attempt, ending.write.status)
            return hand(ending)
        return handed

    def cut(self) -> None:
        from coord.testing import expire_session

        expire_session(self.sessions[0].client)
        self.task_b = self.store.tasks.create("b", resources=["ontology:brick", "aspect:geo"])
        b = self.task_b.id
        assert wait_until(lambda: [a.status for a in self.store.attempts.for_task(b)]
                          == [AttemptStatus.RUNNING], 30)

    def first_attempt(self, task: Task) -> Attempt:
        """``task``'s first attempt once it has ended."""
        def ended() -> bool:
            attempts = self.store.attempts.for_task(task.id)
            return bool(attempts) and attempts[0].ended_at is not None
        assert wait_until(ended, 60)
        return self.store.attempts.for_task(task.id)[0]

    def finish(self) -> None:
        """Let B end, and wait until every task has finished."""
        self.release_b.set()
        assert wait_until(lambda: not self.store.tasks.unfinished(), 60)

    def __enter__(self) -> HolderAndNext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release_b.set()
        for loop in self.loops:
            loop.close()
        for s in self.sessions:
            s.close()


def test_an_ordering_key_is_one_exclusive_hold_that_a_chain_keeps() -> None:
    """A key was booked twice over, as a counted level (a persistent znode per key, left
    forever) and as an exclusive hold; being a level, it was never "all a task books", so the
    worker that finished a keyed task let the key go and booked it again for the next one
    (ordered / unordered throughput 0.77-0.80). A key is now an exclusive hold only."""
    from runner.tasks.registry import TaskType
    from runner.tasks.worker.claim import holds, key_only, levels

    kind = TaskType("t", lambda ctx, p: None)
    keyed = Task(id="x", type="t", payload={}, active=True, status=TaskStatus.WAITING,
                 finished=False, priority=0, created_at=codec.now(), updated_at=codec.now(),
                 version=1, fence=0, ordering_key="orders/42")
    assert levels(keyed, kind, {}) == []
    assert holds(keyed) == ["key/orders%2F42"]
    assert key_only(keyed, kind, {})
    assert not key_only(dataclasses.replace(keyed, resources=("db",)), kind, {})
    assert [lv.name for lv in levels(keyed, kind, {"t": 2})] == ["group/t"]
    assert not key_only(keyed, kind, {"t": 2})


def test_a_holder_cut_off_mid_handler_cannot_write_a_fenced_effect_once_its_resource_is_taken(
        zk_namespace: ZkNamespace, store: Store) -> None:
    """The same fence inside a handler: a holder whose session expired mid-handler, its
    resource then claimed by another node's task, makes a fenced write
    (``store.fenced_write(ctx.fence, ...)``) before it has learned anything. The task's own
    fence is still its token (nobody closed its attempt), so only the resource's holder refuses
    the write: ResourceTaken, nothing written, and the attempt ends CANCELLED_BY_SYSTEM (not
    FAILED: the task is not stopped) and runs again. Exactly one effect is left, the one of the
    attempt that SUCCEEDED."""
    def effect(ctx: TaskContext, payload: object) -> None:
        if ctx.attempt.seq == 1:
            pair.cut()
        store.fenced_write(ctx.fence, lambda g: g.add_v("effect")
                           .property("effect_attempt", ctx.attempt.id).iterate())

    with HolderAndNext(zk_namespace, store, effect) as pair:
        task_a = store.tasks.create("a", resources=["ontology:brick"])
        first = pair.first_attempt(task_a)
        assert first.status is AttemptStatus.CANCELLED_BY_SYSTEM, first
        assert store.tasks.get(task_a.id).active
        pair.finish()
    attempts = store.attempts.for_task(task_a.id)
    (succeeded,) = [a for a in attempts if a.status is AttemptStatus.SUCCEEDED]
    effects = store.graph.read(lambda g: g.V().has_label("effect").values("effect_attempt")
                               .to_list())
    assert effects == [succeeded.id]


@dataclasses.dataclass
class Held:
    """A handler that records its task and runs until released (or cancelled)."""
    ran: list[str] = dataclasses.field(default_factory=list)
    started: threading.Event = dataclasses.field(default_factory=threading.Event)
    release: threading.Event = dataclasses.field(default_factory=threading.Event)

    def handler(self, ctx: TaskContext, payload: object) -> None:
        self.ran.append(ctx.task.id)
        self.started.set()
        while not self.release.is_set():
            ctx.cancel.raise_if_cancelled()
            time.sleep(0.01)


@contextlib.contextmanager
def one_worker_loop(ns: ZkNamespace, store: Store,
                    held: Held) -> Iterator[tuple[Session, TaskLoop]]:
    """A task loop of one worker for type ``t`` (``held``), no interval scan but the first,
    which has ended (nothing was open) when this yields; released and closed after."""
    registry = TaskRegistry()
    registry.register("t", held.handler)
    with session(ns) as s:
        processor = TaskLoop(s, "m1", store, registry,
                             LoopSettings(workers=1, scan_interval=3600)).start()
        try:
            assert wait_until(lambda: processor.stats["listings"] >= 1, 10)
            yield s, processor
        finally:
            held.release.set()
            processor.close()


def test_accept_starts_queues_or_says_elsewhere(
        zk_namespace: ZkNamespace, store: Store) -> None:
    """``TaskLoop.accept``, the loop's one way in: a plain task due now with a worker free
    starts at once (no scan, no listing: STARTED); with no worker free it is written WAITING
    and the others must be told (ELSEWHERE); one due later likewise; one that needs a look
    first (a uniqueness key) with a worker free is written WAITING and this node's scan takes
    it (QUEUED)."""
    held = Held()
    with one_worker_loop(zk_namespace, store, held) as (_, processor):
        listings = processor.stats["listings"]
        first = processor.accept(store.tasks.new("t", {}))
        assert first.admission is Admission.STARTED
        assert held.started.wait(10)
        assert held.ran == [first.task.id]
        assert processor.stats["listings"] == listings  # no scan, no listing
        second = processor.accept(store.tasks.new("t", {}))  # the one worker is busy
        assert second.admission is Admission.ELSEWHERE
        assert store.tasks.get(second.task.id).status is TaskStatus.WAITING
        later = processor.accept(store.tasks.new("t", {}, run_at=codec.now()
                                                  + timedelta(hours=1)))
        assert later.admission is Admission.ELSEWHERE
        held.release.set()
        # the finished worker's follow-up scan lists and takes the second
        assert wait_until(lambda: second.task.id in held.ran, 10)
        assert wait_until(lambda: processor.running.working() == 0, 10)
        keyed = processor.accept(store.tasks.new("t", {}, unique_key="u1"))
        assert keyed.admission is Admission.QUEUED
        assert wait_until(lambda: keyed.task.id in held.ran, 10)


def test_a_task_queued_while_the_interval_scan_runs_is_taken_right_after_that_scan(
        zk_namespace: ZkNamespace, store: Store) -> None:
    """A task written WAITING while a scan is under way (its listing read before the write)
    asks for a scan; the one under way cannot take it, and the next comes right after it, not
    at the next interval (this loop has none for an hour). Before, the ask re-timed the
    interval's scan job, which its scheduler skips while that job runs: a paced submit waited
    for the next interval now and then (p99 of 0.8-0.9 s in bench_runner)."""
    held = Held()
    with one_worker_loop(zk_namespace, store, held) as (_, processor):
        listed = processor.scanner.backlog.list_open
        slow = threading.Event()
        listings = []

        def slow_listing(*args: Any, **kwargs: Any) -> bool:
            out = listed(*args, **kwargs)
            listings.append(threading.current_thread().name)
            if slow.is_set():  # listed: the task written now is not in it
                slow.clear()
                time.sleep(1.0)
            return out
        processor.scanner.backlog.list_open = slow_listing  # type: ignore[method-assign]
        slow.set()
        processor._scheduler.modify_job("scan", next_run_time=codec.now())
        assert wait_until(lambda: listings, 10)
        queued = processor.accept(store.tasks.new("t", {}, unique_key="u-queued"))
        assert queued.admission is Admission.QUEUED
        assert held.started.wait(10), "the task waited for the next interval's scan"
        assert held.ran == [queued.task.id]


def test_a_freed_worker_lists_once_its_share_allows_when_it_may_not_at_once(
        zk_namespace: ZkNamespace, store: Store) -> None:
    """A worker frees up with the backlog empty while listing again would pass listing's share
    of the time (the last listing was slow, as on a loaded machine): the follow-up does not
    list, and a pass comes when the share allows, so the task that waits is taken with no
    interval scan (this loop has none for an hour). The task was written by another node,
    which said so (TRIGGER_SCAN: :meth:`ReadyScan.ask`, the part of it that outlives a pass
    with no worker free), so that listing reads its lane, which held nothing here."""
    held = Held()
    with one_worker_loop(zk_namespace, store, held) as (_, processor):
        first = processor.accept(store.tasks.new("t", {}))
        assert first.admission is Admission.STARTED
        assert held.started.wait(10)
        second = store.tasks.create("t")
        processor.backlog.ready.ask()
        listings = processor.stats["listings"]
        processor.backlog.listed = (time.monotonic(), 0.5)  # no listing for a second
        assert not processor.backlog.may_relist()
        held.release.set()
        assert wait_until(lambda: second.id in held.ran, 10)
        assert processor.stats["listings"] == listings + 1


def test_a_new_task_is_written_claimed_by_its_submitter_in_one_store_write(
        zk_namespace: ZkNamespace, store: Store) -> None:
    """``TaskLoop.accept`` of a plain task with a worker free: written RUNNING with its
    attempt in one store write while its lock is taken (one ZooKeeper transaction, no watch):
    its token is below the lock's czxid (the session's last zxid before the lock was sent), and
    the next owner's token is above both; a cancel reaches the handler through
    ``cancel_running`` (what the node's mailbox calls) and the handler's end is then refused;
    a failed write leaves neither the task nor the lock."""
    from coord import force_release
    from runner.errors import StoreUnavailable

    held = Held()
    with one_worker_loop(zk_namespace, store, held) as (s, processor):
        listings = processor.stats["listings"]
        new = store.tasks.new("t", {"n": 1})
        writes = store.graph.stats.snapshot()["writes"]
        admitted = processor.accept(new)
        assert admitted.admission is Admission.STARTED and admitted.task.id == new.id
        assert store.graph.stats.snapshot()["writes"] == writes + 1
        stored = store.tasks.get(new.id)
        assert (stored.status, stored.owner, stored.version, stored.attempts) == (
            TaskStatus.RUNNING, "m1", 1, 1)
        (node,) = s.client.get_children(f"/locks/tasks/{new.id}")
        assert node.endswith("-lock-0000000000")
        czxid = s.client.exists(f"/locks/tasks/{new.id}/{node}").czxid
        assert 0 < stored.fence < czxid
        (attempt,) = store.attempts.for_task(new.id)
        assert (attempt.status, attempt.executor, attempt.seq, attempt.fence) == (
            AttemptStatus.RUNNING, "m1", 1, stored.fence)
        assert held.started.wait(10) and held.ran == [new.id]
        assert processor.stats["listings"] == listings  # no scan, no listing

        # an operator's cancel: the attempt closed and the fence moved in one write, the lock
        # freed, the handler told (the mailbox's call); its end is refused, nothing more
        store.cancel(new.id, "ops")
        assert force_release(s, new.id) == "m1"
        assert processor.cancel_running(new.id, "cancelled by operator ops")
        assert wait_until(lambda: processor.running.working() == 0, 10)
        assert wait_until(lambda: new.id not in processor.running, 10)
        (closed,) = store.attempts.for_task(new.id)
        assert closed.status is AttemptStatus.CANCELLED and "ops" in (closed.error or "")
        assert not store.tasks.get(new.id).active
        later = TaskLock(s, new.id, "m2")  # the next owner's token is above both
        assert (later.try_acquire() or 0) > czxid
        later.release()

        # the write fails: the submit fails with nothing written and no lock left
        def unavailable(*args: object) -> tuple[Task, Attempt]:
            raise StoreUnavailable("the graph is down")

        failing = store.tasks.new("t", {"n": 2})
        original = store.create_claimed
        store.create_claimed = unavailable  # type: ignore[method-assign]
        try:
            with pytest.raises(StoreUnavailable):
                processor.accept(failing)
        finally:
            store.create_claimed = original  # type: ignore[method-assign]
        assert not s.client.exists(f"/locks/tasks/{failing.id}")
        assert failing.id not in processor.running and processor.running.working() == 0
        assert failing.id not in {t.id for t in store.tasks.all()}


@pytest.mark.parametrize("again", [False, True], ids=["new", "redelivered"])
def test_a_new_task_whose_lock_cannot_be_had_as_it_is_written_ends_cancelled_by_system(
        zk_namespace: ZkNamespace, store: Store, again: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A new task is written claimed while its lock is taken; when the lock cannot be had
    after all (here another session holds the new id's lock: in life, a session lost at that
    moment), the task stands RUNNING in the store: its attempt is cancelled before the handler
    runs and ends CANCELLED_BY_SYSTEM, fenced like any end, the task back to waiting, and it
    runs once the lock is free, with a token above the first. A redelivered submit's task
    waits for its lock a while first (``RETAKE_WAIT``, shortened here) and ends the same way
    when the other holder keeps it."""
    from runner.tasks.worker import claim

    monkeypatch.setattr(claim, "RETAKE_WAIT", 0.3)
    held = Held()
    with one_worker_loop(zk_namespace, store, held) as (s, processor), \
            session(zk_namespace) as theirs:
        new = store.tasks.new("t", {"n": 1})
        other = TaskLock(theirs, new.id, "m2")
        assert other.try_acquire() is not None
        admitted = processor.accept(new, again=again)
        assert admitted.admission is Admission.STARTED
        assert wait_until(lambda: new.id not in processor.running, 10)
        (first,) = store.attempts.for_task(new.id)
        assert first.status is AttemptStatus.CANCELLED_BY_SYSTEM
        assert "lock could not be taken" in (first.error or "")
        task = store.tasks.get(new.id)
        assert task.active and task.status is TaskStatus.WAITING and held.ran == []
        assert lock_owner(s, new.id) == "m2"  # theirs untouched
        assert processor.stats["lock_lost_at_start"] == 1
        other.release()
        processor.trigger()
        assert held.started.wait(10) and held.ran == [new.id]
        second = store.attempts.for_task(new.id)[-1]
        assert second.seq == 2 and second.fence > first.fence


def test_a_redelivered_submits_task_waits_for_its_lock_held_by_the_other_copy_and_runs_once(
        zk_namespace: ZkNamespace, store: Store) -> None:
    """Two copies of one submit handled at once on two nodes: the copy that writes the task
    may find its lock taken by the other copy's try, which lets it go once it finds the task
    written (here another session holds the lock and lets go 0.3 s later). The writer waits
    for the lock rather than cancel its attempt: the task runs with one attempt, its claim's
    token kept (the CI run of stop 22 saw a cancelled attempt and a second one)."""
    import threading

    held = Held()
    with one_worker_loop(zk_namespace, store, held) as (_, processor), \
            session(zk_namespace) as theirs:
        new = store.tasks.new("t", {"n": 1})
        other = TaskLock(theirs, new.id, "m2")
        assert other.try_acquire() is not None
        letting_go = threading.Timer(0.3, other.release)
        letting_go.start()
        try:
            admitted = processor.accept(new, again=True)
        finally:
            letting_go.join()
        assert admitted.admission is Admission.STARTED
        assert held.started.wait(10) and held.ran == [new.id]
        held.release.set()
        assert wait_until(lambda: new.id not in processor.running, 10)
        (only,) = store.attempts.for_task(new.id)
        assert only.status is AttemptStatus.SUCCEEDED and only.seq == 1
        assert processor.stats["lock_lost_at_start"] == 0
        assert store.tasks.get(new.id).finished


def test_a_batch_claim_that_partly_loses_keeps_what_it_won(
        zk_namespace: ZkNamespace, store: Store) -> None:
    """``Claimer.claim_many``: of four listed tasks, one is locked by another node and one
    changed since it was listed; the other two are claimed in one store write, each with its
    RUNNING attempt and its lock's token, and nothing of the two lost is left held here."""
    from coord import TaskLock
    from runner.tasks.worker.claim import Claimer
    from runner.tasks.worker.running import RunningSet

    tasks = [store.tasks.create("t", {"n": n}) for n in range(4)]
    store.tasks.update(tasks[3].id, tasks[3].version, None, priority=5)  # changed since listed
    with session(zk_namespace) as mine, session(zk_namespace) as theirs:
        other = TaskLock(theirs, tasks[1].id, "m2")
        assert other.try_acquire() is not None
        running = RunningSet(4)
        claimer = Claimer(mine, store, "m1", running)
        writes = store.graph.stats.snapshot()["writes"]
        started = claimer.claim_many(tasks)
        assert store.graph.stats.snapshot()["writes"] == writes + 1  # one write for both
        assert sorted(r.task.id for r in started) == sorted([tasks[0].id, tasks[2].id])
        assert claimer.stats["lock_busy"] == 1 and claimer.stats["stale"] == 1
        assert sorted(r.task.id for r in running.snapshot()) == sorted(r.task.id
                                                                        for r in started)
        tokens = set()
        for r in started:
            assert r.claim is not None and r.claim.token == r.lock.token
            tokens.add(r.claim.token)
            assert store.tasks.get(r.task.id).status is TaskStatus.RUNNING
            assert store.tasks.get(r.task.id).fence == r.claim.token
            assert store.attempts.for_task(r.task.id)[0].status is AttemptStatus.RUNNING
        assert len(tokens) == 1  # their locks were made in one transaction
        assert not mine.client.exists(f"/locks/tasks/{tasks[3].id}")  # released
        assert [a for a in store.attempts.for_task(tasks[3].id)] == []
        assert store.attempts.for_task(tasks[1].id) == []
        for r in started:
            r.lock.release()
        other.release()


def test_a_node_claims_ahead_only_while_its_handlers_are_short() -> None:
    """``RunningSet.free()``: the free workers, and ``prefetch`` times the workers more once
    the handlers of some type have a moving mean (over at least twice the workers' worth of
    that type) under ``short``; none ahead while any handler has run longer, nor with
    ``prefetch`` 0. Pure logic."""
    from runner.tasks.worker.running import RunningSet

    slots: dict[int, Any] = {}

    def slot(n: int, kind: str = "a") -> Any:
        return slots.setdefault(n, SimpleNamespace(task_id=f"t{n}",
                                                   task=SimpleNamespace(type=kind)))

    running = RunningSet(2, prefetch=3.0, short=0.05)
    assert running.free() == 2  # nothing heard yet: no claim ahead
    for n in range(3):
        running.add(slot(n))
        running.begin(slot(n))
        running.returned(slot(n))
        running.discard(slot(n))
    assert running.free() == 2  # 3 short handlers: fewer than twice the workers
    running.add(slot(3))
    running.begin(slot(3))
    running.returned(slot(3))
    running.discard(slot(3))
    assert running.free() == 2 + 6  # 4 short ones: 3 x 2 workers ahead
    running.add(slot(4))
    running.begin(slot(4))
    assert running.free() == 2 + 6 - 1 and running.working() == 1
    time.sleep(0.06)
    assert running.free() == 2 - 1  # a handler past `short`: nothing ahead while it runs
    running.returned(slot(4))  # 60 ms joins the mean: 0.2 x 60 ms keeps it under 50 ms
    running.discard(slot(4))
    assert running.free() == 2 + 6
    for n in range(5, 9):  # long handlers move the mean past `short`
        running.add(slot(n))
        running.begin(slot(n))
    time.sleep(0.12)
    for n in range(5, 9):
        running.returned(slot(n))
        running.discard(slot(n))
    assert running.free() == 2
    never = RunningSet(2, prefetch=0.0)
    for n in range(10):
        never.add(slot(n))
        never.begin(slot(n))
        never.returned(slot(n))
        never.discard(slot(n))
    assert never.free() == 2


def test_nodes_that_drained_short_tasks_claim_long_ones_one_worker_at_a_time(
        zk_namespace: ZkNamespace, store: Store) -> None:
    """Two nodes of one worker each, claiming ahead (``prefetch`` 3), drain short tasks; then
    long tasks of another type come. Neither node claims a long task before its worker is free:
    each node's attempts of the long type never overlap (a claim ahead would start an attempt,
    at its claim, while the node's one worker still runs the last one). Which node runs which
    is the listing's (preferred members, ``steal_after``): not checked."""
    registry = TaskRegistry()
    registry.register("quick", lambda ctx, p: ctx.cancel.wait(0.01))
    registry.register("long", lambda ctx, p: ctx.cancel.wait(0.3))
    sessions = [session(zk_namespace).start() for _ in range(2)]
    loops = []
    try:
        for i, s in enumerate(sessions):
            loops.append(TaskLoop(s, f"m{i}", store, registry,
                                  LoopSettings(workers=1, scan_interval=0.2, prefetch=3.0,
                                               short_handler=0.05)).start())
        for _ in range(10):  # until each node has run enough to know quick is short
            for _ in range(20):
                store.tasks.create("quick")
            assert wait_until(lambda: not store.tasks.unfinished(), 60)
            if all(loop.running.ahead() > 0 for loop in loops):
                break
        assert all(loop.running.ahead() > 0 for loop in loops)  # both may claim ahead
        slow = [store.tasks.create("long").id for _ in range(6)]
        assert wait_until(lambda: not store.tasks.unfinished(), 60)
    finally:
        for loop in loops:
            loop.close()
        for s in sessions:
            s.close()
    by_node: dict[str, list[Attempt]] = {}
    for task_id in slow:
        (attempt,) = store.attempts.for_task(task_id)
        assert attempt.status is AttemptStatus.SUCCEEDED
        by_node.setdefault(attempt.executor, []).append(attempt)
    assert sum(len(a) for a in by_node.values()) == len(slow)
    for attempts in by_node.values():
        attempts.sort(key=lambda a: a.started_at)
        for before, after in itertools.pairwise(attempts):
            assert before.ended_at is not None
            assert after.started_at >= before.ended_at - timedelta(milliseconds=20), (
                "claimed ahead while its worker ran", before, after)


def test_a_node_claims_ahead_only_tasks_of_a_type_whose_handlers_are_short_here() -> None:
    """``RunningSet.room(tasks)``: after many short handlers of type ``a``, a node with its
    workers busy may claim more ``a`` tasks ahead, but a task of a type it has not run (or
    whose handlers are long) only for a free worker; a batch is cut at the first task it may
    not claim, so the order of the listing is kept. Pure logic."""
    from runner.tasks.worker.running import RunningSet

    def task(kind: str) -> Any:
        return SimpleNamespace(type=kind)

    def ran(running: RunningSet, n: int, kind: str, seconds: float = 0.0) -> None:
        s = SimpleNamespace(task_id=f"{kind}{n}", task=task(kind))
        running.add(s)
        running.begin(s)
        if seconds:
            time.sleep(seconds)
        running.returned(s)
        running.discard(s)

    running = RunningSet(1, prefetch=3.0, short=0.05)
    assert running.room([task("a"), task("a")]) == 1  # one free worker, nothing known yet
    for n in range(2):
        ran(running, n, "a")
    a, b = task("a"), task("b")
    assert running.room([a, a, a, a, a]) == 1 + 3  # a free worker and 3 ahead
    assert running.room([b, b]) == 1  # b: never seen here: its free worker only
    assert running.room([a, b, a]) == 1  # b is second: cut there, after the free worker
    busy = SimpleNamespace(task_id="held", task=a)
    running.add(busy)  # the worker is taken (claimed, not started)
    assert running.room([b]) == 0  # b waits for a worker: another node may run it now
    assert running.room([a, a, a, a]) == 3  # a is short here: claimed ahead
    assert running.room([a, b]) == 1
    running.discard(busy)
    for n in range(2):
        ran(running, n, "b")  # b's handlers are short too now
    running.add(busy)
    assert running.room([b, a]) == 2
    running.discard(busy)
    for n in range(3):  # then long: 3 of 120 ms move its mean past 50 ms
        ran(running, n, "b", 0.12)
    running.add(busy)
    assert running.room([b]) == 0 and running.room([a]) == 1
