"""An attempt's end as the store takes it: :class:`Conclusion` (what the owner writes: the
attempt's end and the task's change), with its write plan :class:`AttemptEnd` made outside the
write slot by :func:`attempt_end`, and the other writes an end may be made of
(:data:`EndWrite`: an attempt closed alone, a task let go, a last effect, an attempt fenced off
by its own limit watch). Part of the store's port (:mod:`runner.store.api`): the worker writes
every one of them through :meth:`~runner.store.api.Store.write_ends`, and a driver turns each
into its guarded write."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from runner.errors import AttemptAlreadyFinished, InvalidValue
from runner.store import codec
from runner.store.model import Attempt, AttemptStatus, Progress, Task
from runner.store.traversal import Traversal

#: the property of a SUCCEEDED attempt that holds its handler's result (JSON text); read only
#: by what asks for a result (:meth:`~runner.store.api.AttemptLog.result`), never in an
#: attempt's row
RESULT = "attempt_result"


@dataclass(frozen=True)
class AttemptEnd:
    """The write plan of a RUNNING attempt's end: the properties to set (guarded by the
    attempt still being RUNNING) and the attempt it leaves."""
    attempt_id: str
    props: Mapping[str, str]
    attempt: Attempt


def attempt_end(attempt: Attempt, status: AttemptStatus, error: str | None = None,
                stack_trace: str | None = None, progress: str | None = None,
                ended: datetime | None = None, result: str | None = None) -> AttemptEnd:
    """The end of ``attempt`` as it was read, without reading it again: the write is guarded
    by its RUNNING status. ``progress``: the handler's last report not written yet
    (``progress_json``), written with the end; ``ended``: when the attempt ended (its handler
    returned; now when None), which may be a little before the write; ``result``: what its
    handler returned, as stored (JSON text: :data:`RESULT`), a SUCCEEDED attempt's only."""
    status = AttemptStatus(status)
    if status is AttemptStatus.RUNNING:
        raise InvalidValue("finish() needs a final status")
    if attempt.status is not AttemptStatus.RUNNING:
        raise AttemptAlreadyFinished(f"attempt {attempt.id} is already {attempt.status.value}")
    ended = ended if ended is not None else codec.now()
    doc: dict[str, object] = {
        "ended": codec.encode_time(ended),
        "duration_ms": int((ended - attempt.started_at).total_seconds() * 1000),
    }
    if error:
        doc["error"] = error
    if stack_trace:
        doc["stack"] = stack_trace
    props = {"attempt_status": status.value, "attempt_end": codec.encode_json(doc),
             # the UTC day it ended: recent ends are found from an index, not a scan of all
             "attempt_end_day": ended.strftime("%Y-%m-%d")}
    if progress is not None:
        props["attempt_progress"] = progress
    if result is not None:
        if status is not AttemptStatus.SUCCEEDED:
            raise InvalidValue(f"a {status.value} attempt has no result")
        props[RESULT] = result
    ended_attempt = dataclasses.replace(
        attempt, status=status, ended_at=codec.decode_time(str(doc["ended"])),
        duration_ms=int(str(doc["duration_ms"])), error=error or None,
        stack_trace=stack_trace or None,
        progress=progress_from_json(progress) if progress is not None else attempt.progress)
    return AttemptEnd(attempt.id, props, ended_attempt)


def progress_from_json(text: str) -> Progress | None:
    """The progress a handler reported, as ``attempt_progress`` holds it ("" when none)."""
    if not text:
        return None
    value = codec.decode_json(text)
    return Progress(int(value["done"]), int(value["total"]) if value["total"] is not None
                    else None, str(value["message"]), codec.decode_time(value["at"]))


