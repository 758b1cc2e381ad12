"""The API's contract: one request model per command, shared by the client and the node.

Each model names its command (``TaskSubmit.command == "task.submit"``) and says what the
command accepts. The node validates every request into its model before the handler runs (an
invalid one is refused: dead-lettered and answered ``invalid``); :class:`runner.client.Client`
builds the same models for its typed methods, so a wrong request is refused before it is sent
(:class:`~runner.errors.RequestRefused`, code ``invalid``), and the CLI sends only these models
through the client. A command is declared once; declaring it twice fails at import
(:data:`COMMANDS`). Pure models; nothing here does I/O.

Why one module: the contract is read as one thing (every command the API answers, what each
accepts), and a test checks it against the node's handlers; split, no one place would say it.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Annotated, Any, ClassVar, Literal

from apscheduler.triggers.cron import CronTrigger
from pydantic import AwareDatetime, BaseModel, Field, model_validator

from runner.store import codec
from runner.store.model import ASPECT_PATTERN

#: every command and its request model
COMMANDS: dict[str, type[Request]] = {}


class Request(BaseModel):
    """A request of one API command (``command``)."""

    command: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        command = cls.__dict__.get("command")
        if command is None:
            return  # a base of several requests (a shared field), not a command
        other = COMMANDS.get(command)
        if other is not None and other.__qualname__ != cls.__qualname__:
            raise TypeError(f"command {command!r} of {cls.__qualname__} is already "
                            f"{other.__qualname__}'s")
        COMMANDS[command] = cls


# -- tasks ------------------------------------------------------------------------------------


class TaskTemplate(BaseModel):
    """The fields of one task to create (``priority`` None: its type's default): a submit's,
    each item of a bulk submit's."""

    model_config = {"extra": "forbid"}
    type: str = Field(min_length=1)
    payload: dict[str, Any] = Field(default_factory=dict)
    priority: int | None = None
    unique_key: str | None = None
    run_at: AwareDatetime | None = None  # not claimed before this instant
    delay: float | None = Field(default=None, ge=0)  # seconds from now (instead of run_at)
    ordering_key: str | None = Field(default=None, min_length=1, max_length=200)
    resources: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list, max_length=32)
    #: seconds an attempt may run (its type's ``timeout``, when it has one, caps it)
    timeout: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one_time(self) -> TaskTemplate:
        if self.run_at is not None and self.delay is not None:
            raise ValueError("give run_at or delay, not both")
        return self

    def when(self) -> datetime | None:
        if self.delay is not None:
            return codec.now() + timedelta(seconds=self.delay)
        return self.run_at


class TaskSubmit(TaskTemplate, Request):
    """Create a task."""

    command = "task.submit"


#: the most tasks one bulk submit carries (a request and a store transaction); a client sends
#: more as several pages, each also kept under :data:`SUBMIT_PAGE_BYTES` of JSON
SUBMIT_PAGE = 500
SUBMIT_PAGE_BYTES = 192 * 1024


class TaskSubmitMany(Request):
    """Create up to :data:`SUBMIT_PAGE` tasks in one store transaction; their ids come back in
    order. An item that does not validate (its type unknown, its payload invalid) refuses the
    whole page, naming its index; a ``unique_key`` already used returns the task it made.

    ``page``: the page's key, which makes it safe to send again (an answer lost, a node paused
    or killed while it wrote): the task at index n gets the id :func:`page_task_id` gives, and
    a page sent again with its key and items creates only what its first sending did not,
    answering the same ids."""

    command = "task.submit_many"
    tasks: list[TaskTemplate] = Field(min_length=1, max_length=SUBMIT_PAGE)
    page: str | None = Field(default=None, min_length=8, max_length=64,
                             pattern=r"^[A-Za-z0-9_.:-]+$")


#: the namespace of the ids of a keyed page's tasks (:func:`page_task_id`)
PAGE_IDS = uuid.UUID("5d1c3a52-8f0e-4c67-9a61-2b7e0f4d9c18")


def page_task_id(page: str, index: int) -> str:
    """The id of the task at ``index`` of the bulk submit page keyed ``page``."""
    return str(uuid.uuid5(PAGE_IDS, f"{page}/{index}"))


class TaskList(Request):
    """Tasks, newest first; ``unfinished``: the open ones in the order nodes take them;
    ``ordering_key``: that key's unfinished tasks in the order they run."""

    command = "task.list"
    unfinished: bool = False
    type: str | None = None
    ordering_key: str | None = None


class TaskById(Request):
    id: str = Field(min_length=1)


class TaskGet(TaskById):
    command = "task.get"


class TaskCancel(TaskById):
    command = "task.cancel"
    reason: str | None = Field(default=None, max_length=1000)


class TaskDeactivate(TaskById):
    command = "task.deactivate"


class TaskReactivate(TaskById):
    command = "task.reactivate"
    #: also drop the task's last checkpoint: its next attempt starts from the beginning
    fresh: bool = False


class TaskSkip(TaskById):
    command = "task.skip"


class TaskTypes(Request):
    command = "task.types"


class AttemptRecent(Request):
    command = "attempt.recent"
    limit: int = Field(default=10, ge=1, le=1000)


