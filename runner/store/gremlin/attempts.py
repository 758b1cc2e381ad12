"""Attempts as ``attempt`` vertices with a ``has_attempt`` edge from their task: started
before the handler runs (with the claim), finished exactly once (a second finish raises
:class:`~runner.errors.AttemptAlreadyFinished`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from gremlin_python.process.graph_traversal import __
from gremlin_python.process.traversal import Cardinality, P

from runner.errors import (
    TaskNotFound,
)
from runner.store import codec
from runner.store.api import Graph
from runner.store.ends import RESULT, attempt_end
from runner.store.gremlin.rows import (
    ATTEMPT_KEYS,
    attempt_from_row,
)
from runner.store.gremlin.steps import any_of
from runner.store.gremlin.tasks import (
    read_task,
)
from runner.store.gremlin.writes import (
    AttemptStart,
    TaskChange,
    attempt_start,
    matched_write,
    task_change,
    until_written,
    write_end,
)
from runner.store.model import (
    Attempt,
    AttemptStatus,
    StoredResult,
)


def write_start(graph: Graph, change: TaskChange, start: AttemptStart) -> bool:
    """Write ``change`` of the task and add ``start``'s attempt to it, as one guarded
    traversal; False, nothing written, when the task's version guard refused."""
    return matched_write(graph, lambda g: start.extend(change.traverse(g)))


class GremlinAttemptLog:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def start(self, task_id: str, executor: str, fence_token: int = 0) -> Attempt:
        """Write a RUNNING attempt (before the handler runs, so a crash still leaves it) and
        count it on its task, in one traversal guarded by the task's version (re-read and
        retried when the task moved on meanwhile)."""
        def once() -> Attempt | None:
            change = task_change(read_task(self.graph, task_id), None, {}, new_attempt=True)
            start = attempt_start(change.task, executor, fence_token)
            return start.attempt if write_start(self.graph, change, start) else None
        return until_written(once, task_id)

    def finish(self, attempt_id: str, status: AttemptStatus, error: str | None = None,
               stack_trace: str | None = None, *, progress: str | None = None,
               ended: datetime | None = None) -> Attempt:
        """Close a RUNNING attempt (``progress``: its last report, ``progress_json``, written
        with the end; ``ended``: its end time, now when None); a second finish raises
        :class:`AttemptAlreadyFinished`."""
        end = attempt_end(self.get(attempt_id), status, error, stack_trace, progress, ended)
        self.graph.write(write_end(end))
        return end.attempt

    def progress(self, attempt_id: str, done: int, total: int | None, message: str) -> bool:
        """Record what a RUNNING attempt reports (the last value wins); False, nothing written,
        once the attempt has ended."""
        value = codec.progress_json(done, total, message, codec.now())
        return matched_write(self.graph, lambda g: g.V().has("attempt_id", attempt_id)
                             .has("attempt_status", AttemptStatus.RUNNING.value)
                             .property(Cardinality.single, "attempt_progress", value))

    def heartbeat(self, attempt_id: str, details: object) -> bool:
        """Record the last details a RUNNING attempt beat (``attempt_beat``); False, nothing
        written, once the attempt has ended."""
        value = codec.encode_json({"at": codec.encode_time(codec.now()), "details": details})
        return matched_write(self.graph, lambda g: g.V().has("attempt_id", attempt_id)
                             .has("attempt_status", AttemptStatus.RUNNING.value)
                             .property(Cardinality.single, "attempt_beat", value))

    def get(self, attempt_id: str) -> Attempt:
        rows = self.graph.read(
            lambda g: g.V().has("attempt_id", attempt_id).element_map(*ATTEMPT_KEYS).to_list())
        if not rows:
            raise TaskNotFound(f"no attempt {attempt_id}")
        return attempt_from_row(rows[0])

    def for_task(self, task_id: str) -> list[Attempt]:
        rows = self.graph.read(
            lambda g: g.V().has("task_id", task_id).out("has_attempt")
            .element_map(*ATTEMPT_KEYS).to_list())
        return sorted((attempt_from_row(r) for r in rows), key=lambda a: a.seq)

    def recent(self, limit: int = 10) -> list[Attempt]:
        """The ``limit`` attempts that ended last (today and yesterday, UTC), newest first.
        Reads those two days' ends from the ``attempt_end_day`` index: the cost grows with a
        day's attempts, not with the history."""
        today = codec.now()
        days = [(today - timedelta(days=d)).strftime("%Y-%m-%d") for d in (0, 1)]
        rows = self.graph.read(
            lambda g: g.V().has("attempt_end_day", P.within(days))
            .element_map(*ATTEMPT_KEYS).to_list())
        ended = [attempt_from_row(r) for r in rows]
        ended.sort(key=lambda a: a.ended_at or a.started_at, reverse=True)
        return ended[:limit]

    def running(self) -> list[Attempt]:
        rows = self.graph.read(
            lambda g: g.V().has("attempt_status", "RUNNING").element_map(*ATTEMPT_KEYS)
            .to_list())
        return sorted((attempt_from_row(r) for r in rows), key=lambda a: (a.task_id, a.seq))

    def result(self, task_id: str) -> StoredResult | None:
        """The result of ``task_id``'s SUCCEEDED attempt (one read), or None."""
        return self.results([task_id]).get(task_id)

    def results(self, task_ids: Sequence[str]) -> dict[str, StoredResult]:
        """The results of ``task_ids`` in one read: their SUCCEEDED attempts' ids and
        results, found from the tasks by index (only a task's attempts are walked)."""
        if not task_ids:
            return {}
        rows = self.graph.read(
            lambda g: any_of(self.graph, g, "task_id", list(task_ids)).as_("t")
            .out("has_attempt").has("attempt_status", AttemptStatus.SUCCEEDED.value)
            .has(RESULT).project("task", "attempt", "result")
            .by(__.select("t").values("task_id")).by(__.values("attempt_id"))
            .by(__.values(RESULT)).to_list())
        return {str(r["task"]): StoredResult(str(r["task"]), str(r["attempt"]),
                                             str(r["result"])) for r in rows}
