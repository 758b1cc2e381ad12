"""Process isolation (``@task(..., isolation="process")``): a handler run in a child process
of the node's own, so that a segfault, an out-of-memory kill or a C call that holds the GIL
for minutes costs its attempt, not the node.

**Where children come from.** ``multiprocessing``'s fork server: a fresh interpreter started
by exec (never a ``fork()`` of the threaded node), which imports the isolated types' modules
once and forks each child from itself. :class:`ChildPool` keeps the children and reuses them:
a child is replaced after its type's ``max_tasks_per_child`` attempts (its successor starts
with its last attempt, so no attempt waits for a start), after a crash, or when its RSS is above
its type's ``max_memory_mb`` after an attempt; a child that leaves is ended off the worker's
path. At most one child per worker runs at a time (a worker thread waits on its child).

**What stays in the node.** The session, the lock and every store write: the worker thread
that took the task sends the attempt to a child (:class:`~runner.tasks.worker.child.Job`) and
serves its context over the channel (:mod:`runner.tasks.worker.child` lists what crosses and
how): ``check``, ``checkpoint`` and ``complete`` (the effect's steps, built in the child) run
here, on the node's own context, and their answer (or the exception they raised) goes back.
The attempt's end is written here, as for any handler, with the same fence.

**Cancellation and limits.** A worker running an isolated attempt only waits on its child's
channel (one blocking read per message: no polling, no per-attempt liveness check). One keeper
thread per node does the rest: it writes into memory shared with each busy child a flag
(cancelled, or cancelled for a time limit: at once, from the token's callback) and the session's
deadline (every 0.1 s at most apart, and at the deadline itself). A child that ignores its
cancellation is stopped ``grace`` seconds later (its type's, default 10 s): SIGTERM, then
SIGKILL a second after; the attempt ends as the cancellation says (TIMED_OUT for a time limit,
else CANCELLED_BY_SYSTEM). A session lost (LOST, or past its deadline) kills the child at once,
before the attempt's end is written and its lock let go: its worker sees the channel end, and
only then ends the attempt.

**Crashes.** A child that dies (a signal, an exit) ends its attempt FAILED with
:class:`HandlerCrashed` ("handler process killed by signal 11 (SIGSEGV)"); an RSS above its
type's ``max_memory_mb`` while it runs (read from ``/proc`` every 0.2 s by the keeper: the
node's watchdog, not ``RLIMIT_AS``) kills it: "handler used 612 MiB, limit 512". A child that
dies while a process it forked still holds its channel is seen by the keeper (its exit) and its
channel shut, so its worker never waits on a dead child. The retry policy applies as
for any failure; the node and its other tasks run on.

Failure behaviour: a child that cannot be started (the fork server gone) raises
``HandlerCrashed`` for that attempt; the next attempt starts a new server.

Why one module: the pool, the serving of one attempt and the reading of a child's death share
one child's state (its pipe, its shared flag and deadline, its runs): split, each part would
reach into the others' child.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing import forkserver
from typing import Any

from runner.errors import HandlerCrashed
from runner.store.effects import replayed
from runner.tasks.context import TaskCancelled, TaskContext, TaskTimedOut
from runner.tasks.registry import TaskType
from runner.tasks.worker.channel import Channel
from runner.tasks.worker.child import ATTEMPT, TASK, Job
from runner.tasks.worker.child import main as child_main
from runner.tasks.worker.children import Busy, Child
from runner.tasks.worker.frames import (
    Answered,
    Beat,
    Check,
    ChildRequest,
    FromChild,
    Progressed,
    Raised,
    ReadResults,
    Refused,
    Resume,
    Returned,
    SaveCheckpoint,
    Spawn,
    ToChild,
    crossing,
    exception_of,
)
from runner.tasks.worker.running import AttemptSession

log = logging.getLogger("latchwork.tasks")

#: seconds between a SIGTERM to a child that ignores its cancellation and its SIGKILL
TERM_WAIT = 1.0
#: seconds between two reads of a busy child's RSS
RSS_EVERY = 0.2
#: seconds between two turns of the keeper over busy children at most (it also wakes on a
#: cancellation and when a child's next step is due)
KEEP_EVERY = 0.1


def _where(value: Any) -> tuple[str, str]:
    return value.__module__, value.__qualname__


class ChildPool:
    """The node's handler processes (see the module)."""

    def __init__(self, session: AttemptSession, member_id: str, preload: list[str]) -> None:
        self.session = session
        self.member_id = member_id
        self._mp = multiprocessing.get_context("forkserver")
        self._mp.set_forkserver_preload(["runner.tasks.worker.child", *preload])
        self._idle: list[Child] = []
        self._busy: set[Child] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._keeper: threading.Thread | None = None
        self._working = threading.Event()  # set while a child runs an attempt
        self._nudge = threading.Event()  # an attempt was cancelled: the keeper looks now

    def start(self) -> None:
        """Start the fork server now (a child's first start then costs a fork, not an
        interpreter's start) and the keeper of busy children."""
        forkserver.ensure_running()
        self._keeper = threading.Thread(target=self._keep_all, daemon=True,
                                        name=f"children-{self.member_id}")
        self._keeper.start()

    def close(self) -> None:
        """Kill every child (a running handler's attempt was cancelled before)."""
        self._closed.set()
        self._working.set()
        self._nudge.set()
        with self._lock:
            children, self._idle, self._busy = [*self._idle, *self._busy], [], set()
        for child in children:
            child.kill()

    # -- running an attempt (the worker's thread) ---------------------------------------------
    def run(self, ctx: TaskContext, kind: TaskType) -> str | None:
        """Run ``kind``'s handler on ``ctx``'s attempt in a child, serving its context until it
        ends; raises what the handler raised (or :class:`HandlerCrashed`, or the token's
        cancellation once it had to be killed), returns its result (encoded in the child)
        when it returned."""
        model = kind.payload_model
        job = Job(_where(kind.handler), _where(model) if model else None, ctx.task.payload,
                  TASK.pack(ctx.task), ATTEMPT.pack(ctx.attempt), ctx.member_id,
                  ctx.fence_token)
        child = self._take(ctx, kind, job)
        healthy = False
        try:
            ended = self._serve(child, ctx)
            healthy = True  # it answered: returned or raised, it can run another
        finally:
            self._give_back(child, kind, healthy)
        if isinstance(ended, BaseException):
            raise ended
        return ended.result

    def _take(self, ctx: TaskContext, kind: TaskType, job: Job) -> Child:
        """An idle child (or a new one) that has been sent ``job``. An idle child that died
        meanwhile is found by its broken channel, and its successor takes the job."""
        with self._lock:
            child = self._idle.pop() if self._idle else None
        for _ in range(2):
            if child is None:
                child = self._spawn()
            child.flag.value = 0
            child.deadline.value = self._deadline(ctx)
            try:
                child.channel.send(tuple(job))
                break
            except OSError:
                child.kill()
                child = None
        if child is None:
            raise HandlerCrashed("no handler process took the attempt (each died at once)")
        busy = Busy(ctx, kind)
        with self._lock:
            child.busy = busy
            self._busy.add(child)
        busy.forget = ctx.cancel.on_cancel(self._on_cancel(child, ctx))
        if not self._working.is_set():
            self._working.set()
        isolation = kind.isolation
        if (isolation is not None and child.runs + 1 >= isolation.max_tasks_per_child
                and not child.successor_started):
            # its last attempt: its successor starts now, so that the next attempt does not
            # wait for a process to start (a wave of children reaching their limit together
            # cost each one a start on its worker's path)
            child.successor_started = True
            self._in_background(self._replace)
        return child

    def _spawn(self) -> Child:
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
        return Child(proc, Channel(ours), flag, deadline)

    def _give_back(self, child: Child, kind: TaskType, healthy: bool) -> None:
        busy = child.busy
        killed_for = busy.killed_for if busy is not None else None
        if busy is not None and busy.forget is not None:
            busy.forget()
        with self._lock:
            self._busy.discard(child)
            child.busy = None
        child.runs += 1
        isolation = kind.isolation
        limit = isolation.max_memory_mb if isolation is not None else None
        keep = (healthy and killed_for is None and not self._closed.is_set()
                and (isolation is None or child.runs < isolation.max_tasks_per_child)
                and (limit is None or child.rss_mib() <= limit))
        if keep:
            with self._lock:
                self._idle.append(child)
            return
        # ended away from the worker's path (a kill and the fork server's word of its exit),
        # and its successor started now, not when a task waits (unless it already was)
        self._in_background(child.kill)
        if not child.successor_started and not self._closed.is_set():
            child.successor_started = True
            self._in_background(self._replace)

    def _in_background(self, step: Callable[[], None]) -> None:
        threading.Thread(target=step, daemon=True, name=f"children-{self.member_id}").start()

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

    def _serve(self, child: Child, ctx: TaskContext) -> Returned | BaseException:
        """Answer the child until its handler ends: what it returned, or what it raised. The
        worker only waits on the channel (one blocking read per message); a crash, or a kill
        by the keeper, ends the channel and raises here."""
        try:
            while True:
                frame: FromChild = child.channel.recv()
                if isinstance(frame, Returned):
                    return frame
                if isinstance(frame, Raised):
                    return exception_of(frame)
                self._answer(child, ctx, frame)
        except (EOFError, OSError):
            raise self._crashed(child, ctx) from None

    def _answer(self, child: Child, ctx: TaskContext, frame: Progressed | Beat | ChildRequest
                ) -> None:
        if isinstance(frame, Progressed):
            ctx.progress(frame.done, frame.total, frame.message)
            return
        if isinstance(frame, Beat):
            try:
                ctx.heartbeat(frame.details)
            except Exception as exc:  # details that are not JSON: said, not fatal
                log.warning("member %s: task %s: heartbeat details refused: %s",
                            self.member_id, ctx.task.id, exc)
            return
        try:
            answer: ToChild = Answered(_served(ctx, frame))
        except Exception as exc:
            answer = Refused(crossing(exc))
        child.channel.send(answer)

    def _crashed(self, child: Child, ctx: TaskContext) -> BaseException:
        """What a child's death (or the keeper's kill) means for its attempt."""
        child.proc.join(2)
        if child.proc.is_alive():
            child.kill()
        if child.busy is not None and child.busy.killed_for is not None:
            return child.busy.killed_for
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

    # -- the keeper (one thread per node) -----------------------------------------------------
    def _keep_all(self) -> None:
        """While a child is busy: keep each one's shared flag and deadline, stop those past
        their grace or their memory, and end the channel of one that died (its worker waits on
        it). It wakes when an attempt is cancelled (the token's callback), when a child's next
        step is due (its grace, its kill, its RSS read, its session's deadline), and at least
        every ``KEEP_EVERY`` seconds; an idle pool sleeps. A node paused (SIGSTOP) stops this
        too: its children see the deadline pass."""
        while not self._closed.is_set():
            with self._lock:
                busy = list(self._busy)
                if not busy:
                    self._working.clear()
                now = time.monotonic()
                due = [self._keep(child, now) for child in busy]
            if not busy:  # nothing to keep: no wake-up on an idle node
                self._working.wait(1.0)
                continue
            # a child whose channel outlives it (a process it forked holds its end): shut
            try:
                dead = set(select.select([c.proc.sentinel for c in busy], [], [], 0)[0])
            except (OSError, ValueError):
                dead = set()
            for child in busy:
                if child.proc.sentinel in dead:
                    child.channel.shut()
            wait = min([KEEP_EVERY, *(at - time.monotonic() for at in due if at is not None)])
            self._nudge.wait(max(0.001, wait))
            self._nudge.clear()

    def _keep(self, child: Child, now: float) -> float | None:
        """One busy child's turn (under the pool's lock, so its attempt is the one read);
        when its next step is due."""
        busy = child.busy
        if busy is None:
            return None
        ctx, kind, cancel = busy.ctx, busy.kind, busy.ctx.cancel
        due: list[float] = []
        if cancel.cancelled:
            child.flag.value = 2 if cancel.timed_out else 1
            if cancel.session_lost:  # its lock may be another's: never a moment more
                child.signal(signal.SIGKILL)
                return None
            if busy.signalled is None:
                busy.signalled = now
            if busy.termed is None and now - busy.signalled > kind.limits.grace:
                log.warning("member %s: task %s: its handler process ignored its cancellation "
                            "(%s); stopping it", self.member_id, ctx.task.id, cancel.reason)
                child.signal(signal.SIGTERM)
                busy.termed = now
            elif busy.termed is not None and now - busy.termed > TERM_WAIT:
                child.signal(signal.SIGKILL)
            due.append(busy.signalled + kind.limits.grace if busy.termed is None
                       else busy.termed + TERM_WAIT)
        elif not cancel.unbound:
            child.deadline.value = deadline = self.session.deadline
            due.append(deadline)  # past it the session may be lost: look at once
        limit = kind.isolation.max_memory_mb if kind.isolation is not None else None
        if limit is not None:
            if now - busy.rss_at >= RSS_EVERY:
                busy.rss_at = now
                used = child.rss_mib()
                if used > limit:
                    busy.killed_for = HandlerCrashed(f"handler used {used:.0f} MiB, "
                                                     f"limit {limit:g}")
                    child.signal(signal.SIGKILL)
            due.append(busy.rss_at + RSS_EVERY)
        return min(due, default=None)

    def _on_cancel(self, child: Child, ctx: TaskContext) -> Callable[[str], None]:
        """The token's callback: the child's shared flag at once, and the keeper woken (for
        its grace, or a kill when the session is lost)."""
        def cancelled(reason: str) -> None:
            busy = child.busy
            if busy is not None and busy.ctx is ctx:
                child.flag.value = 2 if ctx.cancel.timed_out else 1
            self._nudge.set()
        return cancelled


def _served(ctx: TaskContext, request: ChildRequest) -> object:
    """What the node's context answers a child's request (or raises, refusing it)."""
    if isinstance(request, Check):
        ctx.check()
        return None
    if isinstance(request, SaveCheckpoint):
        ctx.checkpoint(request.state)
        return None
    if isinstance(request, Resume):
        return ctx.resume
    if isinstance(request, Spawn):
        return ctx.spawn(request.type, request.payload, key=request.key, **request.fields)
    if isinstance(request, ReadResults):
        return list(itertools.islice(ctx.results(), request.start,
                                     request.start + request.limit))
    ctx.complete(replayed(request.steps))
    return None
