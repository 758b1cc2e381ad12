"""The graph store as the runner sees it: one typed port (:mod:`runner.store.api`) and the
values it answers (:mod:`runner.store.model`); nothing here names a driver.

``open_store(location)`` returns a :class:`Store` over gremlite (a SQLite file path, the
embedded default: :mod:`runner.store.embedded`) or a remote Gremlin Server
(``ws://host:8182/gremlin``: :mod:`runner.store.server`). Errors are in :mod:`runner.errors`
(the one catalogue); the store's are re-exported here.
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
    StoreSchemaUnknown,
    StoreUnavailable,
    TaskArchived,
    TaskNotFound,
    UnknownStoreFormat,
)
from runner.store.api import (
    AttemptLog,
    AvatarStore,
    CheckpointStore,
    Graph,
    IncidentStore,
    LastEffect,
    OntologyStore,
    RetentionStore,
    ScheduleStore,
    SearchStore,
    Store,
    TaskClaim,
    TaskStore,
    Traversal,
    location,
)
from runner.store.ends import AttemptEnd, Conclusion
from runner.store.model import (
    CHECKPOINT_LIMIT,
    LIST_STATES,
    Attempt,
    AttemptStatus,
    Avatar,
    Checkpoint,
    CheckpointInfo,
    Fence,
    Incident,
    LoadResult,
    Ontology,
    OntologyClass,
    OntologyRecord,
    Progress,
    Schedule,
    ServerOptions,
    StopCause,
    Task,
    TaskFilter,
    TaskPage,
    TaskState,
    TaskStatus,
    Tombstone,
)
from runner.store.opening import is_server, open_graph, open_store, store_on

__all__ = [
    "CHECKPOINT_LIMIT", "LIST_STATES", "Attempt", "AttemptAlreadyFinished", "AttemptEnd",
    "AttemptLog", "AttemptStatus", "Avatar", "AvatarStore", "Checkpoint", "CheckpointInfo",
    "CheckpointStore", "TaskClaim", "CommitConflict", "Conclusion", "LastEffect", "Fence", "Graph",
    "GraphNotTransactional", "Incident", "IncidentStore", "InvalidValue", "LoadResult",
    "Ontology", "OntologyClass", "OntologyNotFound", "OntologyRecord", "OntologyStore",
    "Progress", "ResourceTaken", "RetentionStore", "Schedule", "ScheduleStore", "ServerOptions",
    "StaleFencingToken", "StopCause", "Store", "StoreError", "StoreSchemaUnknown",
    "StoreUnavailable", "Task", "TaskArchived", "TaskFilter", "TaskNotFound", "TaskPage",
    "SearchStore", "TaskState", "TaskStatus", "TaskStore", "Tombstone", "Traversal",
    "UnknownStoreFormat", "is_server", "location", "open_graph", "open_store", "store_on",
]
