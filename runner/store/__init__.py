"""The graph store: tasks, attempts, ontologies and avatars through gremlinpython.

``open_store(location)`` returns a :class:`GraphStore` over gremlite (a SQLite file path, the
embedded default) or a remote Gremlin Server (``ws://host:8182/gremlin``). Its ``tasks``,
``attempts``, ``ontologies`` and ``avatars`` implement the ports in :mod:`runner.store.ports`.
Errors are in :mod:`runner.errors` (the one catalogue); the store's are re-exported here.
"""

import importlib
from typing import TYPE_CHECKING, Any

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
    StopCause,
    Task,
    TaskState,
    TaskStatus,
)
from runner.store.ports import AttemptLog, AvatarStore, OntologyStore, TaskStore

if TYPE_CHECKING:
    from runner.store.graph import EmbeddedGraph, Graph, open_graph
    from runner.store.gremlin.attempts import GremlinAttemptLog
    from runner.store.gremlin.avatars import GremlinAvatarStore
    from runner.store.gremlin.ontologies import GremlinOntologyStore
    from runner.store.gremlin.store import GraphStore, open_store
    from runner.store.gremlin.tasks import GremlinTaskStore
    from runner.store.gremlin.writes import Conclusion
    from runner.store.remote import RemoteGraph

#: the names whose modules load gremlinpython and the remote driver (aiohttp): imported when
#: first asked for, so that what only needs the model (the reply models, the CLI's ``--help``)
#: does not pay for them
_LAZY = {
    "EmbeddedGraph": "runner.store.graph", "Graph": "runner.store.graph",
    "open_graph": "runner.store.graph",
    "GremlinAttemptLog": "runner.store.gremlin.attempts",
    "GremlinAvatarStore": "runner.store.gremlin.avatars",
    "GremlinOntologyStore": "runner.store.gremlin.ontologies",
    "GraphStore": "runner.store.gremlin.store", "open_store": "runner.store.gremlin.store",
    "GremlinTaskStore": "runner.store.gremlin.tasks",
    "Conclusion": "runner.store.gremlin.writes", "RemoteGraph": "runner.store.remote",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "StopCause", "TaskState",
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
