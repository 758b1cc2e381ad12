"""Tasks as ``task`` vertices: create (unique key), read, list the open queue, version reads,
guarded modify. A missing task raises :class:`~runner.store.errors.TaskNotFound`; a guard lost
to another writer, :class:`~runner.store.errors.CommitConflict`."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from gremlin_python.process.graph_traversal import __
from gremlin_python.process.traversal import P

from runner.store import codec
from runner.store.errors import (
    CommitConflict,
    InvalidValue,
    TaskNotFound,
)
from runner.store.graph import Graph

# -- tasks ------------------------------------------------------------------------------------
from runner.store.gremlin.rows import (
    task_from_row,
    task_props,
)
from runner.store.gremlin.steps import (
    add_vertex,
)
from runner.store.gremlin.writes import (
    TaskChange,
    matched_write,
    task_change,
    until_written,
)
from runner.store.model import (
    Task,
    TaskStatus,
)


def read_task(graph: Graph, task_id: str) -> Task:
    rows = graph.read(lambda g: g.V().has("task_id", task_id).element_map().to_list())
    if not rows:
        raise TaskNotFound(f"no task {task_id}")
    return task_from_row(rows[0])


class GremlinTaskStore:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def create(self, type: str, payload: Mapping[str, Any] | None = None, *,
               unique_key: str | None = None, priority: int = 0) -> Task:
        if not type:
            raise InvalidValue("a task needs a type")
        created = codec.now()
        task = Task(id=str(uuid.uuid4()), type=type, payload=dict(payload or {}), active=True,
                    status=TaskStatus.WAITING, finished=False, priority=priority,
                    created_at=created, updated_at=created, version=0, fence=0,
                    unique_key=unique_key)
        props = task_props(task)

        def run(g: Any) -> Any:
            if unique_key is None:
                return add_vertex(g, "task", props).element_map().next()
            # one traversal: find the task with this key or create it
            return (g.V().has("task_unique", unique_key).fold()
                    .coalesce(__.unfold(), add_vertex(__, "task", props))
                    .element_map().next())

        return task_from_row(self.graph.write(run))

    def get(self, task_id: str) -> Task:
        return read_task(self.graph, task_id)

    def unfinished(self) -> list[Task]:
        rows = self.graph.read(
            lambda g: g.V().has("task_queue", "open").element_map().to_list())
        tasks = [task_from_row(row) for row in rows]
        tasks.sort(key=lambda t: (-t.priority, t.created_at, t.id))
        return tasks

    def versions(self, task_ids: Sequence[str]) -> dict[str, int]:
        """The current version of each task that exists (one read): a cheap freshness check
        of a listing before paying for a lock and a claim."""
        if not task_ids:
            return {}
        # element_map of two keys: half the cost of project().by().by() on gremlite
        rows = self.graph.read(
            lambda g: g.V().has("task_id", P.within(list(task_ids)))
            .element_map("task_id", "task_version").to_list())
        return {r["task_id"]: int(r["task_version"]) for r in rows}

    def all(self, type: str | None = None) -> list[Task]:
        """Every task (finished ones too), newest first; optionally of one type."""
        if type is None:
            rows = self.graph.read(lambda g: g.V().has_label("task").element_map().to_list())
        else:
            rows = self.graph.read(
                lambda g: g.V().has("task_type", type).element_map().to_list())
        tasks = [task_from_row(row) for row in rows]
        tasks.sort(key=lambda t: (t.created_at, t.id), reverse=True)
        return tasks

    def update(self, task_id: str, expected_version: int, fence_token: int | None,
               **changes: Any) -> Task:
        change = self.prepare_update(task_id, expected_version, fence_token, changes)
        self.graph.write(change.write)
        return change.task

    def prepare_update(self, task_id: str, expected_version: int, fence_token: int | None,
                       changes: Mapping[str, Any]) -> TaskChange:
        """Read and check the task now (TaskNotFound, CommitConflict, StaleFencingToken);
        the returned change is written later, guarded by the version."""
        current = read_task(self.graph, task_id)
        if current.version != expected_version:
            raise CommitConflict(task_id, expected_version, current.version)
        return task_change(current, fence_token, changes)

    def modify(self, task_id: str, fence_token: int | None, changes: Mapping[str, Any],
               move_fence: bool = False) -> Task:
        """Apply ``changes`` to the task as it now stands (re-read and written again while
        someone else writes first). ``fence_token``: an owner's write, refused with
        :class:`StaleFencingToken` once the token is no longer the task's."""
        def once() -> Task | None:
            change = task_change(read_task(self.graph, task_id), fence_token, changes,
                                 move_fence=move_fence)
            return change.task if matched_write(self.graph, change.traverse) else None
        return until_written(once, task_id)

    def _flip(self, task_id: str, active: bool) -> Task:
        task = self.get(task_id)
        return task if task.active is active else self.modify(task_id, None, {"active": active})

    def deactivate(self, task_id: str) -> Task:
        """Stop the task (the task loop no longer picks it); kept forever, like every task.
        A running attempt is not touched here: see ``GraphStore.cancel``."""
        return self._flip(task_id, False)

    def reactivate(self, task_id: str) -> Task:
        return self._flip(task_id, True)


