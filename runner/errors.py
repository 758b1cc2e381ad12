"""The runner's one error catalogue: every error it raises on purpose, its stable code, and
what it means for the caller.

Why one module: the catalogue is one thing to read and to keep stable (httpx's and dramatiq's
exception modules are the model); the modules that raise these errors import them from here,
and the packages re-export the ones their callers catch (``runner.store``, ``runner.tasks``,
``runner.client``).

Every error derives from :class:`RunnerError` and declares:

* ``error_code``: a short snake_case string that is part of the API (a reply's
  ``error.code``, a client's ``except``), so renaming or moving a class never changes what a
  client sees. A code is declared once; declaring it twice fails at import.
* ``refused``: True when the error means *the caller asked wrongly* (an unknown type, a payload
  or value that does not validate, a name taken): an API reply carries it
  (``error.refused``), a client raises :class:`RequestRefused` for it, and the CLI exits 2.
  Every other error is a failure: the client raises :class:`RequestFailed`, the CLI exits 1
  with the error's message.

The tree (``tests/test_layout.py`` checks that it equals the classes and codes below)::

    RunnerError                     runner_error
    ├── ConfigError                 config_invalid            refused
    │   └── ExtraMissing            extra_missing             refused
    ├── TaskLoadError               task_module_invalid
    │   └── HookLoadError           incident_hook_invalid
    ├── TaskError                   task_error
    │   ├── UnknownTaskType         task_type_unknown         refused
    │   ├── InvalidPayload          payload_invalid           refused
    │   ├── HandlerCrashed          handler_crashed
    │   ├── ResultInvalid           result_invalid
    │   └── WorkflowRefused         workflow_refused          refused
    ├── InvalidSchedule             schedule_invalid          refused
    ├── UnknownStream               stream_unknown
    ├── StreamElementTooLarge       stream_element_too_large  refused
    ├── StreamIndexExpired          stream_index_expired
    ├── WebQueryInvalid             web_query_invalid         refused
    ├── StoreError                  store_error
    │   ├── StoreUnavailable        store_unavailable
    │   │   └── StoreFull           store_full
    │   ├── GraphNotTransactional   graph_not_transactional
    │   ├── TaskNotFound            task_not_found
    │   │   └── TaskArchived        task_archived
    │   ├── OntologyNotFound        ontology_not_found
    │   ├── ScheduleNotFound        schedule_not_found
    │   ├── ScheduleExists          schedule_exists           refused
    │   ├── CommitConflict          commit_conflict
    │   ├── WriteRaceLost           write_race_lost
    │   ├── StaleFencingToken       stale_fencing_token
    │   ├── ResourceTaken           resource_taken
    │   ├── AttemptAlreadyFinished  attempt_already_finished
    │   ├── TaskFinished            task_finished
    │   ├── InvalidValue            invalid_value             refused
    │   ├── UnknownStoreFormat      unknown_store_format
    │   │   ├── StoreFormatOutdated  store_format_outdated
    │   │   └── StoreFormatTooNew    store_format_too_new
    │   ├── StoreSchemaUnknown      store_schema_unknown
    │   └── MigrationRefused        migration_refused
    ├── OntologyError               ontology_invalid
    ├── SourceError                 ontology_source_failed
    │   └── NoOntologySource        ontology_source_missing
    ├── AspectError                 aspect_error
    │   ├── UnknownAspect           aspect_unknown            refused
    │   ├── InvalidAspect           aspect_invalid            refused
    │   └── AspectBusy              aspect_busy
    ├── InvalidAvatars              avatars_invalid
    ├── PipelineError               pipeline_failed
    ├── ClientError                 client_error
    │   ├── RequestFailed           request_failed
    │   │   ├── RequestRefused      request_refused           refused
    │   │   │   └── CommandRefused  command_refused           refused
    │   │   └── CommandFailed       command_failed
    │   ├── NoAnswer                no_answer
    │   ├── BrokerUnreachable       broker_unreachable
    │   ├── ResultPending           result_pending
    │   └── TaskStopped             task_stopped
    └── SmokeCheckFailed            smoke_check_failed

Control flow is not an error and stays outside the tree: a handler's
:class:`~runner.tasks.context.TaskCancelled` (the attempt ends CANCELLED_BY_SYSTEM), its
subclass :class:`~runner.tasks.context.TaskTimedOut` (past a time limit: TIMED_OUT) and
:class:`~runner.tasks.context.TaskConflict` (the attempt is retried after a backoff) and
:class:`~runner.tasks.context.TaskDeclined` (another node runs the task).

An API reply for an exception outside the tree (a bug) carries ``internal_error``; a request
the node's messaging layer refused carries the dead-letter reason as its code (``invalid``,
``unknown-command``, ``too-large``) and ``refused``. Of the store's errors,
:class:`CommitConflict` is the retryable one; :class:`StaleFencingToken` must never be retried:
another owner holds the task now.
"""

