"""Views of tasks, attempts and cluster state: the JSON the node's API replies carry (``*_view``
functions, also the CLI's ``--json``) and the typed models a client reads them into
(:class:`TaskView`, :class:`TaskReport`, :class:`ClusterStatus`). Models ignore fields they do
not know, so a newer node still answers an older client."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from runner.store import Attempt, OntologyRecord, Progress, Task


def task_view(task: Task) -> dict[str, Any]:
    return {
        "id": task.id, "type": task.type, "payload": task.payload, "active": task.active,
        "status": task.status.value, "finished": task.finished, "priority": task.priority,
        "created_at": task.created_at.isoformat(), "updated_at": task.updated_at.isoformat(),
        "version": task.version, "fence": task.fence, "unique_key": task.unique_key,
        "owner": task.owner, "attempts": task.attempts,
        "run_at": task.run_at.isoformat() if task.run_at else None,
        "ordering_key": task.ordering_key, "resources": list(task.resources),
        "skipped": task.skipped, "stop_reason": task.stop_reason, "timeout": task.timeout,
        "checkpoint": None if task.checkpoint is None else {
            "at": task.checkpoint.at.isoformat(), "size": task.checkpoint.size,
            "seq": task.checkpoint.seq},
    }


def ontology_view(record: OntologyRecord) -> dict[str, Any]:
    return {"iri": record.iri, "version": record.version, "checksum": record.checksum,
            "loaded_at": record.loaded_at.isoformat(), "classes": record.class_count}


def attempt_view(attempt: Attempt) -> dict[str, Any]:
    return {
        "id": attempt.id, "seq": attempt.seq, "status": attempt.status.value,
        "executor": attempt.executor, "started_at": attempt.started_at.isoformat(),
        "ended_at": attempt.ended_at.isoformat() if attempt.ended_at else None,
        "duration_ms": attempt.duration_ms, "error": attempt.error,
        "stack_trace": attempt.stack_trace, "fence": attempt.fence,
        "progress": progress_view(attempt.progress),
        "heartbeat": None if attempt.heartbeat is None else {
            "at": attempt.heartbeat.at.isoformat(), "details": attempt.heartbeat.details},
    }


def progress_view(progress: Progress | None) -> dict[str, Any] | None:
    if progress is None:
        return None
    return {"done": progress.done, "total": progress.total, "message": progress.message,
            "at": progress.at.isoformat()}


class View(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class TaskRef(View):
    """What a submission returns: enough to follow the task."""
    id: str
    type: str


class ProgressView(View):
    done: int
    total: int | None = None
    message: str = ""
    at: datetime


class CheckpointView(View):
    """What a task shows of its last checkpoint (``ctx.checkpoint``): not the state itself."""
    at: datetime
    size: int  # bytes of JSON
    seq: int  # the attempt that committed it


class HeartbeatView(View):
    at: datetime
    details: Any = None


class TaskView(TaskRef):
    payload: dict[str, Any]
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
    progress: ProgressView | None = None  # of its running attempt (task.list)
    run_at: datetime | None = None  # not started before (delayed, scheduled, retry backoff)
    ordering_key: str | None = None
    resources: list[str] = []
    skipped: bool = False  # finished by `task skip`, without a run
    stop_reason: str | None = None  # why it was stopped unrun (a paused schedule's fire)
    checkpoint: CheckpointView | None = None  # where its next attempt resumes
    timeout: float | None = None  # its own time limit (its type's caps it)

    @property
    def stopped(self) -> bool:
        """Deactivated before it finished (a failure, an operator): it waits for reactivation."""
        return not self.active and not self.finished


class Cancelled(TaskView):
    """A cancelled or deactivated task, and the attempts the cancel stopped."""
    cancelled_attempts: list[str] = []


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


class RecentAttempt(AttemptView):
    """An attempt that ended, with its task's id and type (``attempt.recent``)."""
    task: str
    type: str


class TaskReport(View):
    """A task with every attempt, newest last, and its progress when it reports one."""
    task: TaskView
    attempts: list[AttemptView]
    progress: dict[str, Any] | None = None

    @property
    def done(self) -> bool:
        """Finished, or stopped (it will not run again unless reactivated)."""
        return self.task.finished or self.task.stopped

    @property
    def succeeded(self) -> bool:
        return self.task.finished and bool(self.attempts) \
            and self.attempts[-1].status == "SUCCEEDED"


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
