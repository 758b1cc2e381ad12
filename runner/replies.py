"""The API's replies: one model (or list of models) per command of the contract, the half of it
:mod:`runner.requests` does not say. Each request names its reply (``class TaskGet(
Request[TaskReport])``); the node's handlers return these models and the node sends them as
JSON; :meth:`runner.client.Client.send` reads the JSON back into the same model. So a field is
spelled once, here, for the node, the client, the CLI's ``--json`` and the web console.

Models ignore fields they do not know, so a newer node still answers an older client. A JSON
value the API passes through untouched (a payload, a stream's state) is :data:`JsonValue`.
Pure models; nothing here does I/O.

Why one module: the replies are read as one thing (what each command answers), and a test
checks every request's reply against its handler's return type; split, no one place would say
it.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, JsonValue, SerializationInfo, model_serializer

from runner.store import Attempt, OntologyRecord, Progress, Task, codec
from runner.templates import JsonObject, ScheduleSpec

__all__ = ["JsonObject", "JsonValue"]


class View(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


# -- tasks and attempts -----------------------------------------------------------------------


class TaskRef(View):
    """What a submission returns: enough to follow the task."""
    id: str
    type: str


class ProgressView(View):
    done: int
    total: int | None = None
    message: str = ""
    at: datetime

    @classmethod
    def of(cls, progress: Progress | None) -> ProgressView | None:
        if progress is None:
            return None
        return cls(done=progress.done, total=progress.total, message=progress.message,
                   at=progress.at)


class CheckpointView(View):
    """What a task shows of its last checkpoint (``ctx.checkpoint``): not the state itself."""
    at: datetime
    size: int  # bytes of JSON
    seq: int  # the attempt that committed it


class HeartbeatView(View):
    at: datetime
    details: JsonValue = None


class CheckpointValue(View):
    """A task's last checkpoint with its value (``task show ID --checkpoint``): ``present``
    False when it has none. The value is whole: a checkpoint is at most ``CHECKPOINT_LIMIT``
    (64 KiB of JSON) when written, so the answer stays under the message limit; consoles show
    the first :data:`SHOWN` bytes of it and say when they cut."""
    task_id: str
    present: bool
    at: datetime | None = None
    size: int = 0  # bytes of JSON
    seq: int | None = None  # the attempt that committed it
    value: JsonValue = None


#: how much of a checkpoint's JSON the CLI and the web console show (the rest: ``--json``)
SHOWN = 16 * 1024


class TaskView(TaskRef):
    payload: JsonObject
    active: bool
    status: str  # WAITING or RUNNING
    finished: bool
    priority: int
    created_at: datetime
    updated_at: datetime
    version: int
    fence: int
    unique_key: str | None = None
    owner: str | None = None
    attempts: int  # how many were started
    progress: ProgressView | None = None  # of its running attempt (task.list, task.search)
    run_at: datetime | None = None  # not started before (delayed, scheduled, retry backoff)
    ordering_key: str | None = None
    resources: list[str] = []
    skipped: bool = False  # finished by `task skip`, without a run
    stop_reason: str | None = None  # why it was stopped unrun (a paused schedule's fire)
    checkpoint: CheckpointView | None = None  # where its next attempt resumes
    timeout: float | None = None  # its own time limit (its type's caps it)
    #: its one state (docs/runner.md, "A task's state"): waiting, delayed, running, succeeded,
    #: failed, cancelled or skipped; the fields it comes from stay above
    state: str = ""
    workflow: str | None = None  # the workflow it is a member of

    @classmethod
    def fields_of(cls, task: Task, progress: Progress | None = None) -> dict[str, object]:
        checkpoint = task.checkpoint
        return {
            "id": task.id, "type": task.type, "payload": task.payload, "active": task.active,
            "status": task.status.value, "finished": task.finished, "priority": task.priority,
            "created_at": task.created_at, "updated_at": task.updated_at,
            "version": task.version, "fence": task.fence, "unique_key": task.unique_key,
            "owner": task.owner, "attempts": task.attempts, "run_at": task.run_at,
            "ordering_key": task.ordering_key, "resources": list(task.resources),
            "skipped": task.skipped, "stop_reason": task.stop_reason, "timeout": task.timeout,
            "progress": ProgressView.of(progress), "state": task.state(codec.now()).value,
            "workflow": task.workflow,
            "checkpoint": None if checkpoint is None else CheckpointView(
                at=checkpoint.at, size=checkpoint.size, seq=checkpoint.seq)}

    @classmethod
    def of(cls, task: Task, progress: Progress | None = None) -> TaskView:
        """``task`` as the API shows it; ``progress``: its running attempt's. Built from the
        store's own values without validating them again (a node answers a list of up to 200
        of them); the client validates what it reads."""
        return cls.model_construct(None, **cls.fields_of(task, progress))

    @property
    def stopped(self) -> bool:
        """Deactivated before it finished (a failure, an operator): it waits for reactivation."""
        return not self.active and not self.finished


class Acted(TaskView):
    """A task an operator's action (cancel, deactivate, reactivate, skip) was asked of: as it
    is now, the state it was in before (``was``), and whether the action changed it
    (``changed``: False for a reactivate of a waiting task, a cancel of a failed one)."""
    was: str = ""
    changed: bool = True

    @classmethod
    def of_action(cls, before: Task, after: Task) -> Acted:
        return cls.model_construct(None, **cls.fields_of(after), **acted(before, after))


def acted(before: Task, after: Task) -> dict[str, object]:
    """What an action did, from the task before and after it: a write moves the version."""
    return {"was": before.state(codec.now()).value, "changed": after.version != before.version}


class Cancelled(Acted):
    """A cancelled or deactivated task, and the attempts the cancel stopped."""
    cancelled_attempts: list[str] = []

    @classmethod
    def of_cancel(cls, before: Task, task: Task, stopped: list[Attempt]) -> Cancelled:
        return cls.model_construct(None, **cls.fields_of(task), **acted(before, task),
                                   cancelled_attempts=[a.id for a in stopped])


class AttemptView(View):
    id: str
    seq: int
    status: str  # RUNNING, SUCCEEDED, FAILED, CANCELLED_BY_SYSTEM, CANCELLED, TIMED_OUT
    executor: str
    started_at: datetime
    ended_at: datetime | None = None
    duration_ms: int | None = None
    error: str | None = None
    stack_trace: str | None = None
    fence: int
    progress: ProgressView | None = None
    heartbeat: HeartbeatView | None = None  # its last details written (ctx.heartbeat)

    @classmethod
    def fields_of(cls, attempt: Attempt) -> dict[str, object]:
        beat = attempt.heartbeat
        return {
            "id": attempt.id, "seq": attempt.seq, "status": attempt.status.value,
            "executor": attempt.executor, "started_at": attempt.started_at,
            "ended_at": attempt.ended_at, "duration_ms": attempt.duration_ms,
            "error": attempt.error, "stack_trace": attempt.stack_trace, "fence": attempt.fence,
            "progress": ProgressView.of(attempt.progress),
            "heartbeat": None if beat is None else HeartbeatView(at=beat.at,
                                                                 details=beat.details)}

    @classmethod
    def of(cls, attempt: Attempt) -> AttemptView:
        return cls.model_construct(None, **cls.fields_of(attempt))


class RecentAttempt(AttemptView):
    """An attempt that ended, with its task's id and type (``attempt.recent``)."""
    task: str
    type: str