from __future__ import annotations

from typing import ClassVar

from messaging.errors import INTERNAL_ERROR

#: every declared code and the class that declared it
ERROR_CODES: dict[str, type[RunnerError]] = {}


class RunnerError(Exception):
    """Root of every error the runner raises on purpose."""

    error_code: ClassVar[str] = "runner_error"
    #: the caller asked wrongly (see the module); declared by each class that means it
    refused: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        code = cls.__dict__.get("error_code")
        if not isinstance(code, str):
            raise TypeError(f"{cls.__qualname__} must declare its own error_code")
        other = ERROR_CODES.get(code)
        if other is not None and (other.__module__, other.__qualname__) != (
                cls.__module__, cls.__qualname__):
            raise TypeError(f"error code {code!r} of {cls.__qualname__} is already "
                            f"{other.__qualname__}'s")
        ERROR_CODES[code] = cls


ERROR_CODES[RunnerError.error_code] = RunnerError


def error_code(exc: BaseException) -> str:
    """The stable code of ``exc`` for an API reply."""
    code = getattr(exc, "error_code", None)
    return code if isinstance(code, str) else INTERNAL_ERROR


# -- configuration and loading -------------------------------------------------------------------


class ConfigError(RunnerError, ValueError):
    """The configuration file or environment holds something latchwork cannot use."""

    error_code = "config_invalid"
    refused = True


class ExtraMissing(ConfigError):
    """What was asked needs an extra that is not installed (``latchwork[pipeline]``): the
    message names it and the command that installs it. Refused: the install must change."""

    error_code = "extra_missing"


class TaskLoadError(RunnerError):
    """A task module or entry point could not be loaded into the registry."""

    error_code = "task_module_invalid"


class HookLoadError(TaskLoadError):
    """An ``incident_hooks`` entry that does not name a callable."""

    error_code = "incident_hook_invalid"

# -- task types, schedules, streams --------------------------------------------------------------


class TaskError(RunnerError):
    """Root of the task-definition errors."""

    error_code = "task_error"


class UnknownTaskType(TaskError, LookupError):
    """No handler is registered for this task type."""

    error_code = "task_type_unknown"
    refused = True


class InvalidPayload(TaskError, ValueError):
    """The payload does not validate against the task type's model."""

    error_code = "payload_invalid"
    refused = True


class HandlerCrashed(TaskError):
    """A process-isolated handler's process died: killed by a signal, exited, or killed by its
    node for using more memory than its type's ``max_memory_mb``; its attempt ends FAILED with
    it (:mod:`runner.tasks.worker.isolated`)."""

    error_code = "handler_crashed"


class ResultInvalid(TaskError, ValueError):
    """A handler's return value cannot be its task's result: not JSON, not the type its
    return annotation names, or over :data:`~runner.tasks.results.RESULT_LIMIT` bytes of JSON.
    Its attempt ends FAILED with it (:mod:`runner.tasks.results`)."""

    error_code = "result_invalid"


class WorkflowRefused(TaskError, ValueError):
    """A workflow's submit cannot be taken: its key names another workflow, or a member's
    ``unique_key`` is held by a task outside it (named); nothing of it is claimable."""

    error_code = "workflow_refused"
    refused = True


class InvalidSchedule(RunnerError, ValueError):
    """A schedule that cannot fire: a bad cron expression, interval or task spec."""

    error_code = "schedule_invalid"
    refused = True


