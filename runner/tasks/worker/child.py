"""The child side of process isolation: the loop a handler process runs, and the context its
handler gets (:class:`ChildContext`).

A child comes from the node's fork server (:mod:`runner.tasks.worker.isolated`) and runs one
attempt after another, each sent over its channel
(:class:`~runner.tasks.worker.channel.Channel`, on a ``multiprocessing`` socket pair) as a
:class:`Job`: the handler and payload model by module and name (imported here), the payload, the
task and attempt as the node claimed them (as plain values, :class:`~runner.tasks.worker.
channel.Flat`, built again when the handler first reads them). The node keeps the session, the
lock and every store write; what the handler asks of its context crosses the channel:

(each a frozen value of :mod:`runner.tasks.worker.frames`):

* ``progress``, ``heartbeat``: a message, no answer (the node throttles and writes them);
* ``check()``, ``checkpoint(state)``, ``resume``, ``inputs`` / ``results()`` (a page at a
  time): a request the node answers (a refusal comes back as the exception the node's
  context raised, e.g. ``TaskCancelled``);
* the handler's return value: checked against its annotation and encoded here (a model need
  not cross), sent with ``Returned``;
* ``complete(write)``: ``write`` is built here on a traversal of no graph and its steps are the
  request (:func:`~runner.store.effects.effect_steps`); the node adds them to its own
  ``complete`` (lock confirmed, fence guarded, one write) and answers as for ``check``;
* ``cancelled`` / ``cancel.wait()`` / ``raise_if_cancelled()``: read from memory shared with
  the node, no round trip: a flag the node sets when it cancels the attempt, and the session's
  deadline (a ``CLOCK_MONOTONIC`` instant, the same clock in every process), so a child of a
  stopped (SIGSTOP) node sees itself cancelled once that deadline passes;
* ``fence``, ``task``, ``attempt``, ``member_id``, ``fence_token``: values sent with the job;
* ``services`` does not cross: reading it raises :class:`~runner.errors.InvalidValue` naming
  the rule.

The child dies with its node: a thread of its own waits on a pidfd of the node and ends the
process the moment the node ends; and, for a handler that holds the GIL meanwhile, it asks the
kernel for SIGKILL when its parent (the fork server) dies (``PR_SET_PDEATHSIG``), which exits
as soon as the last copy of the write end of its "alive" pipe closes: the node's, on a kill -9
of the node (the child closes the copy ``multiprocessing`` gives it). A channel that ends
(EOF) ends an idle child too.

Failure behaviour: whatever the handler raises is sent back (pickled when it can be, else as
its type name and text) with its traceback; a child that cannot import the handler sends that
error. A crash (a signal, an exit) is seen by the node, not here.

Why one module: the child's loop, its token and its context are one process's life over one
channel; split, each would reach into the others' channel and job.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import pickle
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from multiprocessing import forkserver
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from runner.errors import InvalidValue
from runner.store import Attempt, Fence, Task
from runner.store.effects import effect_steps
from runner.tasks.context import TaskCancelled, TaskTimedOut, inputs_of
from runner.tasks.results import ResultType
from runner.tasks.worker.channel import Channel, Flat
from runner.tasks.worker.frames import (
    Beat,
    Check,
    ChildRequest,
    Complete,
    Progressed,
    Raised,
    ReadResults,
    Refused,
    Resume,
    Returned,
    SaveCheckpoint,
    Spawn,
    ToChild,
)

#: what a child gets instead of ``ctx.services``
NOT_ACROSS = ("is not available in a process-isolated handler: the node keeps the ZooKeeper "
              "session, the store and every service (docs/runner.md, \"Process isolation\")")


TASK = Flat(Task)
ATTEMPT = Flat(Attempt)


class Job(NamedTuple):
    """One attempt for a child to run (sent as a plain tuple)."""
    handler: tuple[str, str]  # module, qualified name
    model: tuple[str, str] | None  # the payload model, or None (a dict)
    payload: dict[str, Any]
    task: tuple[Any, ...]  # TASK.pack(task)
    attempt: tuple[Any, ...]  # ATTEMPT.pack(attempt)
    member_id: str
    token: int


class ChildToken:
    """The child's view of the attempt's cancellation token (see the module)."""

    def __init__(self, flag: Any, deadline: Any) -> None:
        self._flag = flag  # 0: running; 1: cancelled; 2: cancelled for a time limit
        self._deadline = deadline  # the session's deadline, CLOCK_MONOTONIC seconds

    @property
    def cancelled(self) -> bool:
        return bool(self._flag.value != 0 or time.monotonic() > self._deadline.value)

    @property
    def timed_out(self) -> bool:
        return bool(self._flag.value == 2)

    @property
    def reason(self) -> str:
        if self._flag.value == 2:
            return "it ran past its time limit"
        if self._flag.value == 1:
            return "cancelled by its node"
        return "the ZooKeeper session was lost (past its deadline)"

    def is_set(self) -> bool:
        return self.cancelled

    def wait(self, seconds: float) -> bool:
        end = time.monotonic() + seconds
        while not self.cancelled:
            left = end - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, 0.01))
        return True

    def raise_if_cancelled(self) -> None:
        if self.cancelled:
            raise (TaskTimedOut if self.timed_out else TaskCancelled)(self.reason)


class ChildContext:
    """What a handler in a child gets besides its payload (see the module)."""

    def __init__(self, job: Job, conn: Channel, token: ChildToken) -> None:
        self.member_id = job.member_id
        self.fence_token = job.token
        self.cancel = token
        self._conn = conn
        self._job = job
        self._task: Task | None = None
        self._attempt: Attempt | None = None

    @property
    def task(self) -> Task:
        if self._task is None:
            self._task = TASK.unpack(self._job.task)
        return self._task

    @property
    def attempt(self) -> Attempt:
        if self._attempt is None:
            self._attempt = ATTEMPT.unpack(self._job.attempt)
        return self._attempt

    @property
    def fence(self) -> Fence:
        return Fence(self.task.id, self.fence_token, self.attempt.id, self.task.resources)

    @property
    def services(self) -> Any:
        raise InvalidValue(f"ctx.services {NOT_ACROSS}")

    def complete(self, write: Callable[[Any], Any]) -> None:
        """``write`` is built here, on a traversal of no graph, and its steps are sent: the
        node adds them to its own ``complete``, under its guards, as one write."""
        self.cancel.raise_if_cancelled()
        steps = effect_steps(write)
        try:
            pickle.dumps(steps)
        except Exception as exc:
            raise InvalidValue(f"ctx.complete(write): the effect cannot be sent to the node "
                               f"({type(exc).__name__}: {exc}); build it from plain values "
                               "and steps (no lambdas)") from exc
        self._ask(Complete(steps))

    def progress(self, done: int, total: int | None = None, message: str = "") -> None:
        self._conn.send(Progressed(done, total, message))

    def heartbeat(self, details: Any = None) -> None:
        self._conn.send(Beat(details))

    def check(self) -> None:
        self.cancel.raise_if_cancelled()
        self._ask(Check())

    def checkpoint(self, state: Any) -> None:
        self.cancel.raise_if_cancelled()
        self._ask(SaveCheckpoint(state))

    @property
    def resume(self) -> Any:
        return self._ask(Resume())

    def spawn(self, type: str, payload: dict[str, Any] | None = None, *, key: str,
              **fields: Any) -> str:
        """As the node's ``ctx.spawn``: asked of the node, which writes the child."""
        self.cancel.raise_if_cancelled()
        return str(self._ask(Spawn(type, dict(payload or {}), key, dict(fields))))

    @property
    def inputs(self) -> dict[str, Any]:
        """As the node's ``ctx.inputs`` (:class:`~runner.tasks.context.TaskContext`)."""
        return inputs_of(self.task.id, self.results())

    def results(self, page: int = 200) -> Iterator[tuple[str, Any]]:
        """As the node's ``ctx.results()``: asked of the node a page at a time."""
        start = 0
        while True:
            got = self._ask(ReadResults(start, page))
            assert isinstance(got, list)
            yield from (tuple(item) for item in got)
            if len(got) < page:
                return
            start += len(got)

    def _ask(self, request: ChildRequest) -> object:
        self._conn.send(request)
        answer: ToChild = self._conn.recv()
        if isinstance(answer, Refused):
            raise answer.exception
        return answer.value