class SeriesProgress(View):
    """Batches done and total, rows and rows/s of a pipeline task's batch series."""
    series: str
    state: str
    batches_done: int
    batches_total: int | None = None
    rows_total: int | None = None
    rows_done: int
    rows_per_s: float
    retries: int
    failure: list[str] = []


class ResultValue(View):
    """What a task's handler returned, as its SUCCEEDED attempt holds it (``task result``,
    ``task show``): ``present`` False when there is none (it has not succeeded, it returned
    None, it was skipped); the value is whole (at most 64 KiB of JSON:
    :mod:`runner.tasks.results`)."""
    task_id: str
    #: the task's state (``task show``'s): what a caller waiting for the result decides by
    state: str
    present: bool = False
    attempt_id: str | None = None
    size: int = 0  # bytes of JSON
    value: JsonValue = None
    #: its last attempt's error, when it stopped (failed or cancelled)
    error: str | None = None


class WorkflowView(View):
    """A workflow (``workflow.submit``'s answer, ``workflow show``'s head): its id, its
    submit's key, its state (open: being submitted, nothing claimable; running; succeeded),
    how many members, and whether its roots were all made claimable."""
    id: str
    key: str
    state: str
    members: int
    created_at: datetime
    activated: bool = False


class WorkflowMemberView(View):
    """A workflow member as ``workflow show`` lists it."""
    id: str
    type: str
    #: its task's state, or ``blocked``: waiting for a dependency that stopped (failed or
    #: cancelled), directly or through another member
    state: str
    attempts: int
    depends_on: list[str] = []
    #: the last attempt's error (its own when it stopped; the stopped dependency's when
    #: blocked)
    error: str | None = None
    pending: int = 0  # dependencies that have not succeeded
    #: an entry for a group's members past 50 (state ``group``): how many, by state; ``id`` is
    #: the first's, and what depends on any of them names that one
    count: int = 1
    counts: dict[str, int] = {}