class UnknownStream(RunnerError, LookupError):
    """No stream of this name is defined on the node."""

    error_code = "stream_unknown"

class StreamElementTooLarge(RunnerError, ValueError):
    """A value pushed to a stream's queue is over the element limit (ZooKeeper's node size,
    less its envelope); or the values of one push are together over it."""

    error_code = "stream_element_too_large"
    refused = True

class StreamIndexExpired(RunnerError, LookupError):
    """A read of a queue from an index that its retention pruned already."""

    error_code = "stream_index_expired"

class WebQueryInvalid(RunnerError, ValueError):
    """The web console's query box holds a term it does not know (``colour:red``)."""

    error_code = "web_query_invalid"
    refused = True

# -- the graph store -----------------------------------------------------------------------------


class StoreError(RunnerError):
    """Root of every error raised by runner.store."""

    error_code = "store_error"


class StoreUnavailable(StoreError):
    """The graph backend could not be reached, or stayed locked past the deadline."""

    error_code = "store_unavailable"


class StoreFull(StoreUnavailable):
    """The embedded graph's file cannot be written: its disk is full, or the file or volume
    is read-only or failing. Writes are refused (a submit answers ``store_full``; work
    already accepted waits and retries) until space is freed. Each node's graph reports it in
    one warning line a minute (``reported``: the lines that would repeat it per write leave it
    out, :class:`runner.logs.ReportedElsewhere`)."""

    error_code = "store_full"
    #: the graph's storage alarm logs it once a minute: other log lines need not
    reported: ClassVar[bool] = True


class GraphNotTransactional(StoreError):
    """A remote graph without transactions, and no one accepted the risk."""

    error_code = "graph_not_transactional"


class TaskNotFound(StoreError, LookupError):
    """No task or attempt with this id."""

    error_code = "task_not_found"


class TaskArchived(TaskNotFound):
    """The task left the graph by retention: the message says where it went."""

    error_code = "task_archived"


class OntologyNotFound(StoreError, LookupError):
    """No ontology with this IRI is loaded."""

    error_code = "ontology_not_found"


class ScheduleNotFound(StoreError, LookupError):
    """No schedule has this name."""

    error_code = "schedule_not_found"


class ScheduleExists(StoreError, ValueError):
    """A schedule with this name exists already (remove it first)."""

    error_code = "schedule_exists"
    refused = True


class CommitConflict(StoreError):
    """A conditional update met another version than the one it expected."""

    error_code = "commit_conflict"

    def __init__(self, task_id: str, expected: int, actual: int | None) -> None:
        super().__init__(f"task {task_id}: expected version {expected}, found {actual}")
        self.task_id = task_id
        self.expected = expected
        self.actual = actual


class WriteRaceLost(StoreError):
    """A remote server refused to commit a write because a concurrent transaction held or
    changed what it guards (JanusGraph's locking exceptions): as if its guards matched
    nothing, the caller reads again."""

    error_code = "write_race_lost"


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


class TaskFinished(StoreError):
    """An action that needs an unfinished task on one that succeeded or was skipped (a
    reactivate, cancel, deactivate or skip): nothing is changed, its checkpoint is kept. A
    task succeeds once; to run its work again, submit a new task."""

    error_code = "task_finished"


class InvalidValue(StoreError, ValueError):
    """A value that cannot be stored as given."""

    error_code = "invalid_value"
    refused = True


class UnknownStoreFormat(StoreError):
    """A task or attempt vertex without the properties this version writes (a graph from an
    older, unreleased format): recreate the graph, nothing is guessed."""

    error_code = "unknown_store_format"


class StoreFormatOutdated(UnknownStoreFormat):
    """The graph is at an older store format than this latchwork writes: run ``latchwork store
    migrate`` (with the nodes stopped); nothing is read or written before."""

    error_code = "store_format_outdated"


class StoreFormatTooNew(UnknownStoreFormat):
    """The graph is at a newer store format than this latchwork knows (a downgrade): run a
    latchwork that knows that format."""

    error_code = "store_format_too_new"


