"""TaskProcessHandler: the task loop every node runs.

Every ``scan_interval`` seconds (an APScheduler interval job), and at once when :meth:`trigger`
is called (a MODEL TRIGGER_SCAN after a submission), it lists the unfinished active tasks
(highest priority first), and for each while a worker is free: books a slot for the task's type
(when the type has a cluster-wide limit), tries the task's lock without waiting, claims the
task with a version- and token-guarded update that writes a RUNNING attempt in the same
transaction, and runs the handler in the bounded worker pool with a cancellation token.

Every task has a preferred member (a hash of its id over the sorted live members). Within a
priority a node walks its own preferred tasks first, oldest first, and then the others', so
nodes working through one queue rarely try the same task; nothing waits for its preferred
member: a node with free workers takes the others' tasks right after its own.

Failure behaviour:

* a lock or slot it cannot take: someone else runs the task; it moves on;
* SUSPENDED session: no new tasks until CONNECTED again; LOST session or a lost lock: the
  affected handlers are cancelled, their attempts end CANCELLED_BY_SYSTEM and only then are the
  locks released (a LOST session has dropped them already);
* a commit conflict: a new attempt after a backoff, up to ``max_conflict_retries``; any other
  error: the attempt FAILED with error and stack trace, the task deactivated;
* :meth:`close`: no new tasks, running ones cancelled, attempts written, locks released, within
  ``shutdown_timeout``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import traceback
import zlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler

from coord import (
    Booking,
    CoordError,
    LockNotHeld,
    Session,
    SessionState,
    SlotLevel,
    Slots,
    TaskLock,
    live_member_ids,
)
from runner.store import (
    Attempt,
    AttemptAlreadyFinished,
    AttemptStatus,
    CommitConflict,
    GraphStore,
    StaleFencingToken,
    StoreError,
    Task,
    TaskStatus,
)
from runner.tasks import (
    CancelToken,
    TaskCancelled,
    TaskConflict,
    TaskContext,
    TaskError,
    TaskRegistry,
)

log = logging.getLogger("latchwork.tasks")

#: before-attempt hooks get the context; after-attempt hooks also the final status and error
BeforeHook = Callable[[TaskContext], None]
AfterHook = Callable[[TaskContext, AttemptStatus, str | None], None]


@dataclass
class _Running:
    """A task this node is starting or running. Registered (and its lost-lock listener with
    it) before the lock is tried, so a lost lock or session during the try or the claim still
    cancels it; ``token`` and ``attempt`` are set once the claim is written."""
    task: Task
    lock: TaskLock
    booking: Booking | None
    token: int = 0
    attempt: Attempt | None = None
    completed: bool = False  # the handler's ctx.complete() concluded the attempt
    cancel: CancelToken = field(default_factory=CancelToken)
    done: threading.Event = field(default_factory=threading.Event)


def preferred_index(task_id: str, members: int) -> int:
    """The index, among ``members`` sorted live member ids, of the task's preferred member."""
    return zlib.crc32(task_id.encode()) % members


