"""The store's records: tasks, attempts, ontologies, avatars, and the values of its smaller
parts (schedules, incidents, tombstones, checkpoints, task filters and pages): frozen
dataclasses with no I/O, what the port (:mod:`runner.store.api`) answers.

Why one module: these are the values every driver and every caller of the store share; split,
each record's module would import the others' (a task's state, its attempts, its filter).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from runner.errors import InvalidValue

#: an aspect name: stored as the avatar property ``aspect.<name>``, so a safe identifier
ASPECT_PATTERN = r"^[a-z][a-z0-9_-]{0,62}$"


class TaskStatus(enum.StrEnum):
    WAITING = "WAITING"
    RUNNING = "RUNNING"


class AttemptStatus(enum.StrEnum):
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED_BY_SYSTEM = "CANCELLED_BY_SYSTEM"  # shutdown, lost session or lock, dead owner
    CANCELLED = "CANCELLED"  # by an operator (``task cancel``, ``task deactivate``)
    #: past its type's ``timeout``, or no heartbeat within its ``heartbeat_timeout``
    TIMED_OUT = "TIMED_OUT"


class StopCause(enum.StrEnum):
    """Why an unfinished task is inactive: what its ``state`` says (failed or cancelled)."""

    FAILED = "failed"  # its last attempt failed (or timed out) past its retries
    CANCELLED = "cancelled"  # an operator cancelled or deactivated it, or it was stopped unrun


class TaskState(enum.StrEnum):
    """A task's one state, as every reply, console and ``state:`` query says it (the fields it
    is derived from stay in replies too). ``delayed`` is a waiting task whose time has not
    come; lists that filter by state find it under ``waiting`` (a stored index cannot hold a
    time-dependent word)."""

    WAITING = "waiting"
    DELAYED = "delayed"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"


#: the largest checkpoint a handler may commit, in bytes of its JSON (``ctx.checkpoint``)
CHECKPOINT_LIMIT = 64 * 1024


@dataclass(frozen=True)
class CheckpointInfo:
    """What is known of a task's last committed checkpoint without reading it: when it was
    written, its size in bytes of JSON, and the attempt (its ``seq``) that wrote it."""
    at: datetime
    size: int
    seq: int


@dataclass(frozen=True)
class Task:
    id: str
    type: str
    payload: dict[str, Any]
    active: bool
    status: TaskStatus
    finished: bool
    priority: int
    created_at: datetime
    updated_at: datetime
    version: int
    fence: int  # fencing token of the last owner that wrote it (0: never locked)
    unique_key: str | None = None
    owner: str | None = None  # member id of the last owner
    attempts: int = 0  # how many attempts were started
    #: not claimed before this instant (a delayed or scheduled task, a retry's backoff)
    run_at: datetime | None = None
    #: tasks with the same key run one at a time, in submission order
    ordering_key: str | None = None
    #: taken all-or-nothing before it starts, released after its attempt is written
    resources: tuple[str, ...] = ()
    skipped: bool = False  # finished by an operator's ``task skip``, not by a run
    #: why it was stopped before it ran, when no attempt says so (a paused schedule's fire)
    stop_reason: str | None = None
    #: the last checkpoint an attempt committed (``ctx.checkpoint``): when, how big, by which
    checkpoint: CheckpointInfo | None = None
    #: seconds an attempt may run, given at its submission (its type's ``timeout`` caps it)
    timeout: float | None = None
    #: why it is inactive while unfinished (None otherwise): its state, failed or cancelled
    stop: StopCause | None = None
    #: the workflow it is a member of (None: a task of its own); fixed when it is made
    workflow: str | None = None
    #: what it still waits for before it can start: its dependencies that have not succeeded
    #: (0: claimable as any task, unless it awaits its workflow's commit)
    pending: int = 0
    #: a workflow's root written before its workflow was committed: not claimable until the
    #: commit activates it (runner.store.gremlin.workflows)
    awaits_commit: bool = False
    #: a workflow's ``on_failure`` step: it waits (``pending`` 1) until a member stops, and
    #: runs once then; it never runs in a workflow that succeeds
    on_failure: bool = False

    @property
    def open(self) -> bool:
        """Unfinished and active: what the task loop looks at."""
        return self.active and not self.finished

    def stored_state(self) -> TaskState:
        """Its state as a list index stores it: :meth:`state` without ``delayed``."""
        if self.finished:
            return TaskState.SKIPPED if self.skipped else TaskState.SUCCEEDED
        if not self.active:
            return TaskState.FAILED if self.stop is StopCause.FAILED else TaskState.CANCELLED
        return TaskState.RUNNING if self.status is TaskStatus.RUNNING else TaskState.WAITING

    def state(self, now: datetime) -> TaskState:
        """Its one state at ``now`` (:class:`TaskState`)."""
        stored = self.stored_state()
        if stored is TaskState.WAITING and self.run_at is not None and self.run_at > now:
            return TaskState.DELAYED
        return stored


@dataclass(frozen=True)
class Fence:
    """What a task's owner carries into a store write: the write is refused
    (:class:`~runner.errors.StaleFencingToken`) unless ``token`` is still the task's,
    and (:class:`~runner.errors.ResourceTaken`) unless attempt ``attempt_id`` is still
    the last to have claimed each of ``resources`` (the task's declared resources)."""

    task_id: str
    token: int
    attempt_id: str | None = None
    resources: tuple[str, ...] = ()


@dataclass(frozen=True)
class Progress:
    """What a handler last reported (``ctx.progress``): ``done`` of ``total`` (None: unknown)."""
    done: int
    total: int | None
    message: str
    at: datetime


@dataclass(frozen=True)
class Heartbeat:
    """The last details a running attempt beat (``ctx.heartbeat``) that were written."""
    at: datetime
    details: Any


@dataclass(frozen=True)
class Attempt:
    id: str
    task_id: str
    seq: int  # 1, 2, ... per task
    status: AttemptStatus
    executor: str
    started_at: datetime
    fence: int = 0
    ended_at: datetime | None = None
    duration_ms: int | None = None
    error: str | None = None
    stack_trace: str | None = None
    progress: Progress | None = None
    heartbeat: Heartbeat | None = None


class WorkflowState(enum.StrEnum):
    """Where a workflow is: ``open`` while its members are written (nothing of it is
    claimable), ``running`` once committed (its roots are activated from it), ``succeeded`` once
    every member finished (the master's round sees it), ``removing`` when the master removes
    one left open."""

    OPEN = "open"
    RUNNING = "running"
    #: every member finished (its on_failure step, which never ran, aside): the master marks it
    SUCCEEDED = "succeeded"
    #: left open past its time: the master removes its members (a resend begins it again)
    REMOVING = "removing"


@dataclass(frozen=True)
class Workflow:
    """A workflow vertex: its id (from its submit's idempotency ``key``), its state, how many
    members its submit declared, when it was begun, whether every root was activated after
    its commit, and its submit's digest."""
    id: str
    key: str
    state: WorkflowState
    members: int
    created_at: datetime
    activated: bool = False
    #: what its submit declared, in short (a resend has the same; another workflow under the
    #: same key does not)
    digest: str = ""
    #: members not started by then are stopped (the master's workflow round); None: no
    #: deadline
    deadline: datetime | None = None


@dataclass(frozen=True)
class NewMember:
    """A workflow member to write: its task (``tasks.new``, with ``workflow`` and ``pending``
    set) and the members it depends on (their task ids, written before it)."""
    task: Task
    depends_on: tuple[str, ...] = ()


@dataclass(frozen=True)
class StoredResult:
    """What a task's handler returned, as its SUCCEEDED attempt holds it: ``text`` is the
    JSON (at most 64 KiB: :mod:`runner.tasks.results`)."""
    task_id: str
    attempt_id: str
    text: str

    @property
    def size(self) -> int:
        """Bytes of JSON."""
        return len(self.text.encode())


@dataclass(frozen=True)
class OntologyClass:
    iri: str
    label: str | None = None
    parents: tuple[str, ...] = ()  # rdfs:subClassOf targets, possibly in other ontologies


@dataclass(frozen=True)
class Ontology:
    """An ontology to load: its IRI, version, source checksum and classes."""

    iri: str
    version: str
    checksum: str
    classes: tuple[OntologyClass, ...] = ()


@dataclass(frozen=True)
class OntologyRecord:
    iri: str
    version: str
    checksum: str
    loaded_at: datetime
    class_count: int


@dataclass(frozen=True)
class LoadResult:
    ontology: str
    added_classes: int
    added_edges: int
    changed: bool  # False: the same IRI and checksum were loaded already


@dataclass(frozen=True)
class Avatar:
    id: str
    class_iri: str
    properties: dict[str, Any] = field(default_factory=dict)
    aspects: dict[str, Any] = field(default_factory=dict)


# -- the values of the store's smaller parts ---------------------------------------------

#: a task's state as a list index stores it and a ``state:`` query finds it
#: (:meth:`~runner.store.model.Task.stored_state`: every state but ``delayed``)
LIST_STATES = tuple(s.value for s in TaskState if s is not TaskState.DELAYED)
#: the words of the lists before store format 5, still taken in a query: ``finished`` is
#: succeeded, ``stopped`` failed or cancelled
OLD_STATES = {"finished": ("succeeded",), "stopped": ("failed", "cancelled")}


@dataclass(frozen=True)
class Incident:
    key: str  # <task id>:<kind>:<occurrence>
    task_id: str
    kind: str  # running_too_long, waiting_too_long, stopped
    detail: str
    raised_at: datetime
    resolved_at: datetime | None
    delivered: frozenset[str]  # events hooks heard: raised, resolved

    @property
    def open(self) -> bool:
        return self.resolved_at is None

    def view(self) -> dict[str, Any]:
        return {"key": self.key, "task": self.task_id, "kind": self.kind,
                "detail": self.detail, "raised_at": self.raised_at.isoformat(),
                "resolved_at": self.resolved_at.isoformat() if self.resolved_at else None}




@dataclass(frozen=True)
class Schedule:
    name: str
    spec: dict[str, Any]  # cron or every, type, payload, priority, ordering_key, misfire...
    created_at: datetime
    paused: bool
    last_fire: datetime | None  # the last fire handled (a task created, or skipped)
    version: int




@dataclass(frozen=True)
class Tombstone:
    task_id: str
    where: str  # the Parquet file it was archived to, or "" when only removed
    at: str  # when (UTC, ISO 8601)




@dataclass(frozen=True)
class Checkpoint:
    """A task's last committed checkpoint: its state (decoded JSON) and what rows show."""
    state: Any
    info: CheckpointInfo




#: a filter's value: one, or any of several (``P.within``: still one index lookup)
OneOrMore = str | tuple[str, ...]


@dataclass(frozen=True)
class TaskFilter:
    """What a task list asks for; None: any. ``type``, ``state``, ``owner`` and
    ``ordering_key`` take several values, meaning any of them; a resource is one (each
    resource is a property of its own: "any of" would be one lookup per name)."""

    type: OneOrMore | None = None
    state: OneOrMore | None = None  # of LIST_STATES
    owner: OneOrMore | None = None
    ordering_key: OneOrMore | None = None
    resource: str | None = None

    def __post_init__(self) -> None:
        states: list[str] = []
        for state in filter_values(self.state):
            if state == "delayed":  # not a stored word: a delayed task is listed as waiting
                state = "waiting"
            if state not in LIST_STATES and state not in OLD_STATES:
                raise InvalidValue(f"unknown task state {state!r} (one of "
                                   f"{', '.join(LIST_STATES)})")
            states.extend(OLD_STATES.get(state, (state,)))
        if states:
            unique = tuple(dict.fromkeys(states))
            object.__setattr__(self, "state", unique[0] if len(unique) == 1 else unique)


def filter_values(value: OneOrMore | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(dict.fromkeys(value))


@dataclass(frozen=True)
class TaskPage:
    tasks: list[Task]
    #: where the next (older) page starts: pass it as ``before``; None: this was the last
    next: str | None


@dataclass(frozen=True)
class ServerOptions:
    """How to reach a Gremlin Server (:mod:`runner.store.server`): credentials, TLS, the
    answer deadline, and what makes a guarded write atomic there (``atomicity``:
    ``transactions``, ``serial`` or ``none``; docs/graph.md)."""
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    timeout: float = 30.0
    atomicity: str = "transactions"
    #: ask a server said to have transactions to commit an empty one before it is used
    probe_transactions: bool = False
    #: a server found without transactions is used anyway (check-then-act), with a WARNING
    allow_untransactional: bool = False
