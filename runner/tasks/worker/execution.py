"""Running a claimed task: the handler with its hooks, conflict retries, and the conclusion.

:class:`Execution` runs one attempt after another for a claimed task until it has an outcome
(:mod:`runner.tasks.outcomes`): a commit conflict is retried with a new attempt after an
exponential backoff with jitter, up to ``max_conflict_retries``; anything else is concluded:
the attempt's end and the task's new state written by its owner in one guarded write.
Its observers (:mod:`runner.tasks.observer`: the attempt log first, then metrics and any other)
hear each attempt's start in order and its end unwound in reverse.

Failure behaviour:

* the owner's token no longer the task's, or its attempt closed by someone else (the master's
  reaper, an operator's cancel): nothing more is written on the task; logged;
* the task changed while a retry waited: no new attempt, the task goes back as it stands;
* the graph unreachable when the attempt ends: its end is tried again with backoff for
  ``store_retry_for`` seconds while the lock is still held (an end whose answer was lost is
  recognised as written), then given up: the task stays open and runs again;
* an unexpected error in the loop itself: the attempt is closed FAILED with it, the task left
  open for another try. The caller releases the lock and slot after all of this is written.

Why one module: running a claimed task to its written outcome is one sequence (run, check,
complete, conclude, retry) over one ``Running``; split, each part would reach into the others.
"""

from __future__ import annotations

import logging
import random
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from coord import Session
from runner import logs
from runner.errors import (
    AttemptAlreadyFinished,
    CommitConflict,
    ResourceTaken,
    StaleFencingToken,
    StoreError,
    StoreUnavailable,
)
from runner.store import Attempt, AttemptStatus, GraphStore, codec
from runner.tasks import due
from runner.tasks.context import Services, TaskContext
from runner.tasks.observer import AttemptLogger, Observer
from runner.tasks.outcomes import (
    AttemptResult,
    Outcome,
    attempt_result,
    task_changes,
    with_retry_policy,
)
from runner.tasks.progress import ProgressReporter, ProgressWriter
from runner.tasks.registry import TaskRegistry, TaskType
from runner.tasks.retry import RetryPolicy
from runner.tasks.worker.commit import GroupCommit
from runner.tasks.worker.running import Running

log = logging.getLogger("latchwork.tasks")



