"""What an attempt came to, as a type: the task loop decides by it, never by an error string.

:class:`AttemptResult` is what running a handler returns (the attempt's status, error, stack
trace and why it failed); its :attr:`~AttemptResult.outcome` says what happens to the task:

* ``FINISHED``: the attempt SUCCEEDED; the task is finished;
* ``RETRY``: a commit conflict; a new attempt after a backoff (the loop's retry budget decides
  how many), the task stays active;
* ``STOPPED``: any other failure; the task is deactivated until someone reactivates it;
* ``RETRY_LATER``: a failure the type's retry policy retries: the task goes back to WAITING
  with ``run_at`` at the end of the backoff (:mod:`runner.tasks.retry`);
* ``CANCELLED``: shutdown, a lost lock or session, an operator's cancel; the task goes back as
  it stands, for whichever node takes it next;
* ``DECLINED``: the handler raised :class:`~runner.tasks.context.TaskDeclined` (this node must
  not run it now, e.g. it already runs another copy of the same stream); the task goes back as
  it stands and this node leaves it to the others for a while.
"""

from __future__ import annotations

import enum
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from runner.errors import CommitConflict, ResourceTaken
from runner.store import AttemptStatus, StopCause, TaskStatus, codec
from runner.tasks.context import (
    CancelToken,
    TaskCancelled,
    TaskConflict,
    TaskDeclined,
    TaskTimedOut,
)
from runner.tasks.registry import TaskType

#: the incident a node raises for a handler that ran on past its limit and its grace (the
#: worker raises it, the master's incident round resolves it: shared here, below both)
IGNORED_TIMEOUT = "ignored_timeout"


class Failure(enum.Enum):
    """Why an attempt did not succeed."""

    NONE = "none"
    CANCELLED = "cancelled"  # the token was cancelled
    CONFLICT = "conflict"  # a commit conflict: retried
    DECLINED = "declined"  # the handler declined this node (TaskDeclined): another node runs it
    TIMED_OUT = "timed_out"  # past a time limit: a failure, which the retry policy may retry
    ERROR = "error"  # anything else: the task stops


class Outcome(enum.Enum):
    """What happens to the task after an attempt."""

    FINISHED = "finished"
    RETRY = "retry"
    STOPPED = "stopped"
    RETRY_LATER = "retry_later"
    CANCELLED = "cancelled"
    DECLINED = "declined"


@dataclass(frozen=True)
class AttemptResult:
    status: AttemptStatus
    failure: Failure = Failure.NONE
    error: str | None = None
    stack: str | None = None
    #: the handler's exception (kept in memory for the retry policy, never stored)
    exception: BaseException | None = field(default=None, compare=False, repr=False)
    #: what a succeeded handler returned, as stored (JSON text; None: no result)
    value: str | None = None

    @classmethod
    def succeeded(cls, value: str | None = None) -> AttemptResult:
        return cls(AttemptStatus.SUCCEEDED, value=value)

    @classmethod
    def cancelled(cls, error: str) -> AttemptResult:
        return cls(AttemptStatus.CANCELLED_BY_SYSTEM, Failure.CANCELLED, error)

    @classmethod
    def conflict(cls, error: str) -> AttemptResult:
        return cls(AttemptStatus.FAILED, Failure.CONFLICT, error)

    @classmethod
    def timed_out(cls, error: str) -> AttemptResult:
        return cls(AttemptStatus.TIMED_OUT, Failure.TIMED_OUT, error, None, TaskTimedOut(error))

    @classmethod
    def declined(cls, error: str) -> AttemptResult:
        return cls(AttemptStatus.CANCELLED_BY_SYSTEM, Failure.DECLINED, error)

    @classmethod
    def failed(cls, error: str, stack: str | None,
               exception: BaseException | None = None) -> AttemptResult:
        return cls(AttemptStatus.FAILED, Failure.ERROR, error, stack, exception)

    @property
    def outcome(self) -> Outcome:
        return {Failure.NONE: Outcome.FINISHED, Failure.CANCELLED: Outcome.CANCELLED,
                Failure.CONFLICT: Outcome.RETRY, Failure.DECLINED: Outcome.DECLINED,
                Failure.ERROR: Outcome.STOPPED, Failure.TIMED_OUT: Outcome.STOPPED}[self.failure]


def task_changes(outcome: Outcome, run_at: datetime | None = None) -> dict[str, Any]:
    """The task's new state, written with the attempt's end by its owner: back to WAITING, and
    finished (FINISHED), deactivated (STOPPED) or not before ``run_at`` (RETRY_LATER). A retry
    that is not made (cancelled while waiting, or its budget spent: the loop concludes it as
    STOPPED) leaves it as it stands."""
    changes: dict[str, Any] = {"status": TaskStatus.WAITING}
    if outcome is Outcome.FINISHED:
        changes["finished"] = True
    elif outcome is Outcome.STOPPED:
        changes["active"] = False
        changes["stop"] = StopCause.FAILED  # its state: failed (an operator's stop: cancelled)
    elif outcome is Outcome.RETRY_LATER:
        changes["run_at"] = run_at
    return changes


def attempt_result(body: Callable[[], str | None], cancel: CancelToken) -> AttemptResult:
    """Run ``body`` (the hooks and the handler of one attempt; it answers the handler's
    result, encoded) and say what the attempt came to; never raises. Cancelled (the token,
    or :class:`TaskCancelled`), declined, a commit
    conflict, a resource lost to a fenced write (which cancels the token), or failed with the
    error and its stack trace; an error raised once the token was cancelled is a
    cancellation."""
    try:
        value = body()
        if cancel.cancelled:
            raise TaskCancelled(cancel.reason)
    except TaskCancelled:
        if cancel.timed_out:
            return AttemptResult.timed_out(cancel.reason)
        return AttemptResult.cancelled(f"cancelled by system: {cancel.reason}")
    except TaskDeclined as exc:
        return AttemptResult.declined(f"declined: {exc}")
    except (TaskConflict, CommitConflict) as exc:
        return AttemptResult.conflict(f"commit conflict: {exc}")
    except ResourceTaken as exc:  # a fenced write of the handler: it lost a resource
        cancel.cancel(f"it lost a resource: {exc}")
        return AttemptResult.cancelled(f"cancelled by system: {cancel.reason}")
    except Exception as exc:
        if cancel.cancelled and cancel.timed_out:
            return AttemptResult.timed_out(f"{cancel.reason} ({exc!r})")
        if cancel.cancelled:
            return AttemptResult.cancelled(f"cancelled by system: {cancel.reason} ({exc!r})")
        return AttemptResult.failed(f"{type(exc).__name__}: {exc}",
                                    "".join(traceback.format_exception(exc)), exc)
    return AttemptResult.succeeded(value)


def with_retry_policy(kind: TaskType, result: AttemptResult, outcome: Outcome,
                      attempts: int, ended: datetime | None = None) -> tuple[Outcome,
                                                                            datetime | None]:
    """A STOPPED outcome that the type's retry policy retries (after ``attempts`` attempts)
    becomes RETRY_LATER, with the time of the next attempt: the backoff counted from
    ``ended``, the end written on the attempt (now when None); anything else stays."""
    if outcome is Outcome.STOPPED and kind.retry is not None \
            and kind.retry.retries(result.exception, attempts):
        since = ended if ended is not None else codec.now()
        return Outcome.RETRY_LATER, since + timedelta(seconds=kind.retry.delay(attempts))
    return outcome, None