def _die_with_parent(parent: int) -> None:
    """SIGKILL when the fork server (this process's parent) dies: PR_SET_PDEATHSIG. And let
    the fork server die with the node: ``multiprocessing`` hands every child the write end of
    the pipe the server watches for its node's death (so that a child could start more
    processes through it), which kept the server, and so this child, alive after a kill -9 of
    the node for as long as the child lived: a child that hung lived for ever. A child never
    starts processes, so it closes its copy."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass
    alive = getattr(forkserver._forkserver, "_forkserver_alive_fd", None)
    if alive is not None:
        try:
            os.close(alive)
        except OSError:
            pass
        setattr(forkserver._forkserver, "_forkserver_alive_fd", None)  # noqa: B010
    if os.getppid() != parent:  # it died before the call
        os._exit(1)


def _watch_node(node: int) -> None:
    """End this process the moment the node ``node`` ends: a thread waiting on a pidfd of the
    node (Linux 5.3 and later), so the child does not wait for the fork server's own exit
    (tens of ms of interpreter shutdown) and the parent-death signal after it. A handler that
    holds the GIL keeps this thread from running; the parent-death signal, the kernel's, still
    comes."""
    try:
        fd = os.pidfd_open(node)
    except (AttributeError, OSError):
        return  # no pidfd here: the fork server's exit and the parent-death signal do it

    def wait() -> None:
        select.select([fd], [], [])
        os._exit(1)
    threading.Thread(target=wait, name="node-watch", daemon=True).start()


_RESOLVED: dict[tuple[str, str], Any] = {}
_RESULTS: dict[tuple[str, str], ResultType] = {}


def _result_type(where: tuple[str, str], handler: Callable[..., Any]) -> ResultType:
    """What the handler at ``where`` returns (its annotation read once per child)."""
    found = _RESULTS.get(where)
    if found is None:
        found = _RESULTS[where] = ResultType.of(handler)
    return found


def _resolve(where: tuple[str, str]) -> Any:
    """A handler or payload model by module and name (imported once per child)."""
    found = _RESOLVED.get(where)
    if found is None:
        found = _RESOLVED[where] = _lookup(where)
    return found


def _lookup(where: tuple[str, str]) -> Any:
    module, qualname = where
    value: Any = importlib.import_module(module)
    for part in qualname.split("."):
        value = getattr(value, part)
    return value


def main(conn: Connection, flag: Any, deadline: Any, node: int) -> None:
    """A child's life: run each job the node sends until the channel ends."""
    _die_with_parent(os.getppid())
    _watch_node(node)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the node's terminal's ^C is the node's
    token = ChildToken(flag, deadline)
    channel = Channel(conn)
    while True:
        try:
            job = Job(*channel.recv())
        except (EOFError, OSError):
            os._exit(0)
        try:
            handler = _resolve(job.handler)
            model = _resolve(job.model) if job.model is not None else None
            payload = model.model_validate(job.payload) if model is not None else job.payload
            context = ChildContext(job, channel, token)
            value = handler(context, payload)
            # encoded here, where its type is: a model need not cross the channel
            channel.send(Returned(_result_type(job.handler, handler).encode(
                context.task.type, value)))
        except BaseException as exc:
            channel.send(_portable(exc))
        sys.stdout.flush()


def _portable(exc: BaseException) -> Raised:
    """``exc`` pickled (None when it cannot be), its ``Type: text``, and its traceback."""
    text = f"{type(exc).__name__}: {exc}"
    stack = "".join(traceback.format_exception(exc))
    try:
        raw = pickle.dumps(exc)
        pickle.loads(raw)
        data: bytes | None = raw
    except Exception:
        data = None
    return Raised(data, text, stack)