class StoreSchemaUnknown(StoreError):
    """The embedded graph's driver does not know what it would write into: a gremlite or
    gremlinpython version it was not tested with, or a SQLite schema (tables, columns,
    indexes) other than the one its SQL relies on. Nothing was written; install the versions
    latchwork pins (docs/graph.md, "What the embedded driver relies on")."""

    error_code = "store_schema_unknown"


class MigrationRefused(StoreError):
    """``latchwork store migrate`` will not run now: members of the graph's cluster are live
    (or their liveness cannot be read); stop the nodes, or pass ``--force``."""

    error_code = "migration_refused"

# -- the domain: ontologies, aspects, avatars, the pipeline --------------------------------------


class OntologyError(RunnerError, ValueError):
    """The file is not a readable ontology; the message says why."""

    error_code = "ontology_invalid"


class SourceError(RunnerError):
    """The ontology source cannot be read (missing directory, HTTP error)."""

    error_code = "ontology_source_failed"


class NoOntologySource(SourceError):
    """No ontology source is configured (the ``ontology_source`` setting)."""

    error_code = "ontology_source_missing"


class AspectError(RunnerError):
    """Root of the aspect errors."""

    error_code = "aspect_error"


class UnknownAspect(AspectError, LookupError):
    """No definition with this name."""

    error_code = "aspect_unknown"
    refused = True


class InvalidAspect(AspectError, ValueError):
    """A definition in the configuration is malformed."""

    error_code = "aspect_invalid"
    refused = True


class AspectBusy(AspectError):
    """The aspect is being created or deleted; the other operation has to wait."""

    error_code = "aspect_busy"


class InvalidAvatars(RunnerError, ValueError):
    """The Parquet file is not an avatar file, or one of its rows is malformed."""

    error_code = "avatars_invalid"


class PipelineError(RunnerError, RuntimeError):
    """The pipeline's storage did something it must not (e.g. a rename that did not happen)."""

    error_code = "pipeline_failed"

# -- the client ----------------------------------------------------------------------------------


class ClientError(RunnerError):
    """Root of the client's errors; ``code`` is stable (see :mod:`runner.errors`)."""

    error_code = "client_error"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code or self.error_code


class RequestFailed(ClientError):
    """The node answered with an error; ``code`` is the node's, ``detail`` its message."""

    error_code = "request_failed"

    def __init__(self, command: str, code: str, detail: str) -> None:
        super().__init__(detail, code)
        self.command = command
        self.detail = detail
        #: a bulk submit refused part-way: the ids of the tasks its pages before created
        self.done: list[str] = []


class RequestRefused(RequestFailed):
    """The request was invalid: an unknown type, a payload that does not validate, ..."""

    error_code = "request_refused"
    refused = True


class CommandFailed(RequestFailed):
    """A MASTER command's handler failed (out of retries: ``code`` ``retries-exhausted``; its
    answer could not be carried: ``answer-invalid``; it committed its transaction and ended
    before recording an answer: ``answer-lost``); ``detail`` is the handler's message."""

    error_code = "command_failed"


class CommandRefused(RequestRefused):
    """The master refused a command (dead-lettered): ``code`` is the reason, ``invalid`` (the
    payload does not validate), ``unknown-command``, ``too-large``, ``undecodable`` or
    ``rejected`` (the handler raised Reject)."""

    error_code = "command_refused"


class NoAnswer(ClientError):
    """No node answered within the timeout."""

    error_code = "no_answer"


class BrokerUnreachable(ClientError):
    """RabbitMQ could not be reached."""

    error_code = "broker_unreachable"


class ResultPending(ClientError):
    """``Client.result``: the task has not ended (yet, or within the time it was given)."""

    error_code = "result_pending"


class TaskStopped(ClientError):
    """``Client.result``: the task stopped without a result (failed, cancelled or skipped);
    ``state`` says which and ``error`` carries its last attempt's error."""

    error_code = "task_stopped"

    def __init__(self, message: str, *, task_id: str = "", state: str = "",
                 error: str | None = None) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.state = state
        self.error = error

# -- the dev servers -----------------------------------------------------------------------------


class SmokeCheckFailed(RunnerError, RuntimeError):
    """A server did not complete its round trip."""

    error_code = "smoke_check_failed"
