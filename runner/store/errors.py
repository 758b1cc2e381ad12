"""runner.store's exceptions, one root, split by cause::

    StoreError
    ├── StoreUnavailable       the graph could not be reached (or stayed busy) until the deadline
    ├── TaskNotFound           no task (or attempt) with this id
    ├── CommitConflict         the task changed since it was read (version); retry with backoff
    ├── StaleFencingToken      the writer's lock token is not the task's: it lost the lock, or
    │                          its attempt was closed by someone else (master, operator)
    ├── AttemptAlreadyFinished the attempt was already closed (by its owner or the reaper)
    ├── InvalidValue           a value the store cannot encode (e.g. a bad aspect name)
    └── UnknownStoreFormat     a task or attempt vertex written in a format this version cannot read

``CommitConflict`` is the retryable one; ``StaleFencingToken`` must never be retried: it means
another owner holds the task now.
"""

from __future__ import annotations

from runner.errors import RunnerError


class StoreError(RunnerError):
    """Root of every error raised by runner.store."""

    error_code = "store_error"


class StoreUnavailable(StoreError):
    """The graph backend could not be reached, or stayed locked past the deadline."""

    error_code = "store_unavailable"


class GraphNotTransactional(StoreError):
    """A remote graph without transactions, and no one accepted the risk."""

    error_code = "graph_not_transactional"


class TaskNotFound(StoreError, LookupError):
    """No task or attempt with this id."""

    error_code = "task_not_found"


class OntologyNotFound(StoreError, LookupError):
    """No ontology with this IRI is loaded."""

    error_code = "ontology_not_found"


class CommitConflict(StoreError):
    """A conditional update met another version than the one it expected."""

    error_code = "commit_conflict"

    def __init__(self, task_id: str, expected: int, actual: int | None) -> None:
        super().__init__(f"task {task_id}: expected version {expected}, found {actual}")
        self.task_id = task_id
        self.expected = expected
        self.actual = actual


class StaleFencingToken(StoreError):
    """A write carried a fencing token older than the one recorded on the task."""

    error_code = "stale_fencing_token"

    def __init__(self, task_id: str, token: int, recorded: int | None = None) -> None:
        than = "the task's" if recorded is None or recorded < 0 else str(recorded)
        super().__init__(f"task {task_id}: fencing token {token} is not {than}; another owner "
                         f"took the task, or its attempt was closed by someone else")
        self.task_id = task_id
        self.token = token
        self.recorded = recorded


class ResourceTaken(StoreError):
    """An owner's write that needs its task's resources was refused: another task's attempt
    claimed one of them since this attempt did (its holder lost its ZooKeeper hold: a freeze
    or a partition past its session). Nothing was written."""

    error_code = "resource_taken"

    def __init__(self, task_id: str, attempt_id: str, resource: str) -> None:
        super().__init__(f"task {task_id}: resource {resource!r} was claimed by another "
                         f"attempt after attempt {attempt_id} took it; its holder lost it")
        self.task_id = task_id
        self.attempt_id = attempt_id
        self.resource = resource


class AttemptAlreadyFinished(StoreError):
    """finish() on an attempt that is no longer RUNNING."""

    error_code = "attempt_already_finished"


class InvalidValue(StoreError, ValueError):
    """A value that cannot be stored as given."""

    error_code = "invalid_value"


class TaskArchived(TaskNotFound):
    """The task left the graph by retention: the message says where it went."""

    error_code = "task_archived"


class ScheduleNotFound(StoreError, LookupError):
    """No schedule has this name."""

    error_code = "schedule_not_found"


class ScheduleExists(StoreError, ValueError):
    """A schedule with this name exists already (remove it first)."""

    error_code = "schedule_exists"


class UnknownStoreFormat(StoreError):
    """A task or attempt vertex without the properties this version writes (a graph from an
    older, unreleased format): recreate the graph, nothing is guessed."""

    error_code = "unknown_store_format"
