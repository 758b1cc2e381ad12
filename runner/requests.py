"""The API's contract: one request model per command, shared by the client and the node.

Each model names its command (``TaskSubmit.command == "task.submit"``), says what the command
accepts, and names what it answers: ``class TaskGet(TaskById, Request[TaskReport])`` (the
reply models are :mod:`runner.replies`; a command without a reply type fails at import). The
node validates every request into its model before the handler runs (an invalid one is
refused: dead-lettered and answered ``invalid``) and sends its handler's reply model as JSON;
:class:`runner.client.Client` builds the same models for its typed methods, so a wrong request
is refused before it is sent (:class:`~runner.errors.RequestRefused`, code ``invalid``), and
reads the reply back into its model (:meth:`~runner.client.Client.send`); the CLI sends only
these models through the client. A command is declared once; declaring it twice fails at
import (:data:`COMMANDS`). Pure models; nothing here does I/O.

Why one module: the contract is read as one thing (every command the API answers, what each
accepts and answers), and a test checks it against the node's handlers; split, no one place
would say it.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, ClassVar, Generic, Literal, TypeVar

from pydantic import (
    AwareDatetime,
    BaseModel,
    Field,
    JsonValue,
    TypeAdapter,
    field_serializer,
    model_validator,
)

from runner.replies import (
    Acted,
    AspectView,
    Cancelled,
    CheckpointValue,
    ClusterStatus,
    CommandView,
    OntologyDetail,
    OntologyView,
    Pushed,
    RecentAttempt,
    ResultValue,
    ScheduleRemoved,
    ScheduleView,
    SearchPage,
    StreamInfo,
    StreamPage,
    StreamStarted,
    StreamState,
    Submitted,
    SyncSent,
    TaskReport,
    TaskTypeView,
    TaskView,
    WorkflowCancelled,
    WorkflowReport,
    WorkflowView,
)
from runner.store.model import ASPECT_PATTERN
from runner.templates import JsonObject, ScheduleSpec, TaskTemplate
from runner.workflows import (
    MAX_MEMBERS,
    Flow,
    WorkflowRef,
    digest,
    member_id,
    plan,
    workflow_id,
)

__all__ = ["COMMANDS", "Request", "ScheduleSpec", "TaskTemplate"]

#: a command's reply type
R = TypeVar("R", covariant=True)
#: every command and its request model
COMMANDS: dict[str, type[Request[object]]] = {}


class Request(BaseModel, Generic[R]):
    """A request of one API command (``command``), answered with an ``R``."""

    command: ClassVar[str]
    _reply: ClassVar[TypeAdapter[object] | None] = None

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: object) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        command = cls.__dict__.get("command")
        if command is None:
            return  # Request[R] itself, parametrized
        reply = _reply_type(cls)
        if reply is None:
            raise TypeError(f"command {command!r} of {cls.__qualname__} names no reply "
                            f"type: derive it from Request[<its reply>]")
        other = COMMANDS.get(command)
        if other is not None and other.__qualname__ != cls.__qualname__:
            raise TypeError(f"command {command!r} of {cls.__qualname__} is already "
                            f"{other.__qualname__}'s")
        cls._reply = TypeAdapter[object](reply)  # type: ignore[arg-type]  # a type, read
        COMMANDS[command] = cls

    @classmethod
    def reply_type(cls) -> object:
        """What the command answers (a model, or a list or dict of them)."""
        return _reply_type(cls)

    @classmethod
    def reply_adapter(cls) -> TypeAdapter[object]:
        """Reads (``validate_python``) and writes (``dump_python``) the command's reply."""
        if cls._reply is None:
            raise TypeError(f"{cls.__qualname__} is not a command")
        return cls._reply


def _reply_type(cls: type) -> object | None:
    """The ``R`` of the ``Request[R]`` among ``cls``'s bases (None: none names one)."""
    for base in cls.__mro__:
        meta = getattr(base, "__pydantic_generic_metadata__", None)
        if meta and meta["origin"] is Request and meta["args"] \
                and not isinstance(meta["args"][0], TypeVar):
            reply: object = meta["args"][0]
            return reply
    return None


# -- tasks ------------------------------------------------------------------------------------


class TaskSubmit(TaskTemplate, Request[TaskView]):
    """Create a task."""

    command = "task.submit"


