"""What crosses the channel between the node and a handler process, as frozen values: a union
per direction (:data:`FromChild`, :data:`ToChild`), matched by type on each side, never a
string tag. A job itself goes as :class:`~runner.tasks.worker.child.Job` (its records flat).

From the child: a report that needs no answer (:class:`Progressed`, :class:`Beat`), a request
the node answers (:class:`Check`, :class:`SaveCheckpoint`, :class:`Resume`,
:class:`ReadResults`, :class:`Spawn`, :class:`Complete`), and the handler's end (:class:`Returned`,
:class:`Raised`). From the node: the answer to a request (:class:`Answered`, or
:class:`Refused` with the exception the node's context raised, which the child raises)."""

from __future__ import annotations

import pickle
from dataclasses import dataclass

from runner.tasks.context import TaskCancelled


@dataclass(frozen=True, slots=True)
class Progressed:
    done: int
    total: int | None
    message: str


@dataclass(frozen=True, slots=True)
class Beat:
    details: object


@dataclass(frozen=True, slots=True)
class Check:
    pass


@dataclass(frozen=True, slots=True)
class SaveCheckpoint:
    state: object


@dataclass(frozen=True, slots=True)
class Resume:
    pass


@dataclass(frozen=True, slots=True)
class ReadResults:
    """``ctx.results()`` / ``ctx.inputs``: the dependencies' results from ``start`` on, at
    most ``limit`` (answered as a list of ``(task id, result)``)."""
    start: int
    limit: int


@dataclass(frozen=True, slots=True)
class Spawn:
    """``ctx.spawn(type, payload, key=..., **fields)``: answered with the child's id."""
    type: str
    payload: dict[str, object]
    key: str
    fields: dict[str, object]


@dataclass(frozen=True, slots=True)
class Complete:
    """``ctx.complete(write)``: the steps the effect was built of (gremlinpython bytecode)."""
    steps: list[list[object]]


@dataclass(frozen=True, slots=True)
class Returned:
    """The handler returned: its result as stored (JSON text, encoded and checked in the
    child: :mod:`runner.tasks.results`), None for none."""
    result: str | None = None


@dataclass(frozen=True, slots=True)
class Raised:
    """What the handler raised: pickled (None when it cannot be), its ``Type: text``, and its
    traceback in the child."""
    data: bytes | None
    text: str
    stack: str


@dataclass(frozen=True, slots=True)
class Answered:
    value: object


@dataclass(frozen=True, slots=True)
class Refused:
    exception: BaseException


#: a request the node answers
ChildRequest = Check | SaveCheckpoint | Resume | ReadResults | Spawn | Complete
FromChild = Progressed | Beat | ChildRequest | Returned | Raised
ToChild = Answered | Refused


def exception_of(raised: Raised) -> BaseException:
    """The handler's exception as the child sent it, with the child's traceback as a note."""
    exc: BaseException | None = None
    if raised.data is not None:
        try:
            exc = pickle.loads(raised.data)
        except Exception:
            exc = None
    if not isinstance(exc, BaseException):
        exc = RuntimeError(raised.text)
    exc.add_note(f"in the handler process:\n{raised.stack}")
    return exc


def crossing(exc: BaseException) -> BaseException:
    """``exc`` if it survives a pickle round trip (the child raises it), else a
    :class:`TaskCancelled` with its text (what a refused check or checkpoint means)."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return TaskCancelled(f"{type(exc).__name__}: {exc}")
