"""Running a claimed task: the handler with its hooks, conflict retries, and what it came to.

:class:`Execution` runs one attempt after another for a claimed task until it has an outcome
(:mod:`runner.tasks.outcomes`): a commit conflict is retried with a new attempt (a new claim)
after an exponential backoff with jitter, up to ``max_conflict_retries``; anything else becomes
the slot's :class:`~runner.tasks.worker.running.Ending`: what the attempt came to, as one
:data:`~runner.tasks.worker.ends.End`, which the group commit (:mod:`runner.tasks.worker.commit`,
the one writer of every end: ``writer``) writes and only then reports. Its observers
(:mod:`runner.tasks.observer`: the attempt log first, then metrics and any other) hear each
attempt's start in order and its end unwound in reverse, once that end is written
(:meth:`Execution.report`, from what the group commit answers).

When the handler returns, its session is confirmed (a clock read; while SUSPENDED it waits,
bounded by the session's deadline, for RECONNECTED or LOST): a node frozen or cut off past its
session must not record a success it cannot own. No ZooKeeper read is needed for that: the
lock node lives as long as the session, and whoever else closes the attempt (an operator's
cancel, the master's reaper) moves the task's fence in the same write, so the end's guarded
write is refused then (docs/reliability.md).

Failure behaviour:

* the task changed while a retry waited: no new attempt, the task goes back as it stands;
* an unexpected error in the loop itself: the attempt is closed FAILED with it, the task left
  open for another try.

Why one module: running a claimed task to its outcome is one sequence (run, check, complete,
retry, decide) over one slot; split, each part would reach into the others.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import random
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from runner import logs
from runner.errors import (
    AttemptAlreadyFinished,
    CommitConflict,
    ResourceTaken,
    StaleFencingToken,
    StoreError,
    StoreUnavailable,
)
from runner.store import (
    AttemptClose,
    AttemptStatus,
    Completion,
    Fence,
    LastEffect,
    Store,
    Task,
    attempt_end,
    codec,
)
from runner.tasks import due
from runner.tasks.context import Services, TaskContext
from runner.tasks.observer import AttemptLogger, Observer, notify_released
from runner.tasks.outcomes import (
    AttemptResult,
    Outcome,
    attempt_result,
    with_retry_policy,
)
from runner.tasks.progress import ProgressReporter, ProgressWriter
from runner.tasks.registry import TaskRegistry, TaskType
from runner.tasks.retry import RetryPolicy
from runner.tasks.worker.ends import (
    Audience,
    Broken,
    Completed,
    ConflictRetried,
    End,
    EndWriter,
    Failed,
    LetGo,
    Succeeded,
    TimedOut,
)
from runner.tasks.worker.isolated import ChildPool
from runner.tasks.worker.limits import LimitWatch, close_ignored, persist_beat
from runner.tasks.worker.running import AttemptSession, Claimed, Ending, Slot
from runner.tasks.worker.settings import LoopSettings
from runner.templates import TaskTemplate
from runner.workflows import child_id

log = logging.getLogger("latchwork.tasks")
#: seconds the wakes for spawned children are gathered over (one per this many, at most)
SPAWN_WAKE = 0.05



@dataclass
class _Handling:
    """One attempt's run: whether its handler concluded it (``ctx.complete()``), its last
    progress report not written yet, when its handler returned, and what the limit watch
    wrote when the handler ignored its time limit (:mod:`.limits`)."""
    completed: bool = False
    progress: str | None = None
    returned_at: datetime | None = None
    forced: TimedOut | None = None


@dataclass(frozen=True)
class AttemptSupport:
    """What attempts run with beside the store: the observers that hear them, the services
    their handlers find (``ctx.services``), and ``cursor``, which makes sure the due-time
    cursor exists before a retry far ahead is written into a bucket
    (:func:`runner.tasks.due.ensure_cursor` on the node's session)."""
    observers: Sequence[Observer] = ()
    services: Services | None = None
    cursor: Callable[[], None] | None = None


class Execution:
    """Runs claimed tasks for one member (the task loop's workers call :meth:`run`)."""

    def __init__(self, session: AttemptSession, member_id: str, store: Store,
                 registry: TaskRegistry, writer: EndWriter,
                 support: AttemptSupport = AttemptSupport(),
                 settings: LoopSettings | None = None) -> None:
        self.session = session
        self.cursor = support.cursor
        self.member_id = member_id
        self.store = store
        self.registry = registry
        #: the one writer of attempts' ends (the group commit)
        self.writer = writer
        #: the attempt log, then the given observers (:mod:`runner.tasks.observer`)
        self.observers: list[Observer] = [AttemptLogger(), *support.observers]
        self.services = support.services or Services()
        settings = settings or LoopSettings()
        #: commit conflicts retried, and their backoff (first delay, cap)
        self.max_conflict_retries = settings.max_conflict_retries
        self.conflict_backoff = settings.conflict_backoff
        #: the first child spawned since the last wake (:meth:`_wake_soon`)
        self._wake_from: Task | None = None
        self._wake_lock = threading.Lock()
        #: the thread that writes the handlers' progress reports (:mod:`runner.tasks.progress`)
        self.progress_writer = ProgressWriter()
        #: the attempts' time limits and heartbeats (:mod:`runner.tasks.worker.limits`)
        self.limits = LimitWatch(member_id, functools.partial(close_ignored, writer, store,
                                                              member_id),
                                 functools.partial(persist_beat, store))
        #: the handler processes of the types with ``isolation="process"`` (none: no pool)
        isolated = [k for k in registry.all() if k.isolation is not None]
        self.children = ChildPool(session, member_id, sorted({
            k.handler.__module__ for k in isolated})) if isolated else None
        if self.children is not None:
            self.children.start()

    def close(self) -> None:
        """Stop the progress writer, the limit watch and the handler processes."""
        self.progress_writer.close()
        self.limits.close()
        if self.children is not None:
            self.children.close()

    def run(self, slot: Slot) -> Ending:
        """Run ``slot``'s task to what it comes to (conflict retries included); never raises.
        Nothing of the last attempt's end is written yet: the Ending says what to write."""
        claim = slot.claim
        assert claim is not None  # claimed
        audience: Audience | None = None
        try:
            kind = self.registry.get(claim.task.type)
            retries = 0
            while True:
                result, handling, audience = self.attempt(slot, claim, kind)
                if handling.forced is not None:  # its end is written already: TIMED_OUT
                    return self._forced(slot, claim, handling.forced, audience)
                outcome = result.outcome
                if outcome is Outcome.RETRY and retries < self.max_conflict_retries:
                    self._closed(claim, ConflictRetried(result, handling.progress,
                                                 handling.returned_at), audience)
                    retries += 1
                    following = self._retry(slot, claim, retries, result)
                    if following is None:
                        # cancelled while waiting to retry, or changed: no new attempt, the
                        # task goes back as it stands
                        return Ending.of(slot, claim, LetGo(result))
                    claim = slot.reclaimed(following)
                    continue
                if outcome is Outcome.RETRY:  # the retry budget is spent
                    outcome = Outcome.STOPPED
                return Ending.of(slot, claim, self._decided(claim, kind, outcome, result,
                                                            handling), audience)
        except Exception as exc:
            log.exception("member %s: task %s: unexpected failure in the task loop",
                          self.member_id, claim.task.id)
            # no RUNNING attempt is left behind; the task stays open for another try
            return Ending.of(slot, claim, Broken(f"internal error in the task loop: {exc!r}",
                                                 "".join(traceback.format_exception(exc))),
                             audience)

    def _decided(self, claim: Claimed, kind: TaskType, outcome: Outcome,
                 result: AttemptResult, handling: _Handling) -> End:
        """The last attempt's end as the type's retry policy decides it."""
        task = claim.task
        outcome, run_at = with_retry_policy(kind, result, outcome, task.attempts,
                                            handling.returned_at)
        if run_at is not None:
            if due.needs_cursor(run_at) and self.cursor is not None:
                self.cursor()
            log.info("member %s: task %s (%s) attempt %d failed: %s; next attempt at %s",
                     self.member_id, task.id, task.type, claim.attempt.seq, result.error,
                     run_at.isoformat())
        elif outcome is Outcome.STOPPED and kind.retry is not None:
            self._exhausted(kind.retry, claim, result)
        if handling.completed:
            if result.status is not AttemptStatus.SUCCEEDED:
                log.error("member %s: task %s (%s) failed after ctx.complete(): %s; its "
                          "attempt stays SUCCEEDED", self.member_id, task.id, task.type,
                          result.error)
            return Completed(result)  # as ctx.complete() wrote it
        if outcome is Outcome.FINISHED and result.status is AttemptStatus.SUCCEEDED:
            return Succeeded(result, handling.progress, handling.returned_at)
        return Failed(result, outcome, run_at, handling.progress, handling.returned_at)

    def _forced(self, slot: Slot, claim: Claimed, closed: TimedOut,
                audience: Audience) -> Ending:
        """The handler returned after the limit watch closed its attempt TIMED_OUT (it ran on
        past its grace): nothing more is written for it; its lock goes now, with the end told,
        and its incident is resolved."""
        log.warning("member %s: task %s (%s): its handler returned after its attempt was "
                    "closed as timed out; its lock goes now", self.member_id, claim.task.id,
                    claim.task.type)
        if closed.incident is not None:
            try:
                self.store.incidents.resolve(closed.incident)
            except StoreError as exc:
                log.warning("member %s: incident %s not resolved: %s", self.member_id,
                            closed.incident.key, exc)
        return Ending.of(slot, claim, closed, audience)

    def _closed(self, claim: Claimed, end: ConflictRetried, audience: Audience) -> None:
        """The attempt of a commit conflict closed by the group commit before the next claim
        (which would close a RUNNING one as superseded), then its observers told."""
        write = AttemptClose(attempt_end(claim.attempt, end.result.status, end.result.error,
                                         end.result.stack, end.progress, end.returned_at))
        answer = self.writer.write_now(write)
        if isinstance(answer, StoreError):
            log.warning("member %s: attempt %s of task %s not closed (%s): the master "
                        "closes it", self.member_id, claim.attempt.id, claim.task.id, answer)
        self.report(audience, end.result.status, end.result.error)

    def _retry(self, slot: Slot, claim: Claimed, retries: int,
               result: AttemptResult) -> Claimed | None:
        """Wait the backoff and claim the task again as its owner: the next attempt's claim
        (a new one), or None when cancelled meanwhile or the task changed."""
        first, cap = self.conflict_backoff
        delay = random.uniform(0, min(cap, first * 2 ** retries))
        task = claim.task
        log.info("member %s: task %s (%s): %s; retry %d in %.2fs", self.member_id, task.id,
                 task.type, result.error, retries, delay)
        if slot.cancel.wait(delay):
            return None
        try:
            again, attempt = self.store.claim(task, claim.token, self.member_id)
            return Claimed(again, attempt, claim.token)
        except (CommitConflict, StaleFencingToken) as exc:
            # changed meanwhile (an operator stopped it, another owner)
            log.warning("member %s: task %s (%s) not retried: %s", self.member_id, task.id,
                        task.type, exc)
            return None

    def attempt(self, slot: Slot, claim: Claimed,
                kind: TaskType) -> tuple[AttemptResult, _Handling, Audience]:
        """Run the handler once, with the observers' ``before_attempt``; never raises. Returns
        its result, the run's state and its audience: the observers that heard it start,
        told its end (:meth:`report`) once that end is written, in reverse order, so that
        nothing (the log, the metrics) reports an end that is not in the store."""
        task, attempt = claim.task, claim.attempt
        handling = _Handling()
        progress = ProgressReporter(self.store, attempt.id, slot.cancel,
                                    writer=self.progress_writer)
        ctx = TaskContext(task=task, attempt=attempt, member_id=self.member_id,
                          fence_token=claim.token, cancel=slot.cancel, store=self.store,
                          services=self.services, checker=lambda: self.check(slot, claim),
                          completer=lambda write: self.complete(slot, claim, handling, write,
                                                                progress),
                          reporter=progress.report,
                          spawner=functools.partial(self.spawn, slot, claim))
        entered: list[Observer] = []
        watched = self.limits.watch(slot, claim, kind)
        if watched is not None:
            ctx.beater = watched.beat
        with logs.attempt_context(task.id, attempt.id):
            result = self._attempt(slot, kind, ctx, progress, handling, entered)
        if self.limits.done(watched):
            assert watched is not None
            watched.closed.wait()
            handling.forced = watched.written
        return result, handling, Audience(ctx, tuple(entered))

    def report(self, audience: Audience | None, status: AttemptStatus,
               error: str | None) -> None:
        """The observers of an attempt hear its end as written (``status``, ``error``),
        unwound in reverse order; an observer's failure is logged, never raised."""
        if audience is None:
            return
        task, attempt = audience.ctx.task, audience.ctx.attempt
        with logs.attempt_context(task.id, attempt.id):
            for observer in reversed(audience.entered):
                try:
                    observer.after_attempt(audience.ctx, status, error)
                except Exception:
                    log.exception("observer %r failed after an attempt of task %s",
                                  observer, task.id)

    def _attempt(self, slot: Slot, kind: TaskType, ctx: TaskContext,
                 progress: ProgressReporter, handling: _Handling,
                 entered: list[Observer]) -> AttemptResult:
        def body() -> str | None:
            for observer in self.observers:
                observer.before_attempt(ctx)
                entered.append(observer)
            slot.cancel.raise_if_cancelled()
            if kind.isolation is not None and self.children is not None:
                # in a child process, its result encoded there; its context served here
                value = self.children.run(ctx, kind)
            else:
                value = kind.result.encode(kind.name, kind.handler(ctx, kind.parse(
                    ctx.task.payload)))
            if not slot.cancel.cancelled and not handling.completed and not self.owned(slot):
                # frozen or cut off past its session while the handler ran: its lock and holds
                # may be someone else's now, so it must not record a success it cannot own
                slot.cancel.cancel("its session could not be confirmed when its handler ended")
            return value

        result = attempt_result(body, slot.cancel)
        handling.returned_at = codec.now()
        last = progress.close()  # the end writes the last report not written yet
        # ctx.complete() ended the attempt: nothing more is written on it
        handling.progress = None if handling.completed else last
        return result

    def owned(self, slot: Slot) -> bool:
        """Whether this node still holds ``slot``'s lock as far as it can know without a
        read: the lock not lost, the session confirmed (a clock read; while SUSPENDED it waits,
        bounded by the deadline)."""
        return slot.lock.is_held and self.session.confirm()

    def check(self, slot: Slot, claim: Claimed) -> None:
        """``ctx.check()``: raise TaskCancelled (and cancel the token) unless this node still
        owns the task: session valid, lock node there with the same czxid (one ZooKeeper
        read), the token still the task's (one store read). While the session is SUSPENDED
        the check waits, bounded by the session's deadline, for RECONNECTED (then it goes on)
        or LOST (then it cancels): a ZooKeeper leader election costs no work."""
        if not self.session.confirm():
            slot.cancel.cancel(f"the ZooKeeper session is {self.session.state.value} "
                               "(or past its deadline)")
        elif not slot.lock.verify():
            slot.cancel.cancel("its task lock was lost")
        else:
            try:
                fence = self.store.tasks.get(claim.task.id).fence
            except StoreError as exc:
                slot.cancel.cancel(f"its ownership cannot be confirmed: {exc}")
            else:
                if fence != claim.token:
                    slot.cancel.cancel(f"its fencing token {claim.token} was superseded by "
                                       f"{fence}")
        slot.cancel.raise_if_cancelled()

    def complete(self, slot: Slot, claim: Claimed, handling: _Handling,
                 write: LastEffect, progress: ProgressReporter) -> None:
        """``ctx.complete()``: the effect, the attempt's success and the task's finish in one
        store write by the group commit, once the task lock is confirmed (one ZooKeeper
        read); a refusal cancels the token and raises TaskCancelled. The handler's progress
        reports stop first: a report's write that lands after this end would find the attempt
        ended and take it for someone else's close (it cancelled the token after the success
        was written: the stub's test found it, one full run in three)."""
        if not slot.lock.verify():
            slot.cancel.cancel("its task lock could not be confirmed before it completed")
            slot.cancel.raise_if_cancelled()
        progress.close()
        answer = self.writer.write_now(Completion(claim.attempt, claim.task, claim.token,
                                                  write))
        if isinstance(answer, AttemptAlreadyFinished):
            slot.cancel.cancel("its attempt was closed by someone else before it completed")
        elif isinstance(answer, StaleFencingToken):
            slot.cancel.cancel(f"its fencing token was superseded before it completed "
                               f"({answer})")
        elif isinstance(answer, ResourceTaken):
            slot.cancel.cancel(f"it lost a resource before it completed ({answer})")
        elif isinstance(answer, StoreUnavailable):
            # written or not cannot be known now, and it is no fault of the handler: the end
            # written later says which (a write that ran left the attempt SUCCEEDED, and this
            # cancellation's end is refused; one that did not: the task runs again)
            slot.cancel.cancel(f"the graph was out of reach when it completed ({answer})")
        elif isinstance(answer, StoreError):
            raise answer  # InvalidValue (an effect that runs its traversal): the handler's
        slot.cancel.raise_if_cancelled()
        handling.completed = True

    def spawn(self, slot: Slot, claim: Claimed, kind: str, payload: dict[str, Any],
              key: str, fields: dict[str, Any]) -> str:
        """``ctx.spawn``: the child validated as a submit is (:class:`~runner.errors.
        UnknownTaskType`, :class:`~runner.errors.InvalidPayload` to the handler), written by
        the store fenced by this attempt (:meth:`~runner.store.api.WorkflowStore.spawn`), the
        scans woken for it; a refusal cancels the token and raises TaskCancelled."""
        child_type = self.registry.get(kind)
        child_type.parse(payload)
        template = TaskTemplate.model_validate({"type": kind, "payload": payload, **fields})
        task = claim.task
        child = dataclasses.replace(self.store.tasks.new(
            kind, payload, unique_key=template.unique_key,
            priority=child_type.priority if template.priority is None else template.priority,
            run_at=template.when(), ordering_key=template.ordering_key,
            resources=[*child_type.resources, *template.resources], timeout=template.timeout),
            id=child_id(task.id, key))
        try:
            made = self.store.workflows.spawn(Fence(task.id, claim.token, claim.attempt.id,
                                                    task.resources), task, child)
        except (StaleFencingToken, AttemptAlreadyFinished) as exc:
            slot.cancel.cancel(f"its child {key!r} was refused: {exc}")
            slot.cancel.raise_if_cancelled()
            raise
        except StoreUnavailable as exc:
            slot.cancel.cancel(f"the graph was out of reach when it spawned {key!r} ({exc})")
            slot.cancel.raise_if_cancelled()
            raise
        if made.open:
            self._wake_soon(made)
        return made.id

    def _wake_soon(self, child: Task) -> None:
        """Tell the observers (the node: a TRIGGER_SCAN) of spawned children once per
        :data:`SPAWN_WAKE` seconds, not once per child: a handler that spawns 1,000 children
        wakes the scans a few times, from its first child's ready second."""
        with self._wake_lock:
            if self._wake_from is not None:
                return
            self._wake_from = child

        def wake() -> None:
            with self._wake_lock:
                first, self._wake_from = self._wake_from, None
            if first is not None:
                notify_released(self.observers, [first], first.updated_at)
        timer = threading.Timer(SPAWN_WAKE, wake)
        timer.daemon = True
        timer.start()

    def _exhausted(self, policy: RetryPolicy, claim: Claimed, result: AttemptResult) -> None:
        """The policy's ``on_exhausted`` hook, for a failure it does not retry; logged."""
        if result.exception is not None and not isinstance(result.exception,
                                                           policy.retry_on):
            return  # not a retried kind of error: the policy has nothing to say
        task = claim.task
        log.warning("member %s: task %s (%s) failed %d attempts; it stops: %s",
                    self.member_id, task.id, task.type, task.attempts, result.error)
        if policy.on_exhausted is None:
            return
        try:
            policy.on_exhausted(task, result.error or "")
        except Exception:
            log.exception("member %s: on_exhausted hook of %s failed for task %s",
                          self.member_id, task.type, task.id)