#: the most tasks one bulk submit carries (a request and a store transaction); a client sends
#: more as several pages, each also kept under :data:`SUBMIT_PAGE_BYTES` of JSON
SUBMIT_PAGE = 500
SUBMIT_PAGE_BYTES = 192 * 1024


class TaskSubmitMany(Request[Submitted]):
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

    @field_serializer("tasks")
    def _compact(self, tasks: list[TaskTemplate]) -> list[JsonObject]:
        """Each item without its unset (None) fields: the page as the client measured it
        against :data:`SUBMIT_PAGE_BYTES` (and the broker's body limit), not 500 items' worth
        of nulls more."""
        return [task.model_dump(mode="json", exclude_none=True) for task in tasks]


class MemberSpec(BaseModel):
    """A member of a workflow page: its task and the indices (in the whole workflow, each
    below its own) of the members it depends on."""

    model_config = {"extra": "forbid"}
    task: TaskTemplate
    after: list[int] = Field(default_factory=list, max_length=MAX_MEMBERS)


class WorkflowSubmit(Request[WorkflowView]):
    """A page of a workflow (``Client.submit_workflow``): members ``start`` to ``start +
    len(members) - 1`` of ``total``, each after what it depends on (:func:`runner.workflows.plan`),
    written waiting, nothing claimable; the last page (``commit``) then makes the workflow
    claimable. ``key`` is the submit's idempotency key (the workflow's id and its members' ids
    come from it: :func:`runner.workflows.workflow_id`), ``digest`` what the workflow is: the
    same page sent again writes nothing twice, and another workflow under a key already used is
    refused."""

    command = "workflow.submit"
    key: str = Field(min_length=1, max_length=200)
    digest: str = Field(pattern=r"^[0-9a-f]{16}$")
    total: int = Field(ge=1, le=MAX_MEMBERS)
    start: int = Field(ge=0, lt=MAX_MEMBERS)
    members: list[MemberSpec] = Field(default_factory=list, max_length=SUBMIT_PAGE)
    commit: bool = False
    #: a step that runs once if a member stops (its retries spent) or the deadline passes;
    #: written with the first page, as member ``total``
    on_failure: TaskTemplate | None = None
    #: members not started by then are stopped (and ``on_failure`` starts)
    deadline: AwareDatetime | None = None

    @model_validator(mode="after")
    def _in_order(self) -> WorkflowSubmit:
        if self.start + len(self.members) > self.total:
            raise ValueError(f"members {self.start}..{self.start + len(self.members) - 1} "
                             f"are past the workflow's {self.total}")
        for n, member in enumerate(self.members, self.start):
            if any(not 0 <= i < n for i in member.after):
                raise ValueError(f"member {n} depends on a member that is not before it")
        return self

    @field_serializer("on_failure")
    def _compact_step(self, step: TaskTemplate | None) -> JsonObject | None:
        return None if step is None else step.model_dump(mode="json", exclude_none=True)

    @field_serializer("members")
    def _compact(self, members: list[MemberSpec]) -> list[JsonObject]:
        return [{"task": m.task.model_dump(mode="json", exclude_none=True),
                 **({"after": list[JsonValue](m.after)} if m.after else {})} for m in members]


def workflow_pages(workflow: Flow, key: str, on_failure: TaskTemplate | None = None,
                   deadline: datetime | None = None) -> list[WorkflowSubmit]:
    """The requests that submit ``workflow`` under ``key``: its members (:func:`plan`) in
    pages of at most :data:`SUBMIT_PAGE` members and :data:`SUBMIT_PAGE_BYTES` of JSON (a
    join's member may make its page larger: it goes alone), the last one committing."""
    planned = plan(workflow)
    what = digest(planned, on_failure)
    members = [MemberSpec(task=p.template, after=list(p.after)) for p in planned]
    pages: list[tuple[int, list[MemberSpec]]] = []
    page: list[MemberSpec] = []
    size, start = 0, 0
    for n, member in enumerate(members):
        length = len(member.task.model_dump_json(exclude_none=True)) + 8 * len(member.after) + 20
        if page and (len(page) >= SUBMIT_PAGE or size + length > SUBMIT_PAGE_BYTES):
            pages.append((start, page))
            page, size, start = [], 0, n
        page.append(member)
        size += length
    pages.append((start, page))
    return [WorkflowSubmit(key=key, digest=what, total=len(members), start=first,
                           members=part, commit=n == len(pages) - 1, on_failure=on_failure,
                           deadline=deadline) for n, (first, part) in enumerate(pages)]


