"""The graph store: tasks, attempts, ontologies and avatars through gremlinpython.

``open_store(location)`` returns a :class:`GraphStore` over gremlite (a SQLite file path, the
embedded default) or a remote Gremlin Server (``ws://host:8182/gremlin``). Its ``tasks``,
``attempts``, ``ontologies`` and ``avatars`` implement the ports in :mod:`runner.store.ports`.
Errors are in :mod:`runner.store.errors`.
"""

from __future__ import annotations

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
        self.tasks: TaskStore = GremlinTaskStore(graph)
        self.attempts: AttemptLog = GremlinAttemptLog(graph)
        self.ontologies: OntologyStore = GremlinOntologyStore(graph)
        self.avatars: AvatarStore = GremlinAvatarStore(graph)

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
