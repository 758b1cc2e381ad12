"""Time limits and heartbeats of running attempts (a type's :class:`~runner.tasks.registry.
Limits`): one watcher thread per node, no work at all for a type without limits.

:meth:`LimitWatch.watch` registers an attempt when its handler starts; its deadlines wait in a
heap, the thread sleeps until the first. When one passes:

* ``timeout``: the attempt's token is cancelled "timed out after N s" as a time limit
  (``CancelToken.timed_out``), so the attempt ends TIMED_OUT (a failure the retry policy may
  retry), however the handler stops (returns, raises :class:`~runner.tasks.TaskTimedOut`, or
  raises anything else once cancelled);
* ``heartbeat_timeout``: the same, "no heartbeat for N s", once the last ``ctx.heartbeat()``
  (or the start) is that old; a beat only stamps the time (no lock, no write), and the
  deadline is checked against the last stamp when it comes;
* ``grace`` after either, with the handler still running: ``on_ignored`` (the task loop) writes
  the attempt TIMED_OUT with the task's fence moved, in one write, and raises the incident
  ``ignored_timeout``; the attempt's lock stays held until the handler returns (a thread cannot
  be killed), so no second run overlaps it, and nothing it writes afterwards is accepted. When
  the handler returns, :meth:`LimitWatch.done` says so and nothing more is written for it.

A heartbeat's ``details`` are handed to ``persist`` (the attempt's ``attempt_beat``) at most
every ``heartbeat_persist`` seconds, from this thread, never in the handler's time.

Failure behaviour: an error of ``on_ignored`` or ``persist`` (the store out of reach) is logged
and the handler is left to end as it will (its end is then written TIMED_OUT by the group
commit, fenced as any end); nothing here raises into the loop.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runner.errors import StoreError
from runner.store import AttemptStatus, FenceOff, Store
from runner.tasks.outcomes import (
    IGNORED_TIMEOUT,
    AttemptResult,
    Outcome,
    task_changes,
    with_retry_policy,
)
from runner.tasks.registry import TaskType
from runner.tasks.worker.ends import EndWriter, TimedOut
from runner.tasks.worker.running import Claimed, Slot

log = logging.getLogger("latchwork.tasks")

#: what ``on_ignored`` is told: the attempt, and why it timed out
OnIgnored = Callable[["Watched", str], None]


@dataclass(eq=False)
class Watched:
    """A running attempt with limits: its deadlines' state, its last beat, and whether the
    watcher closed it because its handler ignored the cancellation."""
    slot: Slot
    claim: Claimed
    kind: TaskType
    last_beat: float
    timeout: float | None = None  # the type's, or the task's own when shorter
    details: Any = None
    #: details beaten since the last persisted
    unsent: bool = False
    #: why a limit fired (None: none did)
    reason: str | None = None
    returned: bool = False
    #: the watcher is closing (or closed) the attempt itself: the handler ignored its limit
    closing: bool = False
    closed: threading.Event = field(default_factory=threading.Event)
    #: what the watcher's close wrote, for the loop (None: it wrote nothing)
    written: TimedOut | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def beat(self, details: Any = None) -> None:
        """``ctx.heartbeat(details)``: a clock read, and the details kept for the watcher."""
        self.last_beat = time.monotonic()
        if details is not None:
            self.details = details
            self.unsent = True


def limit_of(kind: float | None, own: float | None) -> float | None:
    """An attempt's timeout: its task's own (given at submission), capped by its type's."""
    if kind is None or own is None:
        return own if kind is None else kind
    return min(kind, own)