def submitted(first: WorkflowSubmit, answer: object) -> WorkflowRef:
    """What a submit of the workflow whose first page is ``first`` made: its id and its
    members' ids (made from the key), and the node's answer to its last page."""
    wf_id = workflow_id(first.key)
    return WorkflowRef(wf_id, first.key,
                       tuple(member_id(wf_id, i) for i in range(first.total)), answer,
                       member_id(wf_id, first.total) if first.on_failure else None)


class WorkflowById(BaseModel):
    id: str = Field(min_length=1, max_length=100)


#: the most members ``workflow show`` lists (every member is counted)
REPORT_MEMBERS = 500


class WorkflowShow(WorkflowById, Request[WorkflowReport]):
    """A workflow with its members' states (``latchwork workflow show ID``)."""

    command = "workflow.show"


class WorkflowCancel(WorkflowById, Request[WorkflowCancelled]):
    """Cancel every unfinished member of a workflow (``latchwork workflow cancel ID``)."""

    command = "workflow.cancel"
    reason: str | None = Field(default=None, max_length=1000)


#: the namespace of the ids of a keyed page's tasks (:func:`page_task_id`)
PAGE_IDS = uuid.UUID("5d1c3a52-8f0e-4c67-9a61-2b7e0f4d9c18")


def page_task_id(page: str, index: int) -> str:
    """The id of the task at ``index`` of the bulk submit page keyed ``page``."""
    return str(uuid.uuid5(PAGE_IDS, f"{page}/{index}"))


def submit_task_id(request: uuid.UUID) -> str:
    """The id of the task a ``task.submit`` request with this message id creates: the same
    for a redelivered copy of the request, so it creates the task once."""
    return str(uuid.uuid5(PAGE_IDS, f"submit/{request}"))


class TaskList(Request[SearchPage]):
    """A page of tasks, newest first; ``unfinished``: the open ones in the order nodes take
    them; ``ordering_key``: that key's unfinished tasks in the order they run. A page holds at
    most ``limit`` tasks and stays under half the message size limit, whatever the payloads;
    ``after``: the ``next`` cursor of the page before (:meth:`runner.client.Client.list`
    walks them)."""

    command = "task.list"
    unfinished: bool = False
    type: str | None = None
    ordering_key: str | None = None
    after: str | None = Field(default=None, max_length=300)
    limit: int = Field(default=200, ge=1, le=1000)


class TaskById(BaseModel):
    id: str = Field(min_length=1)


class TaskGet(TaskById, Request[TaskReport]):
    command = "task.get"


class TaskCheckpoint(TaskById, Request[CheckpointValue]):
    """The task's last checkpoint with its value (``task show ID --checkpoint``)."""

    command = "task.checkpoint"


class TaskResult(TaskById, Request[ResultValue]):
    """What the task's handler returned, with the task's state (``task result ID``): the
    client waits by asking again."""

    command = "task.result"


class TaskCancel(TaskById, Request[Cancelled]):
    command = "task.cancel"
    reason: str | None = Field(default=None, max_length=1000)


class TaskDeactivate(TaskById, Request[Cancelled]):
    command = "task.deactivate"


class TaskReactivate(TaskById, Request[Acted]):
    command = "task.reactivate"
    #: also drop the task's last checkpoint: its next attempt starts from the beginning
    fresh: bool = False


class TaskSkip(TaskById, Request[Acted]):
    command = "task.skip"


class TaskTypes(Request[list[TaskTypeView]]):
    command = "task.types"


class AttemptRecent(Request[list[RecentAttempt]]):
    command = "attempt.recent"
    limit: int = Field(default=10, ge=1, le=1000)


# -- schedules --------------------------------------------------------------------------------


class ScheduleRef(BaseModel):
    name: str = Field(min_length=1, max_length=200, pattern=r"^[^\s/]+$")


class ScheduleAdd(ScheduleRef, Request[ScheduleView]):
    command = "schedule.add"
    spec: ScheduleSpec


class ScheduleList(Request[list[ScheduleView]]):
    command = "schedule.list"


class ScheduleRemove(ScheduleRef, Request[ScheduleRemoved]):
    command = "schedule.remove"


