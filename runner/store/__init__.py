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
    OntologyStore,
    RetentionStore,
    ScheduleStore,
    SearchStore,
    Store,
    TaskClaim,
    TaskStore,
    WorkflowStore,
    location,
)
from runner.store.ends import (
    AttemptClose,
    AttemptEnd,
    Completion,
    Conclusion,
    EndWrite,
    EndWritten,
    FenceOff,
    LastEffect,
    Release,
    attempt_end,
    write_size,
)
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
    NewMember,
    Ontology,
    OntologyClass,
    OntologyRecord,
    Progress,
    Schedule,
    ServerOptions,
    StopCause,
    StoredResult,
    Task,
    TaskFilter,
    TaskPage,
    TaskState,
    TaskStatus,
    Tombstone,
    Workflow,
    WorkflowState,
)
from runner.store.opening import is_server, open_graph, open_store, store_on
from runner.store.traversal import Traversal

__all__ = [
    "Attempt", "AttemptAlreadyFinished", "AttemptClose", "AttemptEnd", "AttemptLog",
    "AttemptStatus", "Avatar", "AvatarStore", "CHECKPOINT_LIMIT", "Checkpoint", "CheckpointInfo",
    "CheckpointStore", "CommitConflict", "Completion", "Conclusion", "EndWrite", "EndWritten",
    "Fence", "FenceOff", "Graph", "GraphNotTransactional", "Incident", "IncidentStore",
    "InvalidValue", "LIST_STATES", "LastEffect", "LoadResult", "Ontology", "OntologyClass",
    "OntologyNotFound", "OntologyRecord", "OntologyStore", "Progress", "Release", "ResourceTaken",
    "RetentionStore", "Schedule", "ScheduleStore", "SearchStore", "ServerOptions",
    "StaleFencingToken", "StopCause", "Store", "StoredResult", "StoreError", "StoreSchemaUnknown",
    "StoreUnavailable", "Task", "TaskArchived", "TaskClaim", "TaskFilter", "TaskNotFound",
    "TaskPage", "TaskState", "TaskStatus", "TaskStore", "Tombstone", "Traversal",
    "NewMember", "Workflow", "WorkflowState", "WorkflowStore",
    "UnknownStoreFormat", "attempt_end", "is_server", "location", "open_graph", "open_store",
    "store_on", "write_size",
]
