"""What a handler gets besides its payload: :class:`TaskContext` and its :class:`CancelToken`.

``ctx.check()`` right before an external effect, ``ctx.fence`` on every store write the handler
makes, ``ctx.complete(write)`` for a last graph effect written with the attempt's success. A
handler that raises :class:`TaskCancelled` (or whose token was cancelled: shutdown, a lost lock
or session, an operator's cancel) ends its attempt CANCELLED_BY_SYSTEM; one that raises
:class:`TaskConflict` (or the store's CommitConflict) is retried after a backoff. Both are
control flow, not errors (see :mod:`runner.errors`). A workflow member reads what it depends
on through ``ctx.inputs`` / ``ctx.results()``.

Why one module: the context is what a handler sees, one class with its token and services;
split, a handler's one API would be spread over modules that import each other.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from coord import Session
from runner.errors import (
    AttemptAlreadyFinished,
    InvalidValue,
    StaleFencingToken,
    StoreUnavailable,
)
from runner.store import Attempt, Fence, Task, codec

if TYPE_CHECKING:
    from runner.store import Store

#: the most dependencies ``ctx.inputs`` reads at once (a join over more pages with
#: ``ctx.results()``)
INPUTS_LIMIT = 100


class TaskConflict(Exception):
    """A commit conflict inside a handler: retried automatically with backoff."""


class TaskDeclined(Exception):
    """Raised by a handler that must not run on this node now: the attempt ends
    CANCELLED_BY_SYSTEM "declined: ...", the task goes back unchanged and this node leaves it to
    the others for a while (control flow, not an error)."""


class TaskCancelled(Exception):
    """The handler noticed its cancellation token and stopped."""


class TaskTimedOut(TaskCancelled):
    """An attempt ran past its type's ``timeout``, or beat no heartbeat within its
    ``heartbeat_timeout``: its token was cancelled for it and the attempt ends TIMED_OUT. A
    failure the type's retry policy may retry (``retry_on=(TaskTimedOut,)``; the default,
    ``Exception``, retries it too)."""


#: the reason a token bound to a session gives once that session expired
SESSION_EXPIRED = "the ZooKeeper session was lost (past its deadline)"


class CancelToken:
    """Cancellation of one attempt: set by the task loop (shutdown, a lost lock or session, an
    operator's cancel), read by the handler.

    A token bound to a ``session`` (the one its task's lock was taken on) also reads that
    session's deadline itself whenever it is asked (:attr:`cancelled`, :meth:`wait`,
    :meth:`raise_if_cancelled`): a monotonic clock read, no server call. So a handler that
    runs first after its process was paused past the session sees itself cancelled on its
    first look, before the session's watchdog thread has declared the session LOST."""

    def __init__(self, session: Session | None = None) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[str], None]] = []
        self.reason = ""
        #: cancelled for a time limit (``timeout``, ``heartbeat_timeout``): the attempt ends
        #: TIMED_OUT, not CANCELLED_BY_SYSTEM
        self.timed_out = False
        self._session = session
        self._session_id = session.session_id if session is not None else None

    def cancel(self, reason: str, *, timed_out: bool = False) -> None:
        """Cancel with ``reason`` (the first cancellation wins); ``timed_out``: for a time
        limit."""
        with self._lock:
            if self._event.is_set():
                return
            self.reason = reason
            self.timed_out = timed_out
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(reason)

    def on_cancel(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call ``callback(reason)`` on cancellation (at once if cancelled already); the
        returned function unregisters it. Used to reach work outside Python, e.g. a Spark job
        group."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return lambda: self._discard(callback)
        callback(self.reason)
        return lambda: None

    def _discard(self, callback: Callable[[str], None]) -> None:
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

    @property
    def cancelled(self) -> bool:
        if self._event.is_set():
            return True
        if self._session is not None and self._session.expired(self._session_id):
            self.cancel(SESSION_EXPIRED)
            return True
        return False

    @property
    def unbound(self) -> bool:
        """Not bound to a session (a stub's, a test's): only :meth:`cancel` cancels it."""
        return self._session is None

    @property
    def session_lost(self) -> bool:
        """The session its lock was taken on is gone (LOST, or past its deadline): the lock
        may be someone else's already."""
        return self._session is not None and self._session.expired(self._session_id)

    def is_set(self) -> bool:
        """The same as :attr:`cancelled` (so a token stops what a ``threading.Event`` would)."""
        return self.cancelled

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True as soon as the token is cancelled (a bound session's
        deadline passing included, however long the process was paused meanwhile)."""
        if self._session is None:
            return self._event.wait(seconds)
        end = time.monotonic() + seconds
        while not self.cancelled:
            left = end - time.monotonic()
            if left <= 0:
                return False
            # wake at the session's deadline at the latest (it moves on with every reply)
            self._event.wait(min(left, max(0.005, self._session.deadline - time.monotonic())))
        return True

    def raise_if_cancelled(self) -> None:
        if self.cancelled:
            raise (TaskTimedOut if self.timed_out else TaskCancelled)(self.reason)


S = TypeVar("S")


class Services:
    """What a node gives its handlers besides their context, found by type:
    ``ctx.services.get(Session)``, ``ctx.services.find(Pipeline)`` (typed: the result is of the
    class asked for). The runner knows none of the domain's classes; the node registers
    instances, one per class (a subclass instance is found by its base class too)."""

    def __init__(self, *values: object) -> None:
        self._values = list(values)

    def add(self, value: object) -> None:
        """Give handlers one more service (a part built after the others)."""
        self._values.append(value)

    def find(self, kind: type[S]) -> S | None:
        """The service of class ``kind``, or None when this node has none."""
        for value in self._values:
            if isinstance(value, kind):
                return value
        return None

    def get(self, kind: type[S]) -> S:
        """The service of class ``kind``; :class:`LookupError` naming it when there is none."""
        value = self.find(kind)
        if value is None:
            raise LookupError(f"this node gives its handlers no {kind.__name__}")
        return value


def inputs_of(task_id: str, results: Iterator[tuple[str, Any]]) -> dict[str, Any]:
    """``ctx.inputs`` of task ``task_id`` from its dependencies' ``results`` (the node's
    context and a handler process's alike): at most :data:`INPUTS_LIMIT` of them."""
    found: dict[str, Any] = {}
    for dep, value in results:
        if len(found) == INPUTS_LIMIT:
            raise InvalidValue(f"task {task_id} depends on more than {INPUTS_LIMIT} tasks: "
                               "page through their results with ctx.results()")
        found[dep] = value
    return found


@dataclass
class TaskContext:
    """What a handler gets besides its payload.

    ``check()`` right before an external effect, and ``fence`` on every store write the handler
    makes (``store.fenced_write(ctx.fence, ...)``, ``ontologies.load(..., fence=ctx.fence)``):
    together they keep an owner that lost the task (a long pause, a partition, an operator's
    cancel) from leaving an effect after someone else took over. See docs/runner.md for the
    window that remains for systems that cannot check a token.
    """
    task: Task
    attempt: Attempt
    member_id: str
    fence_token: int
    cancel: CancelToken
    store: Store
    services: Services = field(default_factory=Services)
    checker: Callable[[], None] | None = None
    completer: Callable[[Callable[[Any], Any]], None] | None = None
    reporter: Callable[[int, int | None, str], None] | None = None
    #: the limit watch's beat of this attempt (None: its type has no limit to watch)
    beater: Callable[[Any], None] | None = None
    #: ``ctx.spawn``'s writer (the execution's: it validates the child's type and payload)
    spawner: Callable[[str, dict[str, Any], str, dict[str, Any]], str] | None = None
    completed: bool = False
    #: the task's last checkpoint as this attempt knows it (read at the first look)
    _resume: Any = field(default=None, repr=False)
    _resume_read: bool = field(default=False, repr=False)

    def _out_of_reach(self, what: str, exc: StoreUnavailable) -> NoReturn:
        """A store outage under ``checkpoint`` or ``resume``: no fault of the handler, so a
        cancellation (the attempt ends CANCELLED_BY_SYSTEM and the task runs again from its
        last committed checkpoint), not a failure that would stop the task."""
        reason = f"{what} ({exc})"
        self.cancel.cancel(reason)
        raise TaskCancelled(reason) from exc

    def heartbeat(self, details: Any = None) -> None:
        """Say the attempt is alive (and, with ``details``, JSON, what it is at). A type with
        ``heartbeat_timeout`` takes an attempt that has not beaten within it as hung: its
        token is cancelled and it ends TIMED_OUT. The beat is a clock read on this node (no
        write); the last details are written on the attempt at most every
        ``heartbeat_persist`` seconds, by the node, not in the handler's time. Details that
        are not JSON raise :class:`~runner.errors.InvalidValue`. Cheap: call it in the loop."""
        if details is not None:
            codec.encode_json(details)  # InvalidValue now, not in the writer's thread
        if self.beater is not None:
            self.beater(details)

    @property
    def resume(self) -> Any:
        """The task's last committed checkpoint (:meth:`checkpoint`): what an earlier attempt
        of this task (on any node, killed -9, timed out or failed) got to, or this attempt's
        own once it committed one; None when there is none (the first attempt, or after
        ``task reactivate --fresh``). One store read, at the first look."""
        if not self._resume_read:
            try:
                found = self.store.checkpoints.read(self.task.id)
            except StoreUnavailable as exc:  # no fault of the handler: the task runs again
                self._out_of_reach("its checkpoint could not be read", exc)
            self._resume = None if found is None else found.state
            self._resume_read = True
        return self._resume

    def spawn(self, type: str, payload: dict[str, Any] | None = None, *, key: str,
              **fields: Any) -> str:
        """Make a child task of ``type`` with ``payload`` (and a submit's ``fields``:
        ``priority``, ``resources``, ...), which starts at once; its id, made from this task's
        id and ``key`` (required): a retried attempt that spawns again with the same keys finds
        the children an earlier attempt made instead of making new ones. This task's dependants
        (a workflow's next steps) start only once it and every child it spawned succeeded, and
        read the children's results with its own (``ctx.inputs``). Fenced like the attempt's
        end: an attempt that lost its task spawns nothing and gets :class:`TaskCancelled`; an
        unknown type or an invalid payload raises its error, nothing written."""
        if not key:
            raise InvalidValue("ctx.spawn needs a key: the child's identity under this task")
        if self.spawner is None:
            raise InvalidValue("this context cannot spawn (no task loop runs it)")
        self.cancel.raise_if_cancelled()
        return self.spawner(type, dict(payload or {}), key, dict(fields))

    @property
    def inputs(self) -> dict[str, Any]:
        """The results of what this workflow member depends on, by their task ids (a chain's
        step: the one before; a join: its group's members, at most :data:`INPUTS_LIMIT`, else
        page with :meth:`results`). A dependency that returned nothing, or was skipped
        (``task skip``), is absent. Read from the store at each look; never part of the
        payload. Empty for a task of its own."""
        return inputs_of(self.task.id, self.results())

    def results(self, page: int = 200) -> Iterator[tuple[str, Any]]:
        """``(task id, result)`` of every dependency of this member that succeeded with a
        result, read ``page`` at a time (a join over 10,000 members holds one page at once);
        see :attr:`inputs`."""
        deps = self.store.workflows.depends_on([self.task.id]).get(self.task.id, [])
        for at in range(0, len(deps), page):
            chunk = deps[at:at + page]
            found = self.store.attempts.results(chunk)
            for task_id in chunk:
                if task_id in found:
                    yield task_id, codec.decode_json(found[task_id].text)

    def checkpoint(self, state: Any) -> None:
        """Commit ``state`` (JSON, at most 64 KiB: a cursor, an offset, the last key done)
        as where the next attempt of this task resumes (``ctx.resume``). Durable when it
        returns: one store write, fenced like the attempt's end, so an attempt that lost its
        task (another owner, the reaper, an operator) writes nothing and gets
        :class:`TaskCancelled` (its token cancelled with the reason). A state that is not JSON
        or is too big raises :class:`~runner.errors.InvalidValue`, nothing written. Commit
        after the work it covers is done: work after the last checkpoint runs again on a
        retry, work before it does not."""
        self.cancel.raise_if_cancelled()
        try:
            self.store.checkpoints.commit(self.fence, self.attempt.seq, state)
        except (StaleFencingToken, AttemptAlreadyFinished) as exc:
            reason = f"its checkpoint was refused: {exc}"
            self.cancel.cancel(reason)
            raise TaskCancelled(reason) from exc
        except StoreUnavailable as exc:  # written or not cannot be known: the task runs again
            self._out_of_reach("the graph was out of reach at its checkpoint", exc)
        # what a later read gives back (a copy: the handler may go on changing its own)
        self._resume, self._resume_read = codec.decode_json(codec.encode_json(state)), True

    def progress(self, done: int, total: int | None = None, message: str = "") -> None:
        """Report how far the attempt is (``done`` of ``total``, None: unknown), shown by
        ``task show``, ``task list`` and ``latchwork top``. Cheap to call often: writes are
        throttled to about one a second and the last value wins (see
        :mod:`runner.tasks.progress`)."""
        if self.reporter is not None:
            self.reporter(done, total, message)

    @property
    def fence(self) -> Fence:
        """This attempt's fencing token, for store writes that must be refused once it is
        stale, or once another attempt claimed one of the task's resources."""
        return Fence(self.task.id, self.fence_token, self.attempt.id, self.task.resources)

    def check(self) -> None:
        """Raise :class:`TaskCancelled` unless this attempt still owns its task.

        Checks the cancellation token, then (from the task loop) that the ZooKeeper session is
        CONNECTED, that the lock node still exists with this attempt's czxid (one ZooKeeper
        read) and that the token is still the task's (one store read). A failed check also
        cancels the token, so the attempt ends CANCELLED_BY_SYSTEM with the reason.
        """
        self.cancel.raise_if_cancelled()
        if self.checker is not None:
            self.checker()

    def complete(self, write: Callable[[Any], Any]) -> None:
        """Write the handler's final graph effect together with the attempt's SUCCEEDED and
        the task's finish, as one traversal guarded by this attempt's fence: killed before
        it, neither happened (the task runs again); after it, both did, so the effect is
        applied once even when the owner dies right after it.

        ``write(g)`` builds the effect on ``g`` and returns it without running it:
        ``lambda g: g.add_v("invoice").property("n", 7)``, or ``g.V().has(...).property(...)``;
        ``.iterate()`` and the like raise :class:`~runner.errors.InvalidValue` (one traversal
        is what stays atomic on every backend, a server without transactions included:
        docs/graph.md). Raises :class:`TaskCancelled`, nothing written, once the attempt was
        closed by someone else or the fence moved. Return right after it: the attempt is
        already concluded."""
        self.cancel.raise_if_cancelled()
        if self.completer is None:
            raise RuntimeError("complete() needs the task loop")
        self.completer(write)
        self.completed = True