class SchedulePause(ScheduleRef, Request[ScheduleView]):
    """Pause a schedule (its fires that have not started are stopped too), or resume it."""

    command = "schedule.pause"
    paused: bool = True


# -- streams, aspects, ontologies, the cluster ------------------------------------------------


class StreamRef(BaseModel):
    name: str = Field(min_length=1)


class StreamStart(StreamRef, Request[StreamStarted]):
    command = "stream.start"
    redundancy: int = Field(default=2, ge=1, le=16)


class StreamStatus(StreamRef, Request[StreamState]):
    command = "stream.status"


class AspectRef(BaseModel):
    name: str = Field(pattern=ASPECT_PATTERN)


class AspectCreate(AspectRef, Request[AspectView]):
    command = "aspect.create"
    batch_rows: int | None = Field(default=None, ge=1, le=10_000_000)
    pause: float = Field(default=0.0, ge=0, le=3600)


class AspectDelete(AspectRef, Request[AspectView]):
    command = "aspect.delete"


class AspectGet(AspectRef, Request[AspectView]):
    command = "aspect.get"


class AspectList(Request[list[AspectView]]):
    command = "aspect.list"


class OntologySyncRequest(Request[SyncSent]):
    command = "ontology.sync"


class OntologyList(Request[list[OntologyView]]):
    command = "ontology.list"


class OntologyShow(Request[OntologyDetail]):
    command = "ontology.show"
    iri: str = Field(min_length=1)


class ClusterStatusQuery(Request[ClusterStatus]):
    command = "cluster.status"


# -- commands and streams from the outside -------------------------------------------------------

#: a stream queue's name (coord's LockFreeQueue: no slash)
QUEUE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$"


class CommandList(Request[list[CommandView]]):
    """Every command and broadcast the live nodes declare."""

    command = "command.list"


class StreamPush(Request[Pushed]):
    """Append ``values`` to a stream's queue (all or nothing). Each value is stored as its
    JSON text (UTF-8), or, with ``raw``, each (a string) as its UTF-8 text. ``token``: a push
    sent again with the same token pushes nothing more and answers the first one's indexes."""

    command = "stream.push"
    queue: str = Field(pattern=QUEUE_PATTERN)
    values: list[JsonValue] = Field(min_length=1, max_length=10_000)
    token: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
    raw: bool = False

    @model_validator(mode="after")
    def _raw_are_strings(self) -> StreamPush:
        if self.raw and not all(isinstance(v, str) for v in self.values):
            raise ValueError("raw values must be strings")
        return self


class StreamRead(Request[StreamPage]):
    """Elements of a queue from ``start`` (inputs, outputs and dead letters alike)."""

    command = "stream.read"
    queue: str = Field(pattern=QUEUE_PATTERN)
    start: int = Field(default=0, ge=0, le=9_999_999_999)  # a queue index has 10 digits
    limit: int = Field(default=100, ge=1, le=1000)


# -- the web console's views ------------------------------------------------------------------

#: a task's state as a ``state:`` filter takes it (runner.store.model.TaskState; ``delayed``
#: finds the waiting ones; ``finished`` and ``stopped``, the words before format 5, are
#: succeeded, and failed or cancelled)
StateQuery = Literal["waiting", "delayed", "running", "succeeded", "failed", "cancelled",
                    "skipped", "finished", "stopped"]


Name = Annotated[str, Field(min_length=1)]
#: one value, or any of several (at most 20)
FilterValue = Name | Annotated[list[Name], Field(min_length=1, max_length=20)]


class TaskFilterFields(BaseModel):
    """Filters, each an equality on an index; a list means any of its values."""

    type: FilterValue | None = None
    owner: FilterValue | None = None
    ordering_key: FilterValue | None = None
    resource: Name | None = None


class TaskSearch(TaskFilterFields, Request[SearchPage]):
    """One page of tasks matching every filter given, newest first; ``before``: the ``next``
    cursor of the previous page."""

    command = "task.search"
    state: StateQuery | Annotated[list[StateQuery], Field(min_length=1, max_length=9)] | None = None
    before: str | None = Field(default=None, max_length=200)
    limit: int = Field(default=50, ge=1, le=200)


class TaskCounts(TaskFilterFields, Request[dict[str, int]]):
    """How many tasks match the filters in each state."""

    command = "task.counts"


class StreamList(Request[list[StreamInfo]]):
    """The streams the answering node declares, each with its state and running copies."""

    command = "stream.list"
