"""Process isolation (``@task(..., isolation="process")``): a handler run in a child process
of the node's own, so that a segfault, an out-of-memory kill or a C call that holds the GIL
for minutes costs its attempt, not the node.

**Where children come from.** ``multiprocessing``'s fork server: a fresh interpreter started
by exec (never a ``fork()`` of the threaded node), which imports the isolated types' modules
once and forks each child from itself. :class:`ChildPool` keeps the children and reuses them:
a child is replaced after its type's ``max_tasks_per_child`` attempts, after a crash, or when
its RSS is above its type's ``max_memory_mb`` after an attempt. At most one child per worker
runs at a time (a worker thread waits on its child).

**What stays in the node.** The session, the lock and every store write: the worker thread
that took the task sends the attempt to a child (:class:`~runner.tasks.worker.child.Job`) and
serves its context over the channel (:mod:`runner.tasks.worker.child` lists what crosses and
how): ``check``, ``checkpoint`` and ``complete`` (the effect's steps, built in the child) run
here, on the node's own context, and their answer (or the exception they raised) goes back.
The attempt's end is written here, as for any handler, with the same fence.

**Cancellation and limits.** The node writes, about every 20 ms, into memory shared with each
busy child: a flag (cancelled, or cancelled for a time limit) and the session's deadline. A
child that ignores its cancellation is stopped ``grace`` seconds later (its type's, default
10 s): SIGTERM, then SIGKILL a second after; the attempt ends as the cancellation says
(TIMED_OUT for a time limit, else CANCELLED_BY_SYSTEM). A session lost (LOST, or past its
deadline) kills the child at once, before the attempt's end is written and its lock let go.

**Crashes.** A child that dies (a signal, an exit) ends its attempt FAILED with
:class:`HandlerCrashed` ("handler process killed by signal 11 (SIGSEGV)"); an RSS above its
type's ``max_memory_mb`` while it runs (read from ``/proc`` every 0.2 s: the node's watchdog,
not ``RLIMIT_AS``) kills it: "handler used 612 MiB, limit 512". The retry policy applies as
for any failure; the node and its other tasks run on.

Failure behaviour: a child that cannot be started (the fork server gone) raises
``HandlerCrashed`` for that attempt; the next attempt starts a new server.

Why one module: the pool, the serving of one attempt and the reading of a child's death share
one child's state (its pipe, its shared flag and deadline, its runs): split, each part would
reach into the others' child.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import forkserver
from multiprocessing.connection import Connection
from typing import Any

from runner.errors import HandlerCrashed
from runner.store.gremlin.guards import replayed
from runner.tasks.context import TaskCancelled, TaskContext, TaskTimedOut
from runner.tasks.registry import TaskType
from runner.tasks.worker.child import Job
from runner.tasks.worker.child import main as child_main
from runner.tasks.worker.running import AttemptSession

log = logging.getLogger("latchwork.tasks")

#: seconds between a SIGTERM to a child that ignores its cancellation and its SIGKILL
TERM_WAIT = 1.0
#: seconds between two reads of a busy child's RSS
RSS_EVERY = 0.2
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(eq=False)
class _Child:
    proc: Any  # a multiprocessing Process
    conn: Connection
    flag: Any  # a shared byte: 0 running, 1 cancelled, 2 cancelled for a time limit
    deadline: Any  # a shared double: the session's deadline (CLOCK_MONOTONIC)
    runs: int = 0
    ctx: TaskContext | None = None  # the attempt it runs now

    def rss_mib(self) -> float:
        try:
            with open(f"/proc/{self.proc.pid}/statm") as f:
                return int(f.read().split()[1]) * PAGE / 2**20
        except (OSError, IndexError, ValueError):
            return 0.0

    def kill(self) -> None:
        try:
            os.kill(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.join(5)


def _where(value: Any) -> tuple[str, str]:
    return value.__module__, value.__qualname__


class ChildPool:
    """The node's handler processes (see the module)."""

    def __init__(self, session: AttemptSession, member_id: str, preload: list[str]) -> None:
        self.session = session
        self.member_id = member_id
        self._mp = multiprocessing.get_context("forkserver")
        self._mp.set_forkserver_preload(["runner.tasks.worker.child", *preload])
        self._idle: list[_Child] = []
        self._busy: set[_Child] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._monitor: threading.Thread | None = None
        self._working = threading.Event()  # set while a child runs an attempt

    def start(self) -> None:
        """Start the fork server now (a child's first start then costs a fork, not an
        interpreter's start) and the thread that keeps busy children's shared memory."""
        forkserver.ensure_running()
        self._monitor = threading.Thread(target=self._watch, daemon=True,
                                         name=f"children-{self.member_id}")
        self._monitor.start()

    def close(self) -> None:
        """Kill every child (a running handler's attempt was cancelled before)."""
        self._closed.set()
        self._working.set()
        with self._lock:
            children, self._idle, self._busy = [*self._idle, *self._busy], [], set()
        for child in children:
            child.kill()

    # -- running an attempt -------------------------------------------------------------------
    def run(self, ctx: TaskContext, kind: TaskType) -> None:
        """Run ``kind``'s handler on ``ctx``'s attempt in a child, serving its context until it
        ends; raises what the handler raised (or :class:`HandlerCrashed`, or the token's
        cancellation once it had to be killed), returns when it returned."""
        child = self._take(ctx)
        healthy = False
        try:
            model = kind.payload_model
            child.conn.send(Job(_where(kind.handler), _where(model) if model else None,
                                dict(ctx.task.payload), ctx.task, ctx.attempt, ctx.member_id,
                                ctx.fence_token))
            raised = self._serve(child, ctx, kind)
            healthy = True  # it answered: returned or raised, it can run another
        finally:
            self._give_back(child, kind, healthy)
        if raised is not None:
            raise raised

    def _take(self, ctx: TaskContext) -> _Child:
        with self._lock:
            child = self._idle.pop() if self._idle else None
        if child is None or not child.proc.is_alive():
            if child is not None:
                child.kill()
            child = self._spawn()
        child.flag.value = 0
        child.deadline.value = self._deadline(ctx)
        child.ctx = ctx
        with self._lock:
            self._busy.add(child)
        self._working.set()
        return child

    def _spawn(self) -> _Child:
        ours, theirs = self._mp.Pipe()
        flag = self._mp.RawValue("b", 0)
        deadline = self._mp.RawValue("d", float("inf"))
        proc = self._mp.Process(target=child_main, args=(theirs, flag, deadline, os.getpid()),
                                daemon=True, name="latchwork-handler")
        try:
            proc.start()
        except OSError as exc:
            raise HandlerCrashed(f"the handler process could not be started: {exc}") from exc
        theirs.close()
        return _Child(proc, ours, flag, deadline)

    def _give_back(self, child: _Child, kind: TaskType, healthy: bool) -> None:
        with self._lock:
            self._busy.discard(child)
        child.ctx = None
        child.runs += 1
        isolation = kind.isolation
        limit = isolation.max_memory_mb if isolation is not None else None
        keep = (healthy and child.proc.is_alive() and not self._closed.is_set()
                and (isolation is None or child.runs < isolation.max_tasks_per_child)
                and (limit is None or child.rss_mib() <= limit))
        if keep:
            with self._lock:
                self._idle.append(child)
            return
        child.kill()
        if not self._closed.is_set():  # its successor started now, not when a task waits
            threading.Thread(target=self._replace, daemon=True,
                             name=f"child-start-{self.member_id}").start()

    def _replace(self) -> None:
        try:
            child = self._spawn()
        except HandlerCrashed as exc:
            log.warning("member %s: a handler process could not be started: %s",
                        self.member_id, exc)
            return
        with self._lock:
            if self._closed.is_set():
                child.kill()
            else:
                self._idle.append(child)

    def _serve(self, child: _Child, ctx: TaskContext, kind: TaskType) -> BaseException | None:
        """Answer the child until its handler ends: None when it returned, what it raised when
        it raised; a crash, or a kill for its memory or its cancellation, raises here."""
        signalled: float | None = None
        rss_at = 0.0
        limit = kind.isolation.max_memory_mb if kind.isolation is not None else None
        while True:
            try:
                ready = child.conn.poll(0.02)
                message = child.conn.recv() if ready else None
            except (EOFError, OSError):
                raise self._crashed(child, ctx) from None
            if message is not None:
                what, value = message
                if what == "done":
                    return None
                if what == "raised":
                    return _exception(*value)
                self._answer(child, ctx, what, value)
                continue
            now = time.monotonic()
            if not child.proc.is_alive():
                raise self._crashed(child, ctx)
            if limit is not None and now - rss_at >= RSS_EVERY:
                rss_at = now
                used = child.rss_mib()
                if used > limit:
                    child.kill()
                    raise HandlerCrashed(f"handler used {used:.0f} MiB, limit {limit:g}")
            if ctx.cancel.cancelled:
                child.flag.value = 2 if ctx.cancel.timed_out else 1
                if ctx.cancel.session_lost:  # its lock may be another's: never a moment more
                    child.kill()
                    ctx.cancel.raise_if_cancelled()
                if signalled is None:
                    signalled = now
                elif now - signalled > kind.limits.grace:
                    self._stop(child, ctx)
                    ctx.cancel.raise_if_cancelled()

    def _answer(self, child: _Child, ctx: TaskContext, what: str, value: Any) -> None:
        if what == "progress":
            ctx.progress(*value)
            return
        if what == "beat":
            try:
                ctx.heartbeat(value)
            except Exception as exc:  # details that are not JSON: said, not fatal
                log.warning("member %s: task %s: heartbeat details refused: %s",
                            self.member_id, ctx.task.id, exc)
            return
        calls: dict[str, Callable[[], Any]] = {
            "check": ctx.check, "checkpoint": lambda: ctx.checkpoint(value),
            "resume": lambda: ctx.resume, "complete": lambda: ctx.complete(replayed(value))}
        try:
            child.conn.send(("ok", calls[what]()))
        except Exception as exc:
            child.conn.send(("raise", _crossing(exc)))

    def _stop(self, child: _Child, ctx: TaskContext) -> None:
        """SIGTERM, then SIGKILL: a child that ignored its cancellation for its grace."""
        log.warning("member %s: task %s: its handler process ignored its cancellation (%s); "
                    "stopping it", self.member_id, ctx.task.id, ctx.cancel.reason)
        try:
            os.kill(child.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        child.proc.join(TERM_WAIT)
        if child.proc.is_alive():
            child.kill()

    def _crashed(self, child: _Child, ctx: TaskContext) -> BaseException:
        """What a child's death means for its attempt."""
        child.proc.join(2)
        if child.proc.is_alive():
            child.kill()
        if ctx.cancel.cancelled:
            return (TaskTimedOut if ctx.cancel.timed_out else TaskCancelled)(ctx.cancel.reason)
        code = child.proc.exitcode
        if code is not None and code < 0:
            try:
                name = f" ({signal.Signals(-code).name})"
            except ValueError:
                name = ""
            return HandlerCrashed(f"handler process killed by signal {-code}{name}")
        return HandlerCrashed(f"handler process exited with code {code}")

    def _deadline(self, ctx: TaskContext) -> float:
        return float("inf") if ctx.cancel.unbound else self.session.deadline

    def _watch(self) -> None:
        """Keep each busy child's shared flag and deadline (a node paused, SIGSTOP, stops
        this too: its children see the deadline pass)."""
        while not self._closed.wait(0.02):
            with self._lock:
                busy = list(self._busy)
                if not busy:
                    self._working.clear()
            if not busy:  # nothing to keep: no wake-up every 20 ms on an idle node
                self._working.wait(1.0)
                continue
            for child in busy:
                ctx = child.ctx
                if ctx is None:
                    continue
                if ctx.cancel.cancelled:
                    child.flag.value = 2 if ctx.cancel.timed_out else 1
                elif not ctx.cancel.unbound:
                    child.deadline.value = self.session.deadline


def _exception(data: bytes | None, text: str, stack: str) -> BaseException:
    """The handler's exception as the child sent it, with the child's traceback as a note."""
    exc: BaseException | None = None
    if data is not None:
        try:
            exc = pickle.loads(data)
        except Exception:
            exc = None
    if not isinstance(exc, BaseException):
        exc = RuntimeError(text)
    exc.add_note(f"in the handler process:\n{stack}")
    return exc


def _crossing(exc: BaseException) -> BaseException:
    """``exc`` if it survives a pickle round trip (the child raises it), else a
    :class:`TaskCancelled` with its text (what a refused check or checkpoint means)."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return TaskCancelled(f"{type(exc).__name__}: {exc}")