class WorkflowReport(View):
    """A workflow with its members, each after what it depends on (the first
    :data:`~runner.requests.REPORT_MEMBERS` entries, a group's members past 50 as one entry;
    ``counts`` has every member's state)."""
    workflow: WorkflowView
    members: list[WorkflowMemberView]
    counts: dict[str, int]
    more: int = 0  # members not listed


class WorkflowCancelled(View):
    """The members a workflow's cancel stopped (the unfinished ones; what succeeded stays)."""
    id: str
    cancelled: list[str]


class TaskReport(View):
    """A task with every attempt, newest last, its progress when it reports one, and its
    result once it succeeded with one."""
    task: TaskView
    attempts: list[AttemptView]
    progress: SeriesProgress | None = None
    result: ResultValue | None = None

    @property
    def done(self) -> bool:
        """Finished, or stopped (it will not run again unless reactivated)."""
        return self.task.finished or self.task.stopped

    @property
    def succeeded(self) -> bool:
        return self.task.finished and bool(self.attempts) \
            and self.attempts[-1].status == "SUCCEEDED"


class Submitted(View):
    """A bulk submit's page: its tasks' ids, in order."""
    ids: list[str]


class SearchPage(View):
    """A page of ``task.search``, and the cursor of the next (older) page (None: the last)."""
    tasks: list[TaskView]
    next: str | None = None


class RetryView(View):
    max_attempts: int
    backoff: float
    multiplier: float
    max_backoff: float
    jitter: float
    retry_on: list[str]


class TaskTypeView(View):
    """A task type as ``latchwork task types`` shows it."""
    name: str
    description: str
    priority: int
    slots: int | None = None
    resources: list[str] = []
    retry: RetryView | None = None
    max_duration: float | None = None
    max_wait: float | None = None
    timeout: float | None = None
    grace: float | None = None
    heartbeat_timeout: float | None = None
    heartbeat_persist: float | None = None
    isolation: str = "thread"  # or "process"
    max_tasks_per_child: int | None = None  # process isolation only
    max_memory_mb: float | None = None  # process isolation only
    result: str = "any JSON"  # what its handler returns (its return annotation)
    payload_schema: JsonObject | None = None  # None: any JSON object


# -- schedules ------------------------------------------------------------------------------


class ScheduleView(ScheduleSpec):
    """A schedule: its spec, paused, its last and next fire."""
    model_config = ConfigDict(extra="ignore", frozen=True)
    name: str
    paused: bool = False
    created_at: datetime
    last_fire: datetime | None = None
    next_fire: datetime | None = None


class ScheduleRemoved(View):
    name: str
    removed: bool


# -- streams, aspects, ontologies -------------------------------------------------------------