@dataclass(frozen=True)
class Conclusion:
    """What an attempt came to, as its owner writes it: the attempt's end and the task's new
    state (``changes``), guarded by the owner's ``token``; ``task`` as the owner last read or
    wrote it. The one value an attempt's end travels as, from the handler's return through
    the group commit to the store (:meth:`Store.conclude_many`)."""
    end: AttemptEnd
    task: Task
    token: int
    changes: Mapping[str, object]

    @classmethod
    def of(cls, attempt: Attempt, status: AttemptStatus, task: Task,
           changes: Mapping[str, object], *, error: str | None = None,
           stack: str | None = None, progress: str | None = None,
           ended: datetime | None = None) -> Conclusion:
        """``attempt``'s end, guarded by the token it was claimed with (its fence)."""
        return cls(attempt_end(attempt, status, error, stack, progress, ended), task,
                   attempt.fence, changes)

    @classmethod
    def success(cls, attempt: Attempt, task: Task, changes: Mapping[str, object], *,
                result: str | None = None, progress: str | None = None,
                ended: datetime | None = None) -> Conclusion:
        """``attempt`` SUCCEEDED with its handler's ``result`` (JSON text; None: none),
        guarded by its fence."""
        return cls(attempt_end(attempt, AttemptStatus.SUCCEEDED, None, None, progress, ended,
                               result), task, attempt.fence, changes)

    @property
    def status(self) -> AttemptStatus:
        return self.end.attempt.status

    @property
    def size(self) -> int:
        """About how many bytes the write takes on the wire (what a group is capped by)."""
        return WRITE_OVERHEAD + sum(len(v) for v in self.end.props.values())

    @property
    def needs(self) -> tuple[str, ...]:
        """The resources the write is guarded by: a success needs them still held."""
        return self.task.resources if self.status is AttemptStatus.SUCCEEDED else ()


#: a handler's last effect, built on ``g`` and not run (``ctx.complete(write)``)
LastEffect = Callable[[Traversal], Traversal]


@dataclass(frozen=True)
class AttemptClose:
    """An attempt ended by its owner with nothing changed on its task (the attempt of a commit
    conflict before the next one; a fault of the task loop): guarded by the attempt being
    RUNNING only."""
    end: AttemptEnd


@dataclass(frozen=True)
class Release:
    """The task changed by its owner with no attempt ended (a retry not made: the task goes
    back as it stands); refused once ``token`` is not the task's."""
    task_id: str
    token: int
    changes: Mapping[str, object]


@dataclass(frozen=True)
class Completion:
    """A handler's last effect, its attempt SUCCEEDED and its task finished, as one guarded
    write (``ctx.complete()``)."""
    attempt: Attempt
    task: Task
    token: int
    effect: LastEffect


@dataclass(frozen=True)
class FenceOff:
    """The owner's own limit watch closing a RUNNING attempt whose handler ran past its time
    limit and grace (``status``, ``error``), the task's fence moved in the same write so that
    nothing the handler writes afterwards is accepted, the task changed as ``changes`` say."""
    task_id: str
    executor: str
    status: AttemptStatus
    error: str
    changes: Mapping[str, object]


#: what a write of an end is counted for besides its properties' text (its guards, the task's
#: changes, the request's framing): what :func:`write_size` adds
WRITE_OVERHEAD = 2048


#: every write an attempt's end is made of, from the worker: one entry point,
#: :meth:`~runner.store.api.Store.write_ends`
EndWrite = Conclusion | AttemptClose | Release | Completion | FenceOff


def write_size(write: EndWrite) -> int:
    """About how many bytes ``write`` takes in a request (a group commit caps its groups by
    it): a conclusion's properties (a result's text above all) and a fixed overhead."""
    return write.size if isinstance(write, Conclusion) else WRITE_OVERHEAD


@dataclass(frozen=True)
class EndWritten:
    """What an end's write left: the task as written (None when the write changed no task),
    the attempts it ended, and the members it released."""
    task: Task | None
    attempts: tuple[Attempt, ...] = ()
    #: workflow members the write made claimable (their last dependency succeeded): the
    #: writer wakes the scans for them
    released: tuple[Task, ...] = ()
