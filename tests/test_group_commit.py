"""Group commit of attempt ends (runner/tasks/worker/commit.py) on the embedded graph file and
on a Gremlin Server: ends that arrive together are written together (one write, one traversal),
their locks released together after the write, a refusal is its own end's alone, a graph out of
reach is tried again and, past ``store_retry_for``, given up with nothing reported written."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coord import Session, TaskLock, lock_owner
from coord.testing import wait_until
from coord.testing.plugin import ZkNamespace
from runner.errors import StoreUnavailable
from runner.store import AttemptStatus, Store, Task, TaskStatus, open_store
from runner.store.server.graph import SERIAL
from runner.tasks.context import CancelToken
from runner.tasks.outcomes import AttemptResult, Outcome
from runner.tasks.worker.commit import GroupCommit
from runner.tasks.worker.ends import Succeeded, Written
from runner.tasks.worker.running import Claimed, Ending, Slot
from runner.testing.gremlinserver import GremlinServer

FINISHED = {"status": TaskStatus.WAITING, "finished": True}


@pytest.fixture(params=["gremlite", "server"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "gremlite":
        with open_store(str(tmp_path / "graph.db")) as s:
            yield s
    else:
        server: GremlinServer = request.getfixturevalue("gremlin_server")
        with open_store(server.url, atomicity=SERIAL) as s:
            s.clear()
            yield s


@pytest.fixture
def zk(zk_namespace: ZkNamespace) -> Iterator[Session]:
    with Session(zk_namespace.hosts, "g1", timeout=4.0) as s:
        yield s


class Told:
    """What the group commit tells (its reporter), by task id."""

    def __init__(self) -> None:
        self.ends: dict[str, tuple[Outcome, Task | None, tuple[AttemptStatus, str | None]]] = {}
        self.observed: list[str] = []

    def written(self, ending: Ending, written: Written) -> None:
        self.observed.append(ending.claim.task.id)

    def ended(self, ending: Ending, written: Written) -> None:
        self.ends[ending.claim.task.id] = (written.outcome, written.task,
                                           (written.status, written.error))


def claimed(store: Store, session: Session, n: int,
            result: str | None = None) -> list[Ending]:
    """``n`` tasks claimed by ``m1`` with their locks held, each ended SUCCEEDED (not
    written), with ``result`` as its handler's result."""
    out = []
    for i in range(n):
        task = store.tasks.create("t", {"n": i})
        lock = TaskLock(session, task.id, "m1")
        token = lock.try_acquire()
        assert token is not None
        task, attempt = store.claim(task, token, "m1")
        slot = Slot(task, lock, None, CancelToken())
        claim = slot.claim = Claimed(task, attempt, token)
        out.append(Ending.of(slot, claim, Succeeded(AttemptResult.succeeded(result))))
    return out


