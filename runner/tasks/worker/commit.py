"""Group commit of attempt conclusions: the ends of several attempts written in one store write.

A worker whose handler ended calls :meth:`GroupCommit.conclude` and waits for its answer. If no
write is under way it writes at once, with whatever other conclusions are queued by then; if
one is, its conclusion is queued, and the first queued worker writes the next group as soon as
that write returns, up to ``max_items`` at a time. So an idle node adds no delay at all, and a
busy one writes one transaction for as many conclusions as arrived during the last one (the
classic group commit of databases: no timer, the write itself is the flush period).

Each conclusion in a group is its own guarded traversal (:meth:`GraphStore.conclude`), so one
that is refused (its attempt closed by the master, a stale token, a resource taken) raises
for its worker alone and the others are written. On the embedded graph the group is one
``BEGIN IMMEDIATE`` transaction: all of it or none of it is on disk. On a Gremlin Server
without transactions each traversal is written as it comes. A group that fails as a whole (the
graph unreachable) raises the same error to every worker in it; they try again with their own
backoff (:meth:`~runner.tasks.worker.execution.Execution._write_end`), and an end that was in
fact written is recognised then.

Nothing is reported before its group is written: the worker waits for the answer, and only
then tells its observers, releases its lock and looks for work. A node killed -9 before a group
is written loses none of the conclusions reported anywhere: their attempts are still RUNNING,
closed CANCELLED_BY_SYSTEM by the master's reaper, and the tasks run again, as for any node
killed while running a task.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from runner.errors import StoreError, StoreUnavailable
from runner.store import Attempt, AttemptStatus, GraphStore, Task


@dataclass
class _Conclusion:
    attempt: Attempt
    status: AttemptStatus
    error: str | None
    stack: str | None
    task: Task
    token: int
    changes: Mapping[str, Any]
    progress: str | None = None
    ended: datetime | None = None
    done: threading.Event = field(default_factory=threading.Event)
    lead: bool = False  # this waiting worker writes the next group
    result: Task | None = None
    failure: BaseException | None = None


class GroupCommit:
    """Conclusions of one node's workers, written in groups (see the module). ``stats``:
    ``groups`` written and ``concluded`` conclusions in them."""

    def __init__(self, store: GraphStore, max_items: int = 64) -> None:
        self.store = store
        self.max_items = max_items
        self.stats = {"groups": 0, "concluded": 0, "largest": 0}
        self._queue: list[_Conclusion] = []
        self._writing = False
        self._lock = threading.Lock()

    def conclude(self, attempt: Attempt, status: AttemptStatus, error: str | None,
                 stack: str | None, task: Task, token: int,
                 changes: Mapping[str, Any], *, progress: str | None = None,
                 ended: datetime | None = None) -> Task:
        """:meth:`GraphStore.conclude`, written with the conclusions queued with it; raises
        what that raises for this attempt."""
        item = _Conclusion(attempt, status, error, stack, task, token, changes, progress, ended)
        with self._lock:
            self._queue.append(item)
            lead = not self._writing
            if lead:
                self._writing = True
        if lead:
            self._write_groups(item)
        else:
            item.done.wait()
            if item.lead:  # handed the next group: write it (it holds this one)
                self._write_groups(item)
        if item.failure is not None:
            raise item.failure
        assert item.result is not None
        return item.result

    def _write_groups(self, own: _Conclusion) -> None:
        """Write the group that holds ``own``, then hand the writing on to the first worker
        still queued (or end it)."""
        try:
            with self._lock:
                group = self._queue[:self.max_items]
                del self._queue[:len(group)]
            assert own in group  # queued first, or handed the lead as the first queued
            self._write(group)
        finally:
            with self._lock:
                if self._queue:
                    following = self._queue[0]
                    following.lead = True
                    following.done.set()
                else:
                    self._writing = False

    def _write(self, group: list[_Conclusion]) -> None:
        def write(g: Any) -> None:
            for item in group:
                try:
                    item.result = self.store.conclude(item.attempt, item.status, item.error,
                                                      item.stack, item.task, item.token,
                                                      item.changes, progress=item.progress,
                                                      ended=item.ended)
                except StoreUnavailable:  # the graph itself: the whole group fails
                    raise
                except StoreError as exc:  # a refusal of this conclusion alone
                    item.failure = exc

        try:
            self.store.graph.write(write)
        except BaseException as exc:
            for item in group:  # nothing of the group is known written
                item.result, item.failure = None, exc
        else:
            with self._lock:
                self.stats["groups"] += 1
                self.stats["concluded"] += len(group)
                self.stats["largest"] = max(self.stats["largest"], len(group))
        finally:
            for item in group:
                if item.failure is None and item.result is None:
                    item.failure = RuntimeError("conclusion not written")
                item.done.set()

