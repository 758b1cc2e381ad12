"""What an attempt came to on this node, as one value: :data:`End`, a sum of frozen cases.

:class:`~runner.tasks.worker.execution.Execution` builds it when a handler returns (or when
its attempt cannot go on); the group commit (:mod:`.commit`), the one writer of every end,
writes what it says (:func:`write_of`: a store :data:`~runner.store.EndWrite`, or nothing)
through the store's one entry point and answers a :class:`Written` value, from which the
attempt's observers are told and the loop settles the slot. Nothing here does I/O.

* :class:`Succeeded`: written SUCCEEDED with the handler's result, the task finished;
* :class:`Failed`: written with its status (FAILED, CANCELLED_BY_SYSTEM, TIMED_OUT), the task's
  next state as its outcome says (a retry at ``retry_at``, stopped, back as it stands,
  declined);
* :class:`ConflictRetried`: a commit conflict that is retried: the attempt closed alone, the
  task left to its owner, who claims it again (a new :class:`~.running.Claimed`) after a
  backoff;
* :class:`LetGo`: a retry not made: nothing ended (the last attempt is written), the task goes
  back as it stands;
* :class:`TimedOut`: the limit watch closed the attempt while its handler ran on (written
  already): nothing to write;
* :class:`Completed`: the handler ended its attempt itself (``ctx.complete()``, written by the
  group commit too, while the handler waited): nothing more to write;
* :class:`Broken`: an error of the task loop itself: the attempt closed FAILED with it, the
  task left for another try.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from runner.errors import StoreError
from runner.store import (
    Attempt,
    AttemptClose,
    AttemptStatus,
    Conclusion,
    EndWrite,
    EndWritten,
    Incident,
    Release,
    Task,
    attempt_end,
)
from runner.tasks.context import TaskContext
from runner.tasks.observer import Observer
from runner.tasks.outcomes import AttemptResult, Outcome, task_changes


@dataclass(frozen=True)
class Succeeded:
    result: AttemptResult
    #: the handler's last progress report not written yet, and when it returned
    progress: str | None = None
    returned_at: datetime | None = None


@dataclass(frozen=True)
class Failed:
    result: AttemptResult
    outcome: Outcome
    retry_at: datetime | None = None
    progress: str | None = None
    returned_at: datetime | None = None


@dataclass(frozen=True)
class ConflictRetried:
    result: AttemptResult
    progress: str | None = None
    returned_at: datetime | None = None


@dataclass(frozen=True)
class LetGo:
    result: AttemptResult


@dataclass(frozen=True)
class TimedOut:
    """What the limit watch wrote: the task's outcome, the error, the retry policy's next
    attempt, and the incident it raised (None when it could not)."""
    outcome: Outcome
    error: str
    retry_at: datetime | None = None
    incident: Incident | None = None


@dataclass(frozen=True)
class Completed:
    result: AttemptResult


@dataclass(frozen=True)
class Broken:
    error: str
    stack: str


End = Succeeded | Failed | ConflictRetried | LetGo | TimedOut | Completed | Broken


@dataclass(frozen=True)
class Written:
    """What the group commit wrote for an end: the outcome for the task, the task as written
    (None when unknown or untouched), what the attempt shows (its status and error), and the
    members its write released."""
    outcome: Outcome
    task: Task | None
    status: AttemptStatus
    error: str | None
    #: workflow members the write made claimable (the loop wakes the scans for them)
    released: tuple[Task, ...] = ()


class EndWriter(Protocol):
    """The one writer of attempts' ends (the group commit): a write a worker (or the limit
    watch) waits for, answered with what it left or the store's refusal."""

    def write_now(self, write: EndWrite) -> EndWritten | StoreError: ...


@dataclass(frozen=True)
class Audience:
    """The observers that heard an attempt start, and its context: they hear its end, in
    reverse order, once it is written (:meth:`Execution.report`)."""
    ctx: TaskContext
    entered: tuple[Observer, ...]


def outcome_of(end: End) -> Outcome:
    """The outcome for the task that ``end`` asks for (a refusal may turn it to CANCELLED)."""
    if isinstance(end, Succeeded | Completed):
        return Outcome.FINISHED
    if isinstance(end, Failed | TimedOut):
        return end.outcome
    if isinstance(end, ConflictRetried):
        return Outcome.RETRY
    return Outcome.CANCELLED  # LetGo, Broken


def result_of(end: End) -> AttemptResult:
    """The attempt's result as its handler (or the loop) left it."""
    if isinstance(end, TimedOut):
        return AttemptResult.timed_out(end.error)
    if isinstance(end, Broken):
        return AttemptResult.failed(end.error, None)
    return end.result


def retry_at(end: End) -> datetime | None:
    return end.retry_at if isinstance(end, Failed | TimedOut) else None


def shown(end: End) -> tuple[AttemptStatus, str | None]:
    """What the attempt shows when ``end`` is written as asked (or had been already)."""
    if isinstance(end, TimedOut):
        return AttemptStatus.TIMED_OUT, end.error
    if isinstance(end, Broken):
        return AttemptStatus.FAILED, end.error
    if isinstance(end, Completed):
        return AttemptStatus.SUCCEEDED, None
    return end.result.status, end.result.error


def write_of(end: End, task: Task, attempt: Attempt, token: int) -> EndWrite | None:
    """The store write ``end`` is made of for the claim of ``task`` (its RUNNING ``attempt``,
    claimed with ``token``): built in the handler's worker, outside the writer's thread; None
    when nothing is left to write."""
    if isinstance(end, Succeeded):
        return Conclusion.success(attempt, task, task_changes(Outcome.FINISHED),
                                  result=end.result.value, progress=end.progress,
                                  ended=end.returned_at)
    if isinstance(end, Failed):
        return Conclusion.of(attempt, end.result.status, task,
                             task_changes(end.outcome, end.retry_at), error=end.result.error,
                             stack=end.result.stack, progress=end.progress,
                             ended=end.returned_at)
    if isinstance(end, ConflictRetried):
        return AttemptClose(attempt_end(attempt, end.result.status, end.result.error,
                                        end.result.stack, end.progress, end.returned_at))
    if isinstance(end, Broken):
        return AttemptClose(attempt_end(attempt, AttemptStatus.FAILED, end.error, end.stack))
    if isinstance(end, LetGo):
        return Release(task.id, token, task_changes(Outcome.CANCELLED))
    return None  # TimedOut, Completed: written already