class HeldFirstWrite:
    """The graph's first write of conclusions (``conclude_released``) held until :meth:`go`:
    the ends handed in meanwhile queue for the next group."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.gate = threading.Event()
        self.calls = 0
        self._original = store.conclude_released  # type: ignore[attr-defined]
        store.conclude_released = self._held  # type: ignore[attr-defined]

    def _held(self, conclusions: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            self.gate.wait(10)
        return self._original(conclusions)

    def go(self) -> None:
        self.gate.set()


def test_ends_that_arrive_during_a_write_go_in_the_next_group(store: Store,
                                                             zk: Session) -> None:
    told = Told()
    commits = GroupCommit(store, "m1", told)
    ends = claimed(store, zk, 12)
    held = HeldFirstWrite(store)
    commits.submit(ends[0])
    assert wait_until(lambda: held.calls == 1, 10)
    for ending in ends[1:]:
        commits.submit(ending)
    assert commits.pending() == 11
    held.go()
    assert wait_until(lambda: len(told.ends) == 12, 20)
    commits.close()
    assert commits.stats == {"groups": 2, "concluded": 12, "largest": 11}
    for ending in ends:
        outcome, task, ended = told.ends[ending.claim.task.id]
        assert (outcome, ended) == (Outcome.FINISHED, (AttemptStatus.SUCCEEDED, None))
        assert task is not None and task.finished
        assert store.attempts.get(ending.claim.attempt.id).status is AttemptStatus.SUCCEEDED
        assert lock_owner(zk, ending.claim.task.id) is None  # released after the write
        assert not ending.slot.lock.is_held


def test_a_group_of_ends_with_results_is_capped_by_bytes_under_the_servers_request_limit(
        store: Store, zk: Session) -> None:
    """20 ends whose handlers returned 60 KiB each queue behind a held write: one group of all
    19 would be 1.2 MiB, over the dev Gremlin Server's 1 MiB request limit (and the compose
    file's). The group commit caps a group by bytes as well as by count (MAX_BYTES, 512 KiB):
    groups of 8, 8 and 3, each written, every result stored with its attempt."""
    told = Told()
    commits = GroupCommit(store, "m1", told)
    value = '{"rows":"' + "r" * (60 * 1024) + '"}'
    ends = claimed(store, zk, 20, value)
    held = HeldFirstWrite(store)
    commits.submit(ends[0])
    assert wait_until(lambda: held.calls == 1, 10)
    for ending in ends[1:]:
        commits.submit(ending)
    held.go()
    assert wait_until(lambda: len(told.ends) == 20, 30)
    commits.close()
    assert commits.stats == {"groups": 4, "concluded": 20, "largest": 8}
    assert {o for o, _, _ in told.ends.values()} == {Outcome.FINISHED}
    stored = store.attempts.results([e.claim.task.id for e in ends])
    assert {k: r.text for k, r in stored.items()} == {e.claim.task.id: value for e in ends}


def test_a_refused_end_is_its_own_and_the_rest_of_the_group_is_written(
        store: Store, zk: Session) -> None:
    told = Told()
    commits = GroupCommit(store, "m1", told)
    ends = claimed(store, zk, 3)
    closed = ends[1].claim
    store.attempts.finish(closed.attempt.id, AttemptStatus.CANCELLED, "cancelled by an operator")
    for ending in ends:
        commits.submit(ending)
    assert wait_until(lambda: len(told.ends) == 3, 20)
    commits.close()
    assert told.ends[closed.task.id][0] is Outcome.CANCELLED
    assert told.ends[closed.task.id][2] == (AttemptStatus.CANCELLED, "cancelled by an operator")
    for n in (0, 2):
        assert told.ends[ends[n].claim.task.id][0] is Outcome.FINISHED
        assert store.attempts.get(ends[n].claim.attempt.id).status is AttemptStatus.SUCCEEDED
    assert store.attempts.get(closed.attempt.id).status is AttemptStatus.CANCELLED
    assert all(lock_owner(zk, e.claim.task.id) is None for e in ends)


def fails(original: Any, left: list[int], error: Exception) -> Any:
    """``original`` (a store's ``conclude_released``), raising ``error`` while ``left[0]`` is not
    0 (counted down by each call)."""
    def failing(conclusions: Any) -> Any:
        if left[0]:
            left[0] -= 1
            raise error
        return original(conclusions)
    return failing


def test_a_graph_out_of_reach_is_tried_again_then_given_up(tmp_path: Path, zk: Session) -> None:
    """The graph failing under a group: the group is written again with backoff (all of it:
    on the file it is one transaction, nothing of the failed try stayed); past
    ``store_retry_for`` the ends are given up: reported CANCELLED_BY_SYSTEM "its end could not
    be written", their attempts left RUNNING for the master, their locks released. Any other
    error of the write is tried again the same way."""
    with open_store(str(tmp_path / "graph.db")) as store:
        original = store.conclude_released  # type: ignore[attr-defined]
        # the graph out of reach, then an error of the write itself (it was an OverflowError
        # in the wait for SQLite's lock), twice each: tried again the same way, not given up
        # at once with the locks let go
        for fault, count in ((StoreUnavailable("the graph went away"), 3),
                             (OverflowError("int too large to convert to float"), 2)):
            left = [2]
            store.conclude_released = fails(original, left, fault)  # type: ignore[attr-defined]
            told = Told()
            commits = GroupCommit(store, "m1", told, store_retry_for=30)
            ends = claimed(store, zk, count)
            for ending in ends:
                commits.submit(ending)
            assert wait_until(lambda: len(told.ends) == count, 20)  # noqa: B023
            assert all(told.ends[e.claim.task.id][0] is Outcome.FINISHED for e in ends)
            assert left == [0]
            commits.close()
        store.conclude_released = fails(original, [1000],  # type: ignore[attr-defined]
                                        StoreUnavailable("the graph went away"))

        told = Told()
        commits = GroupCommit(store, "m1", told, store_retry_for=0.5)
        more = claimed(store, zk, 2)
        for ending in more:
            commits.submit(ending)
        assert wait_until(lambda: len(told.ends) == 2, 20)
        commits.close()
        for ending in more:
            outcome, task, (status, error) = told.ends[ending.claim.task.id]
            assert (outcome, task, status) == (Outcome.CANCELLED, None,
                                               AttemptStatus.CANCELLED_BY_SYSTEM)
            assert "its end could not be written" in (error or "")
            assert store.attempts.get(ending.claim.attempt.id).status is AttemptStatus.RUNNING
            assert lock_owner(zk, ending.claim.task.id) is None


def test_an_end_is_reported_only_once_its_group_is_written(
        zk_namespace: ZkNamespace, tmp_path: Path) -> None:
    """While a node's write of attempt ends is held up, a handler that returned is reported
    nowhere: its attempt is RUNNING and its task open in the store, no observer has heard of
    it (the attempt log, metrics and hooks are observers) and its lock is still held (so a
    node killed -9 now leaves the attempt to the master's reaper, like any node killed while
    running), while its worker is free already. Once written, the observers hear SUCCEEDED
    and the lock goes."""
    from runner.tasks import TaskContext, TaskRegistry
    from runner.tasks.observer import Hooks
    from runner.tasks.worker.loop import LoopSettings, TaskLoop

    told: list[AttemptStatus] = []
    returned = threading.Event()
    registry = TaskRegistry()

    def handler(ctx: TaskContext, payload: object) -> None:
        returned.set()

    registry.register("t", handler)
    with open_store(str(tmp_path / "graph.db")) as store, \
            Session(zk_namespace.hosts, "g1", timeout=4.0) as s:
        held = HeldFirstWrite(store)
        loop = TaskLoop(s, "m1", store, registry, LoopSettings(workers=1, scan_interval=3600),
                        observers=[Hooks(after=lambda ctx, status, error: told.append(status))])
        task = store.tasks.create("t", {})
        loop.start()
        try:
            assert returned.wait(10)
            assert wait_until(lambda: held.calls == 1, 10)  # its end is being written
            time.sleep(0.3)
            assert told == []
            assert store.attempts.for_task(task.id)[0].status is AttemptStatus.RUNNING
            assert not store.tasks.get(task.id).finished
            assert lock_owner(s, task.id) == "m1"
            assert loop.running.working() == 0  # the worker was free when its handler returned
            held.go()
            assert wait_until(lambda: told == [AttemptStatus.SUCCEEDED], 10)
            assert store.tasks.get(task.id).finished
            assert wait_until(lambda: lock_owner(s, task.id) is None, 10)
        finally:
            held.go()
            loop.close()