class StreamStarted(View):
    stream: str
    copies: list[str]  # the copy tasks' ids


class StreamState(View):
    """A stream handler's state (phase, input positions, output end) and its running copies
    (member -> copy number)."""
    stream: str
    version: int
    state: JsonValue = None
    copies: dict[str, int] = {}


class StreamInfo(StreamState):
    """A stream a node declares, with its state."""
    inputs: list[str]
    output: str | None = None
    description: str = ""


class AspectTask(View):
    id: str
    type: str
    status: str
    finished: bool
    active: bool


class AspectView(View):
    """An aspect: its state, definition, task and progress."""
    name: str
    state: str
    generation: int
    task_id: str | None = None
    updated_at: float
    error: str | None = None
    kind: str
    classes: list[str]
    description: str = ""
    progress: SeriesProgress | None = None
    task: AspectTask | None = None


class OntologyView(View):
    iri: str
    version: str
    checksum: str
    loaded_at: datetime
    classes: int  # how many

    @classmethod
    def of(cls, record: OntologyRecord) -> OntologyView:
        return cls(iri=record.iri, version=record.version, checksum=record.checksum,
                   loaded_at=record.loaded_at, classes=record.class_count)


class OntologyClassView(View):
    iri: str
    label: str | None = None
    parents: list[str] = []
    children: int = 0  # in any loaded ontology


class OntologyDetail(View):
    """An ontology and its classes."""
    iri: str
    version: str
    checksum: str
    loaded_at: datetime
    classes: list[OntologyClassView]


class SyncSent(View):
    """The SYNCHRONIZE_MODEL message sent to the master."""
    message_id: str


# -- the cluster ------------------------------------------------------------------------------


class MemberView(View):
    id: str
    host: str
    pid: int
    version: str


class LockView(View):
    task: str
    owner: str
    token: int
    age_s: float


class CommandInFlight(View):
    """A MASTER command being handled now (its claim)."""
    id: str
    command: str
    member: str
    age_s: float


class IncidentView(View):
    key: str
    task: str
    kind: str  # running_too_long, waiting_too_long, stopped
    detail: str
    raised_at: datetime
    resolved_at: datetime | None = None


class LevelView(View):
    group: str  # a configured concurrency group (a task type or a dotted prefix)
    limit: int
    used: int


class ClusterStatus(View):
    cluster: str
    answered_by: str
    master: str | None
    members: list[MemberView]
    locks: list[LockView]
    concurrency: list[LevelView] = []
    resources: dict[str, list[str]] = {}  # resource -> the members holding it now
    ordering_keys: dict[str, list[str]] = {}  # key -> the member running its task now
    commands: list[CommandInFlight] = []  # MASTER commands being handled, oldest first
    incidents: list[IncidentView] = []  # open ones, oldest first
    workflows: dict[str, int] = {}  # how many workflows in each state (running, ...)


# -- commands and streams from the outside ----------------------------------------------------


class CommandView(View):
    """A command or broadcast the live nodes declare, and the members declaring it."""
    name: str
    kind: str  # command or broadcast
    description: str = ""
    payload_schema: JsonObject = {}
    on_reconnect: bool = False  # it has a catch-up run when a node's MODEL connection returns
    builtin: bool = False  # latchwork's own, not a --tasks module's
    members: list[str] = []


class Pushed(View):
    queue: str
    indexes: list[int]


class Element(View):
    """A queue element: ``value`` when its bytes are JSON, ``text`` when they are other UTF-8,
    ``base64`` otherwise (only the one that applies is sent)."""
    index: int
    value: JsonValue = None
    text: str | None = None
    base64: str | None = None

    @model_serializer(mode="wrap")
    def _only_given(self, handler: object, info: SerializationInfo) -> JsonObject:
        data: JsonObject = handler(self)  # type: ignore[operator]
        return {k: v for k, v in data.items() if k == "index" or k in self.model_fields_set}


class StreamPage(View):
    queue: str
    elements: list[Element]
    next: int  # where the next read starts