class Execution:
    """Runs claimed tasks for one member (the task loop's workers call :meth:`run`)."""

    def __init__(self, session: Session, member_id: str, store: GraphStore,
                 registry: TaskRegistry, *, observers: Sequence[Observer] = (),
                 services: Services | None = None,
                 max_conflict_retries: int = 10,
                 conflict_backoff: tuple[float, float] = (0.1, 5.0),
                 store_retry_for: float = 60.0) -> None:
        self.session = session
        self.member_id = member_id
        self.store = store
        self.registry = registry
        #: the attempt log, then the given observers (:mod:`runner.tasks.observer`)
        self.observers: list[Observer] = [AttemptLogger(), *observers]
        self.services = services or Services()
        self.max_conflict_retries = max_conflict_retries
        self.conflict_backoff = conflict_backoff
        #: how long the end of an attempt is tried again while the graph is unreachable
        self.store_retry_for = store_retry_for
        #: the attempts' ends, written in groups (:mod:`runner.tasks.worker.commit`)
        self.commits = GroupCommit(store)
        #: the thread that writes the handlers' progress reports (:mod:`runner.tasks.progress`)
        self.progress_writer = ProgressWriter()

    def run(self, r: Running) -> Outcome:
        """Run ``r`` to its outcome and write it; returns the outcome."""
        task = r.task
        attempt = r.attempt
        assert attempt is not None  # claimed
        try:
            kind = self.registry.get(task.type)
            retries = 0
            tell: Callable[[AttemptStatus, str | None], None] | None = None
            while True:
                result, tell = self.attempt(r, kind, attempt)
                outcome = result.outcome
                if outcome is Outcome.RETRY and retries < self.max_conflict_retries:
                    self.finish(attempt, result, r)
                    tell(result.status, result.error)
                    retries += 1
                    next_attempt = self._retry(r, retries, result)
                    if next_attempt is not None:
                        attempt = next_attempt
                        continue
                    # cancelled while waiting to retry, or changed: no new attempt, the task
                    # goes back as it stands
                    self.conclude(r, None, result, Outcome.CANCELLED)
                    return Outcome.CANCELLED
                if outcome is Outcome.RETRY:  # the retry budget is spent
                    outcome = Outcome.STOPPED
                outcome, run_at = with_retry_policy(kind, result, outcome, r.task.attempts,
                                                    r.returned_at)
                if run_at is not None:
                    if due.needs_cursor(run_at):
                        due.ensure_cursor(self.session)
                    log.info("member %s: task %s (%s) attempt %d failed: %s; next attempt at "
                             "%s", self.member_id, task.id, task.type, attempt.seq,
                             result.error, run_at.isoformat())
                elif outcome is Outcome.STOPPED and kind.retry is not None:
                    self._exhausted(kind.retry, r, result)
                if r.completed:
                    if result.status is not AttemptStatus.SUCCEEDED:
                        log.error("member %s: task %s (%s) failed after ctx.complete(): %s; "
                                  "its attempt stays SUCCEEDED", self.member_id, task.id,
                                  task.type, result.error)
                    tell(AttemptStatus.SUCCEEDED, None)  # as ctx.complete() wrote it
                    return Outcome.FINISHED  # concluded by ctx.complete()
                written = self.conclude(r, attempt, result, outcome, run_at)
                tell(*r.ended)
                return written
        except Exception as exc:
            log.exception("member %s: task %s: unexpected failure in the task loop",
                          self.member_id, task.id)
            error = f"internal error in the task loop: {exc!r}"
            try:  # leave no RUNNING attempt behind; the task stays open for another try
                self.store.attempts.finish(attempt.id, AttemptStatus.FAILED, error,
                                           "".join(traceback.format_exception(exc)))
            except StoreError:
                pass  # already finished, or the store is gone: the reaper cannot help here
            if tell is not None:
                tell(AttemptStatus.FAILED, error)
            return Outcome.CANCELLED

    def _retry(self, r: Running, retries: int, result: AttemptResult) -> Attempt | None:
        """Wait the backoff and claim the task again as its owner: the next attempt, or None
        when cancelled meanwhile or the task changed."""
        first, cap = self.conflict_backoff
        delay = random.uniform(0, min(cap, first * 2 ** retries))
        log.info("member %s: task %s (%s): %s; retry %d in %.2fs", self.member_id, r.task.id,
                 r.task.type, result.error, retries, delay)
        if r.cancel.wait(delay):
            return None
        try:
            r.task, attempt = self.store.claim(r.task, r.token, self.member_id)
            return attempt
        except (CommitConflict, StaleFencingToken) as exc:
            # changed meanwhile (an operator stopped it, another owner)
            log.warning("member %s: task %s (%s) not retried: %s", self.member_id, r.task.id,
                        r.task.type, exc)
            return None

    def attempt(self, r: Running, kind: TaskType,
                attempt: Attempt) -> tuple[AttemptResult, Callable[[AttemptStatus, str | None],
                                                                    None]]:
        """Run the handler once, with the observers' ``before_attempt``; never raises. Returns
        its result and ``tell(status, error)``, which the caller calls once the attempt's end
        is written (with the status written): the observers' ``after_attempt``, in reverse
        order, so that nothing (the log, the metrics) reports an end that is not in the
        store."""
        task = r.task
        progress = ProgressReporter(self.store, attempt.id, r.cancel,
                                    writer=self.progress_writer)
        ctx = TaskContext(task=task, attempt=attempt, member_id=self.member_id,
                          fence_token=r.token, cancel=r.cancel, store=self.store,
                          services=self.services, checker=lambda: self.check(r),
                          completer=lambda write: self.complete(r, attempt, write),
                          reporter=progress.report)
        entered: list[Observer] = []
        with logs.attempt_context(task.id, attempt.id):
            result = self._attempt(r, kind, attempt, ctx, progress, entered)

        def tell(status: AttemptStatus, error: str | None) -> None:
            with logs.attempt_context(task.id, attempt.id):
                for observer in reversed(entered):  # unwound in reverse order
                    try:
                        observer.after_attempt(ctx, status, error)
                    except Exception:
                        log.exception("observer %r failed after an attempt of task %s",
                                      observer, task.id)

        return result, tell

    def _attempt(self, r: Running, kind: TaskType, attempt: Attempt, ctx: TaskContext,
                 progress: ProgressReporter, entered: list[Observer]) -> AttemptResult:
        task = r.task

        def body() -> None:
            for observer in self.observers:
                observer.before_attempt(ctx)
                entered.append(observer)
            r.cancel.raise_if_cancelled()
            kind.handler(ctx, kind.parse(task.payload))
            if not r.cancel.cancelled and not r.completed and not r.lock.verify():
                # frozen or cut off past its session while the handler ran: its lock and holds
                # may be someone else's now, so it must not record a success it cannot own
                r.cancel.cancel("its task lock could not be confirmed when its handler ended")

        result = attempt_result(body, r.cancel)
        r.returned_at = codec.now()
        last = progress.close()  # the end writes the last report not written yet
        # ctx.complete() ended the attempt: nothing more is written on it
        r.progress = None if r.completed else last
        return result

    def check(self, r: Running) -> None:
        """``ctx.check()``: raise TaskCancelled (and cancel the token) unless this node still
        owns the task: session valid, lock node there with the same czxid (one ZooKeeper
        read), the token still the task's (one store read). While the session is SUSPENDED
        the check waits, bounded by the session's deadline, for RECONNECTED (then it goes on)
        or LOST (then it cancels): a ZooKeeper leader election costs no work."""
        if not self.session.confirm():
            r.cancel.cancel(f"the ZooKeeper session is {self.session.state.value} "
                            "(or past its deadline)")
        elif not r.lock.verify():
            r.cancel.cancel("its task lock was lost")
        else:
            try:
                fence = self.store.tasks.get(r.task.id).fence
            except StoreError as exc:
                r.cancel.cancel(f"its ownership cannot be confirmed: {exc}")
            else:
                if fence != r.token:
                    r.cancel.cancel(f"its fencing token {r.token} was superseded by {fence}")
        r.cancel.raise_if_cancelled()

    def complete(self, r: Running, attempt: Attempt, write: Callable[[Any], Any]) -> None:
        """``ctx.complete()``: the effect, the attempt's success and the task's finish in one
        store write, once the task lock is confirmed (one ZooKeeper read); a refusal cancels
        the token and raises TaskCancelled."""
        if not r.lock.verify():
            r.cancel.cancel("its task lock could not be confirmed before it completed")
            r.cancel.raise_if_cancelled()
        try:
            r.task = self.store.complete(attempt, r.task, r.token, write)
        except AttemptAlreadyFinished:
            r.cancel.cancel("its attempt was closed by someone else before it completed")
        except StaleFencingToken as exc:
            r.cancel.cancel(f"its fencing token was superseded before it completed ({exc})")
        except ResourceTaken as exc:
            r.cancel.cancel(f"it lost a resource before it completed ({exc})")
        r.cancel.raise_if_cancelled()
        r.completed = True

    def _write_end(self, r: Running, attempt: Attempt | None, result: AttemptResult,
                   changes: dict[str, Any]) -> None:
        """The store's conclude (or release), tried again with backoff while the graph is
        unreachable (``StoreUnavailable``), for up to ``store_retry_for`` seconds and while the
        task's lock is still this node's; nothing is reported before it is written. A write
        whose answer was lost may have been applied: an attempt found ended as this one would
        end it is taken as written."""
        deadline = time.monotonic() + self.store_retry_for
        delay = 0.1
        while True:
            try:
                if attempt is not None:  # written with the other workers' (group commit)
                    r.task = self.commits.conclude(attempt, result.status, result.error,
                                                   result.stack, r.task, r.token, changes,
                                                   progress=r.progress, ended=r.returned_at)
                else:
                    r.task = self.store.release(r.task.id, r.token, changes)
                return
            except AttemptAlreadyFinished:
                if attempt is None or not self._ended_by_us(attempt, result):
                    raise
                r.task = self.store.tasks.get(r.task.id)
                return
            except StoreUnavailable as exc:
                if time.monotonic() + delay > deadline or not r.lock.verify():
                    raise
                log.warning("member %s: task %s (%s): cannot write the end of its attempt "
                            "(%s); trying again in %.1fs", self.member_id, r.task.id,
                            r.task.type, exc, delay)
                time.sleep(delay)
                delay = min(2.0, delay * 2)

    def _ended_by_us(self, attempt: Attempt, result: AttemptResult) -> bool:
        current = self.store.attempts.get(attempt.id)
        return (current.status is result.status and current.executor == self.member_id
                and current.error == (result.error or None))

    def finish(self, attempt: Attempt, result: AttemptResult, r: Running) -> None:
        """Close an attempt that will be followed by another (a retry), with its handler's
        last report not written yet and the time it returned."""
        try:
            self.store.attempts.finish(attempt.id, result.status, result.error, result.stack,
                                       progress=r.progress, ended=r.returned_at)
        except AttemptAlreadyFinished:
            log.warning("member %s: attempt %s of task %s was closed by the master meanwhile",
                        self.member_id, attempt.id, attempt.task_id)

    def _exhausted(self, policy: RetryPolicy, r: Running, result: AttemptResult) -> None:
        """The policy's ``on_exhausted`` hook, for a failure it does not retry; logged."""
        if result.exception is not None and not isinstance(result.exception,
                                                           policy.retry_on):
            return  # not a retried kind of error: the policy has nothing to say
        log.warning("member %s: task %s (%s) failed %d attempts; it stops: %s",
                    self.member_id, r.task.id, r.task.type, r.task.attempts, result.error)
        if policy.on_exhausted is None:
            return
        try:
            policy.on_exhausted(r.task, result.error or "")
        except Exception:
            log.exception("member %s: on_exhausted hook of %s failed for task %s",
                          self.member_id, r.task.type, r.task.id)

    def conclude(self, r: Running, attempt: Attempt | None, result: AttemptResult,
                 outcome: Outcome, run_at: datetime | None = None) -> Outcome:
        """Write the attempt's end (unless already written) and the task's new state as its
        owner, in one transaction (``r.task`` becomes the task as written); returns the
        outcome written. Once the attempt was closed by someone else, or the token is no
        longer the task's, nothing more is written on the task and the outcome is CANCELLED:
        the others left the task as it stands and this node lost it, so the worker looks for
        work with a full scan a moment later, as after a lost lock (counted as FINISHED, its
        follow-up scan walked only the rest of its old listing, and the task could wait for the
        interval scan). A success refused because another attempt claimed one of the task's
        resources since (this node lost its hold with its session) is written as
        CANCELLED_BY_SYSTEM instead, and the task runs again."""
        changes = task_changes(outcome, run_at)
        lost = AttemptStatus.CANCELLED_BY_SYSTEM
        try:
            self._write_end(r, attempt, result, changes)
        except StoreUnavailable as exc:
            log.error("member %s: task %s (%s): the end of its attempt could not be written "
                      "for %gs (%s); the task stays open and is run again (its attempt is "
                      "closed as superseded)", self.member_id, r.task.id, r.task.type,
                      self.store_retry_for, exc)
            r.ended = (lost, f"its end could not be written: {exc}")
            return Outcome.CANCELLED
        except ResourceTaken as exc:
            assert attempt is not None  # only a success needs its resources
            log.warning("member %s: task %s (%s) attempt %d: its success is not recorded: %s",
                        self.member_id, r.task.id, r.task.type, attempt.seq, exc)
            cancelled = AttemptResult.cancelled(f"cancelled by system: {exc}")
            return self.conclude(r, attempt, cancelled, Outcome.CANCELLED)
        except StaleFencingToken as exc:
            log.warning("member %s: task %s was taken over by another owner; leaving it",
                        self.member_id, r.task.id)
            r.ended = (lost, f"cancelled by system: superseded ({exc})")
            return Outcome.CANCELLED
        except AttemptAlreadyFinished:
            log.warning("member %s: the attempt of task %s was closed by the master meanwhile "
                        "(or by an operator); leaving the task to them", self.member_id,
                        r.task.id)
            r.ended = (lost, "closed by someone else before its end was written")
            if attempt is not None:
                try:  # what that close wrote (an operator's CANCELLED, the reaper's reason)
                    current = self.store.attempts.get(attempt.id)
                    r.ended = (current.status, current.error)
                except StoreError:
                    pass
            return Outcome.CANCELLED
        except CommitConflict:
            log.error("member %s: could not record the end of task %s", self.member_id,
                      r.task.id)
            r.ended = (lost, "its end could not be written: commit conflicts")
            return Outcome.CANCELLED
        r.ended = (result.status, result.error)
        return outcome
