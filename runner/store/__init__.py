"""The graph store: tasks, attempts, ontologies and avatars through gremlinpython.

``open_store(location)`` returns a :class:`GraphStore` over gremlite (a SQLite file path, the
embedded default) or a remote Gremlin Server (``ws://host:8182/gremlin``). Its ``tasks``,
``attempts``, ``ontologies`` and ``avatars`` implement the ports in :mod:`runner.store.ports`.
Errors are in :mod:`runner.store.errors`.
"""

from __future__ import annotations

from collections.abc import Mapping

from runner.store.errors import (
    AttemptAlreadyFinished,
    CommitConflict,
    InvalidValue,
    StaleFencingToken,
    StoreError,
    StoreUnavailable,
    TaskNotFound,
    UnknownStoreFormat,
)
from runner.store.graph import EmbeddedGraph, Graph, RemoteGraph, open_graph
from runner.store.gremlin import (
    GremlinAttemptLog,
    GremlinAvatarStore,
    GremlinOntologyStore,
    GremlinTaskStore,
    attempt_end,
    attempt_start,
    matched_write,
    task_change,
    write_start,
)
from runner.store.model import (
    Attempt,
    AttemptStatus,
    Avatar,
    LoadResult,
    Ontology,
    OntologyClass,
    OntologyRecord,
    Task,
    TaskStatus,
)
from runner.store.ports import AttemptLog, AvatarStore, OntologyStore, TaskStore


class GraphStore:
    """The four stores over one graph connection; ``close()`` when done."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._tasks = GremlinTaskStore(graph)
        self._attempts = GremlinAttemptLog(graph)
        self.tasks: TaskStore = self._tasks
        self.attempts: AttemptLog = self._attempts
        self.ontologies: OntologyStore = GremlinOntologyStore(graph)
        self.avatars: AvatarStore = GremlinAvatarStore(graph)

    def claim(self, task: Task, fence_token: int, member_id: str) -> tuple[Task, Attempt]:
        """Claim ``task`` as listed (RUNNING, owner, token; guarded by its version) and add its
        RUNNING attempt (numbered from the task's attempt count), in one traversal, with no
        read.

        A task that moved on since it was listed raises :class:`CommitConflict`, one whose
        newer token was recorded :class:`StaleFencingToken`, and nothing is written.
        """
        change = task_change(task, fence_token,
                             {"status": TaskStatus.RUNNING, "owner": member_id}, new_attempt=True)
        start = attempt_start(change.task, member_id, fence_token)
        if not write_start(self.graph, change, start):
            # moved on since it was listed: a fresh read says how (or it is a plain conflict)
            self._tasks.prepare_update(task.id, task.version, fence_token, {})
            raise CommitConflict(task.id, task.version, None)
        return change.task, start.attempt

    def conclude(self, attempt: Attempt, attempt_status: AttemptStatus, error: str | None,
                 stack_trace: str | None, task: Task, fence_token: int,
                 changes: Mapping[str, object]) -> Task:
        """End ``attempt`` and update ``task`` (both as this owner last wrote them) in one
        traversal, with no read when both still hold.

        If the task update fails (another owner's newer token, a concurrent change), the
        attempt is still finished on its own and the task error is raised; the attempt is
        never lost with it. An attempt closed meanwhile (by the master) raises
        :class:`AttemptAlreadyFinished` and changes nothing, whether or not the task moved on
        too (the caller then updates the task from its current version).
        """
        end = attempt_end(attempt, attempt_status, error, stack_trace)
        try:
            change = task_change(task, fence_token, changes)
            if matched_write(self.graph, lambda g: change.traverse(end.traverse(g))):
                return change.task
            # the attempt was closed meanwhile (by the master), or else the task moved on (a
            # fresh read raises CommitConflict / StaleFencingToken, and the attempt is ended
            # alone below). A server without transactions may have applied our end of the
            # attempt before the task's guard refused: that end is ours, not a close.
            current = self._attempts.get(attempt.id)
            ours = (current.status is end.attempt.status
                    and current.ended_at == end.attempt.ended_at)
            if current.status is not AttemptStatus.RUNNING and not ours:
                raise AttemptAlreadyFinished(
                    f"attempt {attempt.id} is already {current.status.value}")
            self._tasks.prepare_update(task.id, task.version, fence_token, {})
            raise CommitConflict(task.id, task.version, None)
        except (CommitConflict, StaleFencingToken):
            try:
                self.attempts.finish(attempt.id, attempt_status, error, stack_trace)
            except AttemptAlreadyFinished:
                pass
            raise

    def close(self) -> None:
        self.graph.close()

    def __enter__(self) -> GraphStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_store(location: str) -> GraphStore:
    return GraphStore(open_graph(location))


__all__ = [
    "Attempt", "AttemptAlreadyFinished", "AttemptLog", "AttemptStatus", "Avatar", "AvatarStore",
    "CommitConflict", "EmbeddedGraph", "Graph", "GraphStore", "GremlinAttemptLog",
    "GremlinAvatarStore", "GremlinOntologyStore", "GremlinTaskStore", "InvalidValue",
    "LoadResult", "Ontology", "OntologyClass", "OntologyRecord", "OntologyStore", "RemoteGraph",
    "StaleFencingToken", "StoreError", "StoreUnavailable", "Task", "TaskNotFound", "TaskStatus",
    "TaskStore", "UnknownStoreFormat", "open_graph", "open_store",
]