# -- schedules --------------------------------------------------------------------------------


class ScheduleSpec(BaseModel):
    """What a schedule fires: a cron expression (UTC) or an interval in seconds, and the task."""

    cron: str | None = None
    every: float | None = Field(default=None, gt=0)
    type: str = Field(min_length=1)
    payload: dict[str, Any] = Field(default_factory=dict)
    priority: int | None = None
    ordering_key: str | None = Field(default=None, min_length=1)
    resources: list[str] = Field(default_factory=list)
    misfire: Literal["run_once", "skip"] = "run_once"

    @model_validator(mode="after")
    def _one_trigger(self) -> ScheduleSpec:
        if (self.cron is None) == (self.every is None):
            raise ValueError("give a cron expression or an interval, one of them")
        if self.cron is not None:
            try:
                CronTrigger.from_crontab(self.cron, timezone="UTC")
            except ValueError as exc:
                raise ValueError(f"bad cron expression {self.cron!r}: {exc}") from exc
        return self


class ScheduleRef(Request):
    name: str = Field(min_length=1, max_length=200, pattern=r"^[^\s/]+$")


class ScheduleAdd(ScheduleRef):
    command = "schedule.add"
    spec: ScheduleSpec


class ScheduleList(Request):
    command = "schedule.list"


class ScheduleRemove(ScheduleRef):
    command = "schedule.remove"


class SchedulePause(ScheduleRef):
    """Pause a schedule (its fires that have not started are stopped too), or resume it."""

    command = "schedule.pause"
    paused: bool = True


# -- streams, aspects, ontologies, the cluster ------------------------------------------------


class StreamRef(Request):
    name: str = Field(min_length=1)


class StreamStart(StreamRef):
    command = "stream.start"
    redundancy: int = Field(default=2, ge=1, le=16)


class StreamStatus(StreamRef):
    command = "stream.status"


class AspectRef(Request):
    name: str = Field(pattern=ASPECT_PATTERN)


class AspectCreate(AspectRef):
    command = "aspect.create"
    batch_rows: int | None = Field(default=None, ge=1)
    pause: float = Field(default=0.0, ge=0, le=3600)


class AspectDelete(AspectRef):
    command = "aspect.delete"


class AspectGet(AspectRef):
    command = "aspect.get"


class AspectList(Request):
    command = "aspect.list"


class OntologySyncRequest(Request):
    command = "ontology.sync"


class OntologyList(Request):
    command = "ontology.list"


class OntologyShow(Request):
    command = "ontology.show"
    iri: str = Field(min_length=1)


class ClusterStatusQuery(Request):
    command = "cluster.status"


# -- commands and streams from the outside -------------------------------------------------------

#: a stream queue's name (coord's LockFreeQueue: no slash)
QUEUE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$"


class CommandList(Request):
    """Every command and broadcast the live nodes declare."""

    command = "command.list"


class StreamPush(Request):
    """Append ``values`` to a stream's queue (all or nothing). Each value is stored as its
    JSON text (UTF-8), or, with ``raw``, each (a string) as its UTF-8 text. ``token``: a push
    sent again with the same token pushes nothing more and answers the first one's indexes."""

    command = "stream.push"
    queue: str = Field(pattern=QUEUE_PATTERN)
    values: list[Any] = Field(min_length=1, max_length=10_000)
    token: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
    raw: bool = False

    @model_validator(mode="after")
    def _raw_are_strings(self) -> StreamPush:
        if self.raw and not all(isinstance(v, str) for v in self.values):
            raise ValueError("raw values must be strings")
        return self


class StreamRead(Request):
    """Elements of a queue from ``start`` (inputs, outputs and dead letters alike)."""

    command = "stream.read"
    queue: str = Field(pattern=QUEUE_PATTERN)
    start: int = Field(default=0, ge=0)
    limit: int = Field(default=100, ge=1, le=1000)


# -- the web console's views ------------------------------------------------------------------

#: a task's state as lists show and filter it (runner.store.gremlin.rows.LIST_STATES)
TaskState = Literal["waiting", "running", "stopped", "finished", "skipped"]


Name = Annotated[str, Field(min_length=1)]
#: one value, or any of several (at most 20)
FilterValue = Name | Annotated[list[Name], Field(min_length=1, max_length=20)]


class TaskFilterFields(Request):
    """Filters, each an equality on an index; a list means any of its values."""

    type: FilterValue | None = None
    owner: FilterValue | None = None
    ordering_key: FilterValue | None = None
    resource: Name | None = None


class TaskSearch(TaskFilterFields):
    """One page of tasks matching every filter given, newest first; ``before``: the ``next``
    cursor of the previous page."""

    command = "task.search"
    state: TaskState | Annotated[list[TaskState], Field(min_length=1, max_length=5)] | None = None
    before: str | None = Field(default=None, max_length=200)
    limit: int = Field(default=50, ge=1, le=200)


class TaskCounts(TaskFilterFields):
    """How many tasks match the filters in each state."""

    command = "task.counts"


class StreamList(Request):
    """The streams the answering node declares, each with its state and running copies."""

    command = "stream.list"
