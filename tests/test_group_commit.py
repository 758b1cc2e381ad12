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


def test_ends_that_arrive_during_a_write_go_in_the_next_group(store: GraphStore) -> None:
    commits = GroupCommit(store)
    work = claimed(store, 12)
    gate = threading.Event()
    write = store.graph.write
    calls = 0

    def slow_first(fn: Any) -> Any:  # the first group holds the writer until all have queued
        nonlocal calls
        calls += 1
        if calls == 1:
            gate.wait(10)
        return write(fn)

    store.graph.write = slow_first  # type: ignore[method-assign]
    results: dict[int, Any] = {}

    def end(i: int) -> None:
        task, attempt, token = work[i]
        results[i] = commits.conclude(attempt, AttemptStatus.SUCCEEDED, None, None, task,
                                      token, FINISHED)

    threads = [threading.Thread(target=end, args=(i,)) for i in range(len(work))]
    threads[0].start()
    assert _wait_for(lambda: calls >= 1, 10)
    for t in threads[1:]:
        t.start()
    assert _wait_for(lambda: len(commits._queue) == len(work) - 1, 10)
    gate.set()
    for t in threads:
        t.join(30)
    store.graph.write = write  # type: ignore[method-assign]
    assert len(results) == len(work)
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
    gate = threading.Event()
    write = store.graph.write
    errors: dict[int, BaseException] = {}
    calls = 0

    def held(fn: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            gate.wait(10)
        return write(fn)

    store.graph.write = held  # type: ignore[method-assign]

    def end(i: int) -> None:
        task, attempt, token = work[i]
        try:
            commits.conclude(attempt, AttemptStatus.SUCCEEDED, None, None, task, token,
                             FINISHED)
        except BaseException as exc:
            errors[i] = exc

    first = threading.Thread(target=end, args=(0,))
    first.start()
    assert _wait_for(lambda: calls >= 1, 10)
    rest = [threading.Thread(target=end, args=(i,)) for i in (1, 2)]
    for t in rest:
        t.start()
    assert _wait_for(lambda: len(commits._queue) == 2, 10)
    gate.set()
    for t in [first, *rest]:
        t.join(30)
    store.graph.write = write  # type: ignore[method-assign]
    assert set(errors) == {1} and isinstance(errors[1], AttemptAlreadyFinished)
    assert commits.stats["groups"] == 2 and commits.stats["largest"] == 2
    assert store.attempts.get(work[2][1].id).status is AttemptStatus.SUCCEEDED
    assert store.attempts.get(closed.id).status is AttemptStatus.CANCELLED


def test_a_graph_that_fails_mid_group_fails_every_end_of_it_and_writes_none(
        tmp_path: Path) -> None:
    """On the file the group is one transaction: the graph failing at its second end leaves the
    first unwritten too, and every worker hears the failure (each tries again on its own)."""
    with open_store(str(tmp_path / "graph.db")) as store:
        commits = GroupCommit(store)
        work = claimed(store, 2)
        conclude = store.conclude
        seen = 0

        def failing(*args: Any) -> Any:
            nonlocal seen
            seen += 1
            if seen == 2:
                raise StoreUnavailable("the graph went away")
            return conclude(*args)

        store.conclude = failing  # type: ignore[method-assign]
        errors: list[BaseException] = []
        gate = threading.Event()
        write = store.graph.write

        def held(fn: Any) -> Any:
            gate.wait(10)
            return write(fn)

        store.graph.write = held  # type: ignore[method-assign]

        def end(i: int) -> None:
            task, attempt, token = work[i]
            try:
                commits.conclude(attempt, AttemptStatus.SUCCEEDED, None, None, task, token,
                                 FINISHED)
            except BaseException as exc:
                errors.append(exc)

        # both queued before the first write starts: one group of two
        commits._writing = True
        threads = [threading.Thread(target=end, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        assert _wait_for(lambda: len(commits._queue) == 2, 10)
        with commits._lock:
            commits._queue[0].lead = True
            commits._queue[0].done.set()
        gate.set()
        for t in threads:
            t.join(30)
        store.graph.write = write  # type: ignore[method-assign]
        store.conclude = conclude  # type: ignore[method-assign]
        assert len(errors) == 2 and all(isinstance(e, StoreUnavailable) for e in errors)
        for _, attempt, _ in work:  # the first end was rolled back with the group
            assert store.attempts.get(attempt.id).status is AttemptStatus.RUNNING


def _wait_for(predicate: Any, timeout: float) -> bool:
    from coord.testing import wait_until

    return bool(wait_until(predicate, timeout, 0.01))


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

        def held(*args: Any) -> Any:
            gate.wait(30)
            return conclude(*args)

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
            assert _wait_for(lambda: told == [AttemptStatus.SUCCEEDED], 10)
            assert store.tasks.get(task.id).finished
            assert _wait_for(lambda: lock_owner(s, task.id) is None, 10)
        finally:
            gate.set()
            loop.close()