class LimitWatch:
    """The node's watcher of attempts' time limits (see the module)."""

    def __init__(self, member_id: str, on_ignored: OnIgnored,
                 persist: Callable[[Watched], None] | None = None) -> None:
        self.member_id = member_id
        self.on_ignored = on_ignored
        self.persist = persist
        self._heap: list[tuple[float, int, str, Watched]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._ended = 0  # attempts ended whose deadlines still wait in the heap

    def watch(self, slot: Slot, claim: Claimed, kind: TaskType) -> Watched | None:
        """Register the attempt of ``claim`` as its handler starts; None when its type has no
        limit (nothing is done for it)."""
        limits = kind.limits
        timeout = limit_of(limits.timeout, claim.task.timeout)
        if timeout is None and limits.heartbeat_timeout is None:
            return None
        now = time.monotonic()
        w = Watched(slot, claim, kind, now, timeout=timeout)
        with self._cond:
            if timeout is not None:
                self._push(now + timeout, "timeout", w)
            if limits.heartbeat_timeout is not None:
                self._push(now + limits.heartbeat_timeout, "beat", w)
                if self.persist is not None:
                    self._push(now + limits.heartbeat_persist, "persist", w)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"limits-{self.member_id}")
                self._thread.start()
            self._cond.notify()
        return w

    def done(self, w: Watched | None) -> bool:
        """The handler of ``w`` returned; whether the watcher closed its attempt already (then
        wait for ``w.closed`` and write nothing more)."""
        if w is None:
            return False
        with w.lock:
            w.returned = True
            closing = w.closing
        with self._cond:  # an ended attempt's deadlines (an hour's timeout) go once they
            self._ended += 1  # are most of the heap, not an hour later
            if self._ended > 64 and 6 * self._ended >= len(self._heap):
                self._heap = [e for e in self._heap if not e[3].returned]
                heapq.heapify(self._heap)
                self._ended = 0
        return closing

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _push(self, when: float, what: str, w: Watched) -> None:
        heapq.heappush(self._heap, (when, next(self._seq), what, w))

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._heap
                                            or self._heap[0][0] > time.monotonic()):
                    # a minute at most: a far deadline is never a wait the platform
                    # cannot hold (threading.TIMEOUT_MAX, time_t)
                    self._cond.wait(None if not self._heap
                                    else min(60.0, self._heap[0][0] - time.monotonic()))
                if self._closed:
                    return
                _, _, what, w = heapq.heappop(self._heap)
            if not w.returned:
                try:
                    self._due(what, w)
                except Exception:
                    log.exception("member %s: task %s: watching its limits failed",
                                  self.member_id, w.claim.task.id)

    def _due(self, what: str, w: Watched) -> None:
        limits = w.kind.limits
        now = time.monotonic()
        if what == "timeout" and w.timeout is not None:
            whose = "its type's" if w.timeout == limits.timeout else "its own"
            self._fire(w, f"timed out after {w.timeout:g} s ({whose} timeout)")
        elif what == "beat" and limits.heartbeat_timeout is not None:
            silent = now - w.last_beat
            if silent < limits.heartbeat_timeout:
                with self._cond:
                    self._push(w.last_beat + limits.heartbeat_timeout, "beat", w)
            else:
                self._fire(w, f"no heartbeat for {silent:.0f} s (its type's heartbeat_timeout "
                              f"is {limits.heartbeat_timeout:g} s)")
        elif what == "persist":
            self._send(w)
            with self._cond:
                self._push(now + limits.heartbeat_persist, "persist", w)
        elif what == "grace":
            with w.lock:
                if w.returned:
                    return
                w.closing = True
            try:
                self.on_ignored(w, w.reason or "timed out")
            finally:
                w.closed.set()

    def _fire(self, w: Watched, reason: str) -> None:
        """A limit passed: cancel the attempt as timed out (unless it was cancelled already
        for something else) and come back after the grace."""
        if w.reason is not None:
            return
        w.slot.cancel.cancel(reason, timed_out=True)
        if not w.slot.cancel.timed_out:
            return  # cancelled first for another reason (shutdown, a lost lock): that stands
        w.reason = reason
        log.warning("member %s: task %s (%s) attempt %d %s: cancelled", self.member_id,
                    w.claim.task.id, w.claim.task.type, w.claim.attempt.seq, reason)
        if w.kind.isolation is not None:
            return  # its child is stopped after the grace (runner.tasks.worker.isolated)
        with self._cond:
            self._push(time.monotonic() + w.kind.limits.grace, "grace", w)

    def _send(self, w: Watched) -> None:
        if not w.unsent or self.persist is None:
            return
        w.unsent = False
        try:
            self.persist(w)
        except Exception as exc:
            log.warning("member %s: task %s: its heartbeat's details not written: %s",
                        self.member_id, w.claim.task.id, exc)


def close_ignored(writer: EndWriter, store: Store, member_id: str, w: Watched,
                  reason: str) -> None:
    """A thread-run handler still running ``grace`` past its limit (it cannot be killed):
    write its attempt TIMED_OUT and the task's fence moved in one write (nothing it writes
    afterwards is accepted; the retry policy decides the task's next state as for any
    failure), raise the incident ``ignored_timeout``; its lock stays held until it returns."""
    claim, kind = w.claim, w.kind
    error = (f"{reason}; its handler ran on {kind.limits.grace:g} s past it: the attempt is "
             "closed and the task fenced off, its lock kept until the handler returns")
    outcome, run_at = with_retry_policy(kind, AttemptResult.timed_out(error), Outcome.STOPPED,
                                        claim.task.attempts)
    answer = writer.write_now(FenceOff(claim.task.id, member_id, AttemptStatus.TIMED_OUT, error,
                                       task_changes(outcome, run_at)))
    if isinstance(answer, StoreError):
        raise answer
    if not any(a.id == claim.attempt.id for a in answer.attempts):
        return  # closed by someone else first (an operator, the reaper): their end stands
    log.error("member %s: task %s (%s) attempt %d: %s", member_id, claim.task.id,
              claim.task.type, claim.attempt.seq, error)
    incident = None
    try:
        incident, _ = store.incidents.raise_(claim.task.id, IGNORED_TIMEOUT, claim.attempt.id,
                                             f"{error} (on {member_id}, its worker busy)")
    except StoreError as exc:
        log.warning("member %s: task %s: incident %s not raised: %s", member_id,
                    claim.task.id, IGNORED_TIMEOUT, exc)
    w.written = TimedOut(outcome, error, run_at, incident)


def persist_beat(store: Store, w: Watched) -> None:
    """The last heartbeat's details, on the attempt (``attempt_beat``) while it runs."""
    store.attempts.heartbeat(w.claim.attempt.id, w.details)