class TaskProcessHandler:
    def __init__(self, session: Session, member_id: str, store: GraphStore,
                 registry: TaskRegistry, *, workers: int = 4, scan_interval: float = 5.0,
                 before: Sequence[BeforeHook] = (), after: Sequence[AfterHook] = (),
                 services: Mapping[str, Any] | None = None, max_conflict_retries: int = 10,
                 conflict_backoff: tuple[float, float] = (0.1, 5.0),
                 fresh_for: float = 0.05, own_fresh_for: float = 1.0,
                 relist_share: float = 0.1,
                 live_members: Callable[[], set[str] | None] | None = None) -> None:
        self.session = session
        self.member_id = member_id
        self.store = store
        self.registry = registry
        self.workers = workers
        self.scan_interval = scan_interval
        self.before = list(before)
        self.after = list(after)
        self.services = dict(services or {})
        self.max_conflict_retries = max_conflict_retries
        self.conflict_backoff = conflict_backoff
        self.fresh_for = fresh_for
        self.own_fresh_for = own_fresh_for
        self.relist_share = relist_share
        # the live member ids without a read (the node's membership watch); None: read them
        self.live_members = live_members
        self._running: dict[str, _Running] = {}
        self._lock = threading.Lock()
        self._scan_lock = threading.Lock()
        self._stopping = threading.Event()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="task-worker")
        self._scheduler = BackgroundScheduler(timezone=UTC)
        self._skipped_types: set[str] = set()
        # candidates from the last listing: the task, when its version was last confirmed, and
        # whether this member is its preferred one
        self._backlog: list[tuple[Task, float, bool]] = []
        self._stale_chunks = 0  # version checks in a row that found every candidate changed
        self._listed = (0.0, 0.0)  # when the last listing ended, and how long it took
        # how claims went: started / lock held elsewhere / stale listing (claim conflict)
        self.stats: Counter[str] = Counter()

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> TaskProcessHandler:
        self.session.add_listener(self._on_session)
        self._scheduler.add_job(self.scan, "interval", seconds=self.scan_interval, id="scan",
                                max_instances=1, coalesce=True,
                                next_run_time=datetime.now(UTC))
        self._scheduler.start()
        return self

    def trigger(self) -> None:
        """Scan now (thread-safe), instead of waiting for the interval."""
        if self._stopping.is_set() or not self._scheduler.running:
            return
        try:
            self._scheduler.modify_job("scan", next_run_time=datetime.now(UTC))
        except Exception:  # the scheduler is shutting down
            log.debug("trigger ignored: scheduler stopping")

    def close(self, timeout: float = 20.0) -> None:
        """Stop taking tasks, cancel the running ones and wait for their attempts and locks."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self.session.remove_listener(self._on_session)
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        with self._scan_lock:  # a scan in progress finishes its claims first
            running = self._snapshot()
        for r in running:
            r.cancel.cancel("node shutting down")
        deadline = threading.Event()
        timer = threading.Timer(timeout, deadline.set)
        timer.start()
        for r in running:
            while not r.done.wait(0.05):
                if deadline.is_set():
                    log.error("member %s: task %s did not stop within %gs", self.member_id,
                              r.task.id, timeout)
                    break
        timer.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
        log.info("member %s: task loop stopped; claims: %d started, %d locked elsewhere, "
                 "%d stale; %d changed tasks skipped before locking, %d running elsewhere "
                 "skipped; %d listings", self.member_id, self.stats["started"],
                 self.stats["lock_busy"], self.stats["stale"], self.stats["skipped_stale"],
                 self.stats["skipped_running"], self.stats["listings"])

    def running_tasks(self) -> list[str]:
        return [r.task.id for r in self._snapshot()]

    def _snapshot(self) -> list[_Running]:
        with self._lock:
            return list(self._running.values())

    # -- connection state ----------------------------------------------------------------------
    def _on_session(self, state: SessionState) -> None:
        if state is SessionState.LOST:
            for r in self._snapshot():
                r.cancel.cancel("the ZooKeeper session was lost")
        elif state is SessionState.CONNECTED:
            self.trigger()

    # -- the scan -------------------------------------------------------------------------------
    def scan(self, relist: bool = True) -> int:
        """One pass; returns how many tasks it started.

        ``relist=False`` (a worker just finished) first works through the candidates left from
        the previous listing and lists again only when none are left: listing every open task
        after every finished one would cost more than the tasks themselves when thousands are
        queued. A listing goes stale fast (short tasks finish while one scan walks it, and
        other nodes claim from the same list), so before a lock and a claim are spent on a
        candidate whose version was last seen more than ``fresh_for`` seconds ago
        (``own_fresh_for`` for a task this member is preferred for: the others take those only
        after their own), one read of the versions of the next few candidates drops those that
        changed since. When a whole read finds only changed ones, the rest of the backlog is
        likely stale too (the other nodes took those): the open tasks are listed again, unless
        listing would then take more than a tenth of the time (``relist_share``: a listing costs
        in proportion to the open tasks, a version read to the candidates it checks), in which
        case the next version read covers more candidates at once.
        """
        if self._stopping.is_set() or self.session.state is not SessionState.CONNECTED:
            return 0
        started = 0
        with self._scan_lock:
            if self._free() <= 0:
                return 0
            if (relist or not self._backlog) and not self._list():
                return 0
            while self._backlog:
                if self._free() <= 0 or self._stopping.is_set():
                    break
                task, seen, own = self._backlog[0]
                if time.monotonic() - seen > (self.own_fresh_for if own else self.fresh_for):
                    size = max(4, 2 * self._free()) << min(self._stale_chunks, 4)
                    chunk = self._backlog[:size]
                    try:
                        current = self.store.tasks.versions([t.id for t, _, _ in chunk])
                    except StoreError as exc:
                        log.error("member %s: cannot check tasks: %s", self.member_id, exc)
                        return started
                    seen = time.monotonic()
                    fresh = [(t, seen, o) for t, _, o in chunk if current.get(t.id) == t.version]
                    self.stats["skipped_stale"] += len(chunk) - len(fresh)
                    self._backlog[:len(chunk)] = fresh
                    if not fresh:
                        if not self._may_relist():
                            self._stale_chunks += 1
                        elif not self._list():
                            return started
                        continue
                    self._stale_chunks = 0
                    task = fresh[0][0]  # just confirmed
                self._backlog.pop(0)
                with self._lock:
                    if task.id in self._running:
                        continue
                try:
                    if self._try_start(task):
                        started += 1
                except (CoordError, StoreError) as exc:
                    log.warning("member %s: task %s not started: %s", self.member_id, task.id,
                                exc)
        return started

    def _list(self) -> bool:
        """List the open tasks into the backlog, in the order to try them; False when the
        store cannot be read (logged)."""
        began = time.monotonic()
        try:
            listing = self.store.tasks.unfinished()
            self.stats["listings"] += 1
        except StoreError as exc:
            log.error("member %s: cannot list tasks: %s", self.member_id, exc)
            return False
        seen = time.monotonic()
        self._listed = (seen, seen - began)
        live = self._live()
        self._backlog = [(t, seen, own) for t, own
                         in self._candidates(self._unowned(listing, live), live)]
        self._stale_chunks = 0
        return True

    def _may_relist(self) -> bool:
        """Whether listing again now keeps listing within ``relist_share`` of the time."""
        listed_at, took = self._listed
        return time.monotonic() - listed_at >= took / self.relist_share

    def _free(self) -> int:
        with self._lock:
            return self.workers - len(self._running)

    def _live(self) -> set[str] | None:
        """The live member ids: the watched view when the node gave one and it has reported,
        else one read; None when they cannot be read."""
        if self.live_members is not None:
            live = self.live_members()
            if live is not None:
                return live
        try:
            return live_member_ids(self.session)
        except CoordError as exc:
            log.info("member %s: membership unknown (%s); trying every task", self.member_id,
                     exc)
            return None

    def _unowned(self, tasks: list[Task], live: set[str] | None) -> list[Task]:
        """Drop tasks RUNNING under another live member: their lock is held, and trying it costs
        two round trips each. A RUNNING task whose owner left stays (the master frees its lock
        and puts it back to WAITING), and so does one owned by this member that it does not run
        (its end could not be written): this member takes it up again. Membership unknown
        (``live`` None): all stay, the locks decide."""
        running = [t for t in tasks if t.status is TaskStatus.RUNNING and t.owner
                   and t.owner != self.member_id]
        if not running or live is None:
            return tasks
        skip = {t.id for t in running if t.owner in live}
        self.stats["skipped_running"] += len(skip)
        return [t for t in tasks if t.id not in skip]

    def _candidates(self, tasks: list[Task], live: set[str] | None
                    ) -> list[tuple[Task, bool]]:
        """The order to try ``tasks`` in, each with whether this member is its preferred one.

        Priority first. Within a priority, this member's preferred tasks in first-come order,
        then the others' tasks in first-come order by windows shuffled per node. Every node reads
        the same list; walking it in the same order would make all nodes contend for the same
        tasks and lose most of their claims (a lost claim costs a lock try, two ZooKeeper
        requests). A task's preferred member is ``crc32(task id) mod n`` over the n sorted live
        members: the nodes' first choices are disjoint, and a node that has run out of its own
        takes the others' oldest ones, shuffled a few times the workers wide so that two such
        nodes do not pick the same ones. Membership unknown, or this member not in it: no
        preferred tasks, shuffled windows only.
        """
        window = max(8, 4 * self.workers)
        members = sorted(live or ())
        me = members.index(self.member_id) if self.member_id in members else None
        by_priority: dict[int, list[Task]] = {}
        for task in tasks:
            by_priority.setdefault(task.priority, []).append(task)
        ordered: list[tuple[Task, bool]] = []
        for priority in sorted(by_priority, reverse=True):
            others = by_priority[priority]
            if me is not None and len(members) > 1:
                split: dict[bool, list[Task]] = {True: [], False: []}
                for task in others:
                    split[preferred_index(task.id, len(members)) == me].append(task)
                ordered.extend((t, True) for t in split[True])
                others = split[False]
            for start in range(0, len(others), window):
                chunk = others[start:start + window]
                random.shuffle(chunk)
                ordered.extend((t, False) for t in chunk)
        return ordered

    def _try_start(self, task: Task) -> bool:
        try:
            kind = self.registry.get(task.type)
        except TaskError:
            if task.type not in self._skipped_types:
                self._skipped_types.add(task.type)
                log.warning("member %s: no handler for task type %r here; leaving %s to nodes "
                            "that have one", self.member_id, task.type, task.id)
            return False
        booking = None
        if kind.slot_limit is not None:
            booking = Slots(self.session, self.member_id).try_book(
                [SlotLevel(f"type/{task.type}", kind.slot_limit)])
            if booking is None:
                return False
        lock = TaskLock(self.session, task.id, self.member_id)
        running = _Running(task, lock, booking)
        lock.add_lost_listener(lambda _task: running.cancel.cancel("its task lock was lost"))
        with self._lock:
            self._running[task.id] = running
        try:
            token = lock.try_acquire()
            if token is None:  # someone else runs it
                self.stats["lock_busy"] += 1
                self._abandon(running)
                return False
            # the version read by the scan guards the claim: if the task changed since (another
            # node finished it, an operator stopped it), the claim is a conflict and we move on.
            # The RUNNING attempt is written in the same transaction, before the handler runs.
            running.task, running.attempt = self.store.claim(task, token, self.member_id)
            running.token = token
        except (CommitConflict, StaleFencingToken):
            self.stats["stale"] += 1
            self._abandon(running)
            return False
        except BaseException:
            self._abandon(running)
            raise
        self.stats["started"] += 1
        # a lock or session lost since registration has cancelled the token already: the
        # handler does not run and the attempt ends CANCELLED_BY_SYSTEM
        self._pool.submit(self._execute, running)
        return True

    def _abandon(self, r: _Running) -> None:
        """A start that did not happen: release the lock and slot, forget the entry."""
        self._release(r.lock, r.booking)
        with self._lock:
            self._running.pop(r.task.id, None)
        r.done.set()

    def _release(self, lock: TaskLock, booking: Booking | None) -> None:
        try:
            lock.release()
        except (LockNotHeld, CoordError) as exc:
            log.info("member %s: lock of task %s already gone: %s", self.member_id,
                     lock.task_id, exc)
        if booking is not None:
            try:
                booking.release()
            except CoordError as exc:
                log.info("member %s: slot booking already gone: %s", self.member_id, exc)

    # -- running a task --------------------------------------------------------------------------
    def _execute(self, r: _Running) -> None:
        task = r.task
        outcome = "cancelled"
        attempt = r.attempt
        assert attempt is not None  # claimed
        try:
            kind = self.registry.get(task.type)
            retries = 0
            while True:
                status, error, stack = self._run_handler(r, kind, attempt)
                if status is AttemptStatus.FAILED and error is not None \
                        and error.startswith("commit conflict") \
                        and retries < self.max_conflict_retries:
                    self._finish(attempt, status, error, stack)
                    retries += 1
                    first, cap = self.conflict_backoff
                    delay = random.uniform(0, min(cap, first * 2 ** retries))
                    log.info("member %s: task %s (%s): %s; retry %d in %.2fs", self.member_id,
                             task.id, task.type, error, retries, delay)
                    if not r.cancel.wait(delay):
                        # the next attempt: a claim of the task as this owner last wrote it
                        try:
                            r.task, attempt = self.store.claim(r.task, r.token, self.member_id)
                            continue
                        except (CommitConflict, StaleFencingToken) as exc:
                            # changed meanwhile (an operator stopped it, another owner): no new
                            # attempt here; the task goes back as it now stands
                            log.warning("member %s: task %s (%s) not retried: %s",
                                        self.member_id, task.id, task.type, exc)
                    # cancelled while waiting to retry, or changed: no new attempt, the task
                    # goes back
                    outcome = "cancelled"
                    self._conclude(r, None, status, error, stack, outcome)
                    break
                outcome = {AttemptStatus.SUCCEEDED: "finished",
                           AttemptStatus.CANCELLED_BY_SYSTEM: "cancelled"}.get(status, "stopped")
                if r.completed:
                    if status is not AttemptStatus.SUCCEEDED:
                        log.error("member %s: task %s (%s) failed after ctx.complete(): %s; "
                                  "its attempt stays SUCCEEDED", self.member_id, task.id,
                                  task.type, error)
                    break  # concluded by ctx.complete()
                self._conclude(r, attempt, status, error, stack, outcome)
                break
        except Exception as exc:
            log.exception("member %s: task %s: unexpected failure in the task loop",
                          self.member_id, task.id)
            try:  # leave no RUNNING attempt behind; the task stays open for another try
                self.store.attempts.finish(attempt.id, AttemptStatus.FAILED,
                                           f"internal error in the task loop: {exc!r}",
                                           "".join(traceback.format_exception(exc)))
            except StoreError:
                pass  # already finished, or the store is gone: the reaper cannot help here
        finally:
            # locks go only after the attempt and the task are written
            self._release(r.lock, r.booking)
            with self._lock:
                self._running.pop(task.id, None)
            r.done.set()
            if outcome != "cancelled" and not self._stopping.is_set():
                try:
                    self.scan(relist=False)  # a worker is free
                except Exception:
                    log.exception("member %s: follow-up scan failed", self.member_id)

    def _run_handler(self, r: _Running, kind: Any, attempt: Attempt
                     ) -> tuple[AttemptStatus, str | None, str | None]:
        task = r.task
        ctx = TaskContext(task=task, attempt=attempt, member_id=self.member_id,
                          fence_token=r.token, cancel=r.cancel, store=self.store,
                          services=self.services, checker=lambda: self._check(r),
                          completer=lambda write: self._complete(r, attempt, write))
        log.info("member %s: task %s (%s) attempt %d started", self.member_id, task.id,
                 task.type, attempt.seq)
        status, error, stack = AttemptStatus.SUCCEEDED, None, None
        entered: list[AfterHook] = []
        try:
            for hook in self.before:
                hook(ctx)
            entered = list(self.after)
            r.cancel.raise_if_cancelled()
            kind.handler(ctx, kind.parse(task.payload))
            if r.cancel.cancelled:
                raise TaskCancelled(r.cancel.reason)
        except TaskCancelled:
            status = AttemptStatus.CANCELLED_BY_SYSTEM
            error = f"cancelled by system: {r.cancel.reason}"
        except (TaskConflict, CommitConflict) as exc:
            status, error = AttemptStatus.FAILED, f"commit conflict: {exc}"
        except Exception as exc:
            if r.cancel.cancelled:
                status = AttemptStatus.CANCELLED_BY_SYSTEM
                error = f"cancelled by system: {r.cancel.reason} ({exc!r})"
            else:
                status, error = AttemptStatus.FAILED, f"{type(exc).__name__}: {exc}"
                stack = "".join(traceback.format_exception(exc))
        for after_hook in reversed(entered):  # unwound in reverse order
            try:
                after_hook(ctx, status, error)
            except Exception:
                log.exception("after-attempt hook failed for task %s", task.id)
        level = logging.INFO if status is AttemptStatus.SUCCEEDED else logging.WARNING
        log.log(level, "member %s: task %s (%s) attempt %d %s%s", self.member_id, task.id,
                task.type, attempt.seq, status.value, f": {error}" if error else "")
        return status, error, stack

    def _check(self, r: _Running) -> None:
        """``ctx.check()``: raise TaskCancelled (and cancel the token) unless this node still
        owns the task: session CONNECTED, lock node there with the same czxid (one ZooKeeper
        read), the token still the task's (one store read)."""
        state = self.session.state
        if state is not SessionState.CONNECTED:
            r.cancel.cancel(f"the ZooKeeper session is {state.value}")
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

    def _complete(self, r: _Running, attempt: Attempt, write: Callable[[Any], Any]) -> Any:
        """``ctx.complete()``: the effect, the attempt's success and the task's finish in one
        store write; a refusal cancels the token and raises TaskCancelled."""
        try:
            result, r.task = self.store.complete(attempt, r.task, r.token, write)
        except AttemptAlreadyFinished:
            r.cancel.cancel("its attempt was closed by someone else before it completed")
        except StaleFencingToken as exc:
            r.cancel.cancel(f"its fencing token was superseded before it completed ({exc})")
        r.cancel.raise_if_cancelled()
        r.completed = True
        return result

    def _finish(self, attempt: Attempt, status: AttemptStatus, error: str | None,
                stack: str | None) -> None:
        try:
            self.store.attempts.finish(attempt.id, status, error, stack)
        except AttemptAlreadyFinished:
            log.warning("member %s: attempt %s of task %s was closed by the master meanwhile",
                        self.member_id, attempt.id, attempt.task_id)

    def _conclude(self, r: _Running, attempt: Attempt | None, status: AttemptStatus,
                  error: str | None, stack: str | None, outcome: str) -> None:
        """Write the attempt's end (unless already written) and the task's new state as its
        owner, in one transaction when possible. Once the attempt was closed by someone else,
        or the token is no longer the task's, nothing more is written on the task."""
        changes: dict[str, Any] = {"status": TaskStatus.WAITING}
        if outcome == "finished":
            changes["finished"] = True
        elif outcome == "stopped":
            changes["active"] = False
        try:
            if attempt is not None:
                self.store.conclude(attempt, status, error, stack, r.task, r.token, changes)
            else:
                self.store.release(r.task.id, r.token, changes)
        except StaleFencingToken:
            log.warning("member %s: task %s was taken over by another owner; leaving it",
                        self.member_id, r.task.id)
        except AttemptAlreadyFinished:
            log.warning("member %s: the attempt of task %s was closed by the master meanwhile "
                        "(or by an operator); leaving the task to them", self.member_id,
                        r.task.id)
        except CommitConflict:
            log.error("member %s: could not record the end of task %s", self.member_id,
                      r.task.id)
