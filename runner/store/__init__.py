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
)
from runner.store.graph import EmbeddedGraph, Graph, RemoteGraph, open_graph
from runner.store.gremlin import (
    GremlinAttemptLog,
    GremlinAvatarStore,
    GremlinOntologyStore,
    GremlinTaskStore,
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

    def claim(self, task_id: str, expected_version: int, fence_token: int,
              member_id: str) -> tuple[Task, Attempt]:
        """Claim a task (RUNNING, owner, token; version-guarded) and write its RUNNING attempt,
        in one transaction on the embedded graph (two traversals on a remote one). The reads
        and checks happen before the write transaction."""
        claim, task = self._tasks.prepare_update(
            task_id, expected_version, fence_token,
            {"status": TaskStatus.RUNNING, "owner": member_id})
        start, attempt = self._attempts.prepare_start(task_id, member_id, fence_token)

        def both(g: object) -> None:
            claim(g)
            start(g)

        self.graph.write(both)
        return task, attempt

    def conclude(self, attempt_id: str, attempt_status: AttemptStatus, error: str | None,
                 stack_trace: str | None, task: Task, fence_token: int,
                 changes: Mapping[str, object]) -> Task:
        """Finish the attempt and update the task in one transaction when both succeed.

        If the task update fails (another owner's newer token, a concurrent change), the
        attempt is still finished on its own and the task error is raised; the attempt is
        never lost with it.
        """
        finish, _ = self._attempts.prepare_finish(attempt_id, attempt_status, error,
                                                  stack_trace)
        try:
            update, concluded = self._tasks.prepare_update(task.id, task.version, fence_token,
                                                           changes)

            def both(g: object) -> None:
                finish(g)
                update(g)

            self.graph.write(both)
            return concluded
        except (CommitConflict, StaleFencingToken):
            try:
                self.attempts.finish(attempt_id, attempt_status, error, stack_trace)
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
    "TaskStore", "open_graph", "open_store",
]
