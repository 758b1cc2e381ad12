"""Group commit of attempt ends (runner/tasks/worker/commit.py) on the embedded graph file and
on a Gremlin Server: workers that end together are written together, a refusal is its own
worker's alone, a graph that fails fails the whole group and nothing of it is written."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coord.testing import wait_until
from coord.testing.plugin import ZkNamespace
from runner.errors import AttemptAlreadyFinished, StoreUnavailable
from runner.store import AttemptStatus, GraphStore, TaskStatus, open_store
from runner.store.remote import SERIAL
from runner.tasks.worker.commit import GroupCommit
from runner.testing.gremlinserver import GremlinServer

FINISHED = {"status": TaskStatus.WAITING, "finished": True}


@pytest.fixture(params=["gremlite", "server"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[GraphStore]:
    if request.param == "gremlite":
        with open_store(str(tmp_path / "graph.db")) as s:
            yield s
    else:
        server: GremlinServer = request.getfixturevalue("gremlin_server")
        with open_store(server.url, atomicity=SERIAL) as s:
            yield s


def claimed(store: GraphStore, n: int) -> list[tuple[Any, Any, int]]:
    out = []
    for i in range(n):
        task = store.tasks.create("t", {"n": i})
        token = 100 + i
        task, attempt = store.claim(task, token, "m1")
        out.append((task, attempt, token))
    return out


class Ends:
    """Workers ending ``work``'s attempts through ``commits`` on threads of their own, with the
    graph's first write (the first group) held until :meth:`go`: the ends that arrive
    meanwhile queue for the next group."""

    def __init__(self, store: GraphStore, commits: GroupCommit,
                 work: list[tuple[Any, Any, int]]) -> None:
        self.store, self.commits, self.work = store, commits, work
        self.gate = threading.Event()
        self.writes = 0
        self.results: dict[int, Any] = {}
        self.errors: dict[int, BaseException] = {}
        self.threads: list[threading.Thread] = []
        self._write = store.graph.write
        store.graph.write = self._held  # type: ignore[method-assign]

    def _held(self, fn: Any) -> Any:
        self.writes += 1
        if self.writes == 1:
            self.gate.wait(10)
        return self._write(fn)

    def _end(self, i: int) -> None:
        task, attempt, token = self.work[i]
        try:
            self.results[i] = self.commits.conclude(attempt, AttemptStatus.SUCCEEDED, None,
                                                    None, task, token, FINISHED)
        except BaseException as exc:
            self.errors[i] = exc

    def start(self, *indices: int) -> None:
        for i in indices:
            thread = threading.Thread(target=self._end, args=(i,))
            thread.start()
            self.threads.append(thread)

    def queue_behind_first(self, count: int) -> None:
        """The first end's group held in its write, the next ``count`` ends queued behind it."""
        self.start(0)
        assert wait_until(lambda: self.writes >= 1, 10)
        self.start(*range(1, count + 1))
        assert wait_until(lambda: len(self.commits._queue) == count, 10)

    def go(self) -> None:
        """Let the held write through, wait for every worker, put the graph back."""
        self.gate.set()
        for thread in self.threads:
            thread.join(30)
        self.store.graph.write = self._write  # type: ignore[method-assign]


def test_ends_that_arrive_during_a_write_go_in_the_next_group(store: GraphStore) -> None:
    commits = GroupCommit(store)
    work = claimed(store, 12)
    ends = Ends(store, commits, work)
    ends.queue_behind_first(len(work) - 1)
    ends.go()
    assert len(ends.results) == len(work) and not ends.errors
    assert commits.stats == {"groups": 2, "concluded": 12, "largest": 11}
    for task, attempt, _ in work:
        assert store.attempts.get(attempt.id).status is AttemptStatus.SUCCEEDED
        assert store.tasks.get(task.id).finished


