"""The graph store: tasks, attempts, ontologies and avatars through gremlinpython.

``open_store(location)`` returns a :class:`GraphStore` over gremlite (a SQLite file path, the
embedded default) or a remote Gremlin Server (``ws://host:8182/gremlin``). Its ``tasks``,
``attempts``, ``ontologies`` and ``avatars`` implement the ports in :mod:`runner.store.ports`.
Errors are in :mod:`runner.errors` (the one catalogue); the store's are re-exported here.
"""

from runner.errors import (
    AttemptAlreadyFinished,
    CommitConflict,
    GraphNotTransactional,
    InvalidValue,
    OntologyNotFound,
    ResourceTaken,
    StaleFencingToken,
    StoreError,
    StoreUnavailable,
    TaskArchived,
    TaskNotFound,
    UnknownStoreFormat,
)
from runner.store.graph import EmbeddedGraph, Graph, open_graph
from runner.store.gremlin.attempts import GremlinAttemptLog
from runner.store.gremlin.avatars import GremlinAvatarStore
from runner.store.gremlin.ontologies import GremlinOntologyStore
from runner.store.gremlin.store import GraphStore, open_store
from runner.store.gremlin.tasks import GremlinTaskStore
from runner.store.gremlin.writes import Conclusion
from runner.store.model import (
    CHECKPOINT_LIMIT,
    Attempt,
    AttemptStatus,
    Avatar,
    CheckpointInfo,
    Fence,
    LoadResult,
    Ontology,
    OntologyClass,
    OntologyRecord,
    Progress,
    Task,
    TaskStatus,
)
from runner.store.ports import AttemptLog, AvatarStore, OntologyStore, TaskStore
from runner.store.remote import RemoteGraph

__all__ = [
    "CHECKPOINT_LIMIT", "CheckpointInfo",
    "Attempt", "AttemptAlreadyFinished", "AttemptLog", "AttemptStatus", "Avatar", "AvatarStore",
    "CommitConflict", "Conclusion", "EmbeddedGraph", "Fence", "Graph", "GraphStore",
    "GremlinAttemptLog",
    "GremlinAvatarStore", "GremlinOntologyStore", "GremlinTaskStore", "InvalidValue",
    "LoadResult", "Ontology", "OntologyClass", "OntologyNotFound", "OntologyRecord",
    "OntologyStore", "Progress", "RemoteGraph", "ResourceTaken",
    "GraphNotTransactional", "StaleFencingToken", "StoreError", "StoreUnavailable", "Task",
    "TaskArchived", "TaskNotFound", "TaskStatus",
    "TaskStore", "UnknownStoreFormat", "open_graph", "open_store",
]