def test_a_refused_end_is_its_own_workers_and_the_rest_of_the_group_is_written(
        store: GraphStore) -> None:
    commits = GroupCommit(store)
    work = claimed(store, 3)
    closed = work[1][1]
    store.attempts.finish(closed.id, AttemptStatus.CANCELLED, "cancelled by an operator")
    ends = Ends(store, commits, work)
    ends.queue_behind_first(2)
    ends.go()
    assert set(ends.errors) == {1} and isinstance(ends.errors[1], AttemptAlreadyFinished)
    assert commits.stats["groups"] == 2 and commits.stats["largest"] == 2
    assert store.attempts.get(work[2][1].id).status is AttemptStatus.SUCCEEDED
    assert store.attempts.get(closed.id).status is AttemptStatus.CANCELLED


def test_a_graph_that_fails_mid_group_fails_every_end_of_it_and_writes_none(
        tmp_path: Path) -> None:
    """On the file the group is one transaction: the graph failing at its second end leaves the
    first unwritten too, and every worker hears the failure (each tries again on its own)."""
    with open_store(str(tmp_path / "graph.db")) as store:
        commits = GroupCommit(store)
        work = claimed(store, 3)
        conclude = store.conclude
        seen = 0

        def failing(*args: Any, **kwargs: Any) -> Any:
            nonlocal seen
            seen += 1
            if seen == 3:  # the second end of the second group
                raise StoreUnavailable("the graph went away")
            return conclude(*args, **kwargs)

        store.conclude = failing  # type: ignore[method-assign]
        ends = Ends(store, commits, work)
        ends.queue_behind_first(2)
        ends.go()
        store.conclude = conclude  # type: ignore[method-assign]
        assert 0 in ends.results and set(ends.errors) == {1, 2}
        assert all(isinstance(e, StoreUnavailable) for e in ends.errors.values())
        assert store.attempts.get(work[0][1].id).status is AttemptStatus.SUCCEEDED
        for _, attempt, _ in work[1:]:  # the first end of the group was rolled back with it
            assert store.attempts.get(attempt.id).status is AttemptStatus.RUNNING


def test_an_end_is_reported_only_once_its_group_is_written(
        zk_namespace: ZkNamespace, tmp_path: Path) -> None:
    """While a node's write of attempt ends is held up, a handler that returned is reported
    nowhere: its attempt is RUNNING and its task open in the store, no observer has heard of
    it (the attempt log, metrics and hooks are observers) and its lock is still held (so a
    node killed -9 now leaves the attempt to the master's reaper, like any node killed while
    running). Once written, the observers hear SUCCEEDED and the lock goes."""
    from coord import Session, lock_owner
    from runner.tasks import TaskContext, TaskRegistry
    from runner.tasks.observer import Hooks
    from runner.tasks.worker.loop import LoopSettings, TaskLoop

    told: list[AttemptStatus] = []
    returned = threading.Event()
    registry = TaskRegistry()

    def handler(ctx: TaskContext, payload: object) -> None:
        returned.set()

    registry.register("t", handler)
    gate = threading.Event()
    with open_store(str(tmp_path / "graph.db")) as store, \
            Session(zk_namespace.hosts, "g1", timeout=4.0) as s:
        loop = TaskLoop(s, "m1", store, registry, LoopSettings(workers=1, scan_interval=3600),
                        observers=[Hooks(after=lambda ctx, status, error: told.append(status))])
        conclude = loop.execution.commits.conclude

        def held(*args: Any, **kwargs: Any) -> Any:
            gate.wait(30)
            return conclude(*args, **kwargs)

        loop.execution.commits.conclude = held  # type: ignore[method-assign]
        task = store.tasks.create("t", {})
        loop.start()
        try:
            assert returned.wait(10)
            time.sleep(0.3)  # the worker is now waiting for its write
            assert told == []
            assert store.attempts.for_task(task.id)[0].status is AttemptStatus.RUNNING
            assert not store.tasks.get(task.id).finished
            assert lock_owner(s, task.id) == "m1"
            gate.set()
            assert wait_until(lambda: told == [AttemptStatus.SUCCEEDED], 10)
            assert store.tasks.get(task.id).finished
            assert wait_until(lambda: lock_owner(s, task.id) is None, 10)
        finally:
            gate.set()
            loop.close()
