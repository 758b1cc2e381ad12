"""TaskProcessHandler: the task loop every node runs (the scan and its driver).

Every ``scan_interval`` seconds (an APScheduler interval job), and at once when :meth:`trigger`
is called (a MODEL TRIGGER_SCAN after a submission), it lists the unfinished active tasks
(highest priority first), and for each while a worker is free: books a slot for the task's type
(when the type has a cluster-wide limit), tries the task's lock without waiting, claims the
task with a version- and token-guarded update that writes a RUNNING attempt in the same
transaction, and runs the handler in the bounded worker pool with a cancellation token.

The order comes from :mod:`runner.tasks.backlog`, the claim from :mod:`runner.tasks.claim`, the
run and its conclusion from :mod:`runner.tasks.execution`. Every task has a preferred member (a
hash of its id over the sorted live members). Within a priority a node walks its own preferred
tasks first, oldest first, and then the others', so nodes working through one queue rarely try
the same task; nothing waits for its preferred member: a node with free workers takes the
others' tasks right after its own.

Failure behaviour:

* a lock or slot it cannot take: someone else runs the task; it moves on;
* SUSPENDED session: no claim is tried until CONNECTED again, but running handlers go on: a
  confirmation they ask for meanwhile (``ctx.check()``, ``ctx.complete()``, the lock check
  when the handler ends) waits, bounded by the session's deadline, for RECONNECTED (confirmed)
  or LOST (cancelled), so a ZooKeeper leader election costs no work; LOST session (or its
  deadline passed, which each handler's token reads from the clock) or a lost lock: the
  affected handlers are cancelled, their attempts end CANCELLED_BY_SYSTEM and only then are the
  locks released (a LOST session has dropped them already);
* a commit conflict: a new attempt after a backoff, up to ``max_conflict_retries``; any other
  error: the attempt FAILED with error and stack trace, the task deactivated (or, with a retry
  policy, back to WAITING until its backoff ends);
* a task this node lost (its attempt cancelled by the master, a lost lock): the worker looks
  for work again ``rescan_after_cancel`` seconds later (at once would loop on a lock that keeps
  being lost), and the task, back as it stands, is taken by whichever node lists it first;
* :meth:`close`: no new tasks, running ones cancelled, attempts written, locks released, within
  ``shutdown_timeout``.

Why one module: the scan, the backlog it walks, the running set and the worker pool share one
pair of locks (``_scan_lock`` over a pass, ``_lock`` over the running set); the pure ordering,
the claim, the execution and the due-time timer (:mod:`runner.tasks.timing`) are already apart.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler

from coord import Booking, CoordError, Session, SessionState, Slots, live_member_ids
from runner.errors import StoreError, TaskError
from runner.store import GraphStore, Task, TaskStatus, codec
from runner.tasks import backlog
from runner.tasks.claim import Running, claim, key_only, release, release_booking
from runner.tasks.execution import AfterHook, BeforeHook, Execution
from runner.tasks.outcomes import Outcome
from runner.tasks.registry import TaskRegistry
from runner.tasks.timing import DueTimer

log = logging.getLogger("latchwork.tasks")


class TaskProcessHandler:
    def __init__(self, session: Session, member_id: str, store: GraphStore,
                 registry: TaskRegistry, *, workers: int = 4, scan_interval: float = 5.0,
                 before: Sequence[BeforeHook] = (), after: Sequence[AfterHook] = (),
                 services: Mapping[str, Any] | None = None, max_conflict_retries: int = 10,
                 conflict_backoff: tuple[float, float] = (0.1, 5.0),
                 fresh_for: float = 0.05, own_fresh_for: float = 1.0,
                 relist_share: float = 0.1,
                 live_members: Callable[[], set[str] | None] | None = None,
                 scan_observer: Callable[[float], None] | None = None,
                 limits: Mapping[str, int] | None = None,
                 others_grace: float = 0.3) -> None:
        self.session = session
        self.member_id = member_id
        self.store = store
        self.registry = registry
        self.workers = workers
        self.scan_interval = scan_interval
        self.execution = Execution(session, member_id, store, registry, before=before,
                                   after=after, services=services,
                                   max_conflict_retries=max_conflict_retries,
                                   conflict_backoff=conflict_backoff)
        self.fresh_for = fresh_for
        self.own_fresh_for = own_fresh_for
        self.relist_share = relist_share
        # the live member ids without a read (the node's membership watch); None: read them
        self.live_members = live_members
        self.scan_observer = scan_observer  # gets the seconds each scan took (metrics)
        self.limits = dict(limits or {})  # cluster-wide limits per task group (claim.levels)
        self._slots = Slots(session, member_id)
        #: tasks this node's handlers declined, and until when it leaves them to the others
        self._declined: dict[str, float] = {}
        self.decline_for = max(10.0, 3 * scan_interval)
        #: a worker whose task was cancelled (lost) looks for work again after this long
        self.rescan_after_cancel = min(1.0, scan_interval)
        self._running: dict[str, Running] = {}
        self._lock = threading.Lock()
        self._scan_lock = threading.Lock()
        self._stopping = threading.Event()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="task-worker")
        self._scheduler = BackgroundScheduler(timezone=UTC)
        self._skipped_types: set[str] = set()
        # candidates from the last listing: the task, when its version was last confirmed, and
        # whether this member is its preferred one
        self._backlog: list[tuple[Task, float, bool]] = []
        #: listed tasks not due yet, and the timer that starts a scan when one is
        self._later = DueTimer(self._on_due, others_grace)
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
        self._later.close()
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

    def _snapshot(self) -> list[Running]:
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
        """One pass (see :meth:`_scan`), timed for ``scan_observer``."""
        began = time.monotonic()
        try:
            return self._scan(relist)
        finally:
            if self.scan_observer is not None:
                self.scan_observer(time.monotonic() - began)

    def _scan(self, relist: bool = True) -> int:
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
        if not self._may_claim():
            return 0
        started = 0
        with self._scan_lock:
            started += self._start_due(self._later.take_due())
            if self._free() <= 0:
                return started
            # a follow-up with nothing left lists again (within the listing budget) to find
            # tasks that came back without a word (another node's lost task); not while
            # listed tasks wait for their time: the timer wakes this node for those, new
            # submissions announce themselves, the interval scan catches the rest, and
            # listing every open task after every finished one would cost more than the tasks
            if (relist or (not self._backlog and not self._later.planned()
                           and self._may_relist())) and not self._list():
                return 0
            while self._backlog:
                if self._free() <= 0 or not self._may_claim():
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

    def _start_due(self, due: list[tuple[Task, bool]]) -> int:
        """Start the tasks whose time came (the due-time timer), before the backlog: this
        member's as listed, the others' (their preferred member had ``others_grace`` to take
        them) after one read of their versions. That those others mostly changed says nothing
        about the rest of the backlog, so it asks no new listing. Tasks left over when the
        workers are busy go to the front of the backlog."""
        if not due:
            return 0
        others = [t.id for t, own in due if not own]
        current: dict[str, int] = {}
        if others:
            try:
                current = self.store.tasks.versions(others)
            except StoreError as exc:
                log.error("member %s: cannot check due tasks: %s", self.member_id, exc)
        now = time.monotonic()
        ready = [(t, own) for t, own in due if own or current.get(t.id) == t.version]
        self.stats["skipped_stale"] += len(due) - len(ready)
        started = 0
        for n, (task, _own) in enumerate(ready):
            if self._free() <= 0 or not self._may_claim():
                self._backlog[:0] = [(t, now, o) for t, o in ready[n:]]
                break
            with self._lock:
                if task.id in self._running:
                    continue
            try:
                started += self._try_start(task)
            except (CoordError, StoreError) as exc:
                log.warning("member %s: task %s not started: %s", self.member_id, task.id, exc)
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
        keyed_first, behind = backlog.first_per_key(listing)
        self.stats["behind_key"] += behind
        tasks, skipped = backlog.unowned(keyed_first, live, self.member_id)
        self.stats["skipped_running"] += skipped
        ready, later = backlog.split_due(tasks, codec.now())
        self._backlog = [(t, seen, own) for t, own
                         in backlog.candidates(ready, live, self.member_id, self.workers)]
        self._later.plan([(t, backlog.is_preferred(t.id, live, self.member_id))
                          for t in later])
        self._stale_chunks = 0
        return True

    def _on_due(self) -> None:
        try:
            self.scan(relist=False)
        except Exception:
            log.exception("member %s: scan of due tasks failed", self.member_id)

    def _may_claim(self) -> bool:
        """No claim is tried while the session is not CONNECTED (SUSPENDED: unknown), nor
        once the loop stops; the scan that follows RECONNECTED picks the work up."""
        return not self._stopping.is_set() and self.session.state is SessionState.CONNECTED

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

    def _try_start(self, task: Task) -> bool:
        with self._lock:
            if self._declined.get(task.id, 0.0) > time.monotonic():
                return False
        try:
            kind = self.registry.get(task.type)
        except TaskError:
            if task.type not in self._skipped_types:
                self._skipped_types.add(task.type)
                log.warning("member %s: no handler for task type %r here; leaving %s to nodes "
                            "that have one", self.member_id, task.type, task.id)
            return False
        running = claim(self.session, self.store, self.member_id, task, kind,
                        register=self._register, forget=self._forget, stats=self.stats,
                        limits=self.limits, slots=self._slots)
        if running is None:
            return False
        # a lock or session lost since registration has cancelled the token already: the
        # handler does not run and the attempt ends CANCELLED_BY_SYSTEM
        self._pool.submit(self._execute, running)
        return True

    def _register(self, r: Running) -> None:
        with self._lock:
            self._running[r.task.id] = r

    def _forget(self, r: Running) -> None:
        with self._lock:
            self._running.pop(r.task.id, None)

    def _execute(self, first: Running) -> None:
        """Run ``first``; when it was a task of an ordering key and finished, run the key's
        next task in this same worker (:meth:`_next_of_key`), and so on; then look for work."""
        r: Running | None = first
        outcome = Outcome.CANCELLED
        queue = list(first.key_queue)  # the key's queue as read at the chain's last read
        while r is not None:
            outcome, kept = self._run_one(r)
            key, r = r.task.ordering_key, None
            if self._stopping.is_set() or key is None or outcome is not Outcome.FINISHED:
                if kept is not None:
                    release_booking(kept, self.member_id)
            else:
                r = self._next_of_key(key, kept, queue)
        if self._stopping.is_set():
            return
        if outcome is Outcome.CANCELLED:
            # a task this node lost goes back as it stands; look again a little later
            # (at once would loop on a lock that keeps being lost), whoever takes it
            timer = threading.Timer(self.rescan_after_cancel, self.trigger)
            timer.daemon = True
            timer.start()
            return
        try:
            self.scan(relist=False)  # a worker is free
        except Exception:
            log.exception("member %s: follow-up scan failed", self.member_id)

    def _next_of_key(self, key: str, kept: Booking | None, queue: list[Task]
                     ) -> Running | None:
        """The next task of ``key``, claimed by this worker, which just finished the key's
        task before it and may still hold the key (``kept``): the last listing left that task
        out (one task per key), and a claim here needs no scan (and, with the key kept, no
        new booking). ``queue`` is the key's queue as this chain last read it: tasks are only
        ever added at its end, and the claim is guarded by the version read, so its next
        entry is claimed without a read; when it is spent, or its entry changed since (an
        operator stopped or skipped it: the claim fails), the key's queue is read once.
        None, with the key let go, when there is nothing to start now or someone else has it
        (the scans find it then)."""
        if queue:
            started = self._claim_next(queue.pop(0), kept)
            if started is not None:
                return started
            kept = None  # a refused claim let the key go
        try:
            queue[:] = self.store.tasks.with_key(key)
        except StoreError as exc:
            log.info("member %s: next task of key %s unknown: %s", self.member_id, key, exc)
            queue.clear()
        if not queue:
            if kept is not None:
                release_booking(kept, self.member_id)
            return None
        return self._claim_next(queue.pop(0), kept)

    def _claim_next(self, task: Task, kept: Booking | None) -> Running | None:
        """Claim ``task``, the first of its key's queue, for this worker (see
        :meth:`_next_of_key`); ``kept`` is used when the key is all it books, else let go."""
        kind = None
        if task.open and task.status is TaskStatus.WAITING and (
                task.run_at is None or task.run_at <= codec.now()):
            try:
                kind = self.registry.get(task.type)  # else the nodes that have its type
            except TaskError:
                kind = None
            with self._lock:
                if self._declined.get(task.id, 0.0) > time.monotonic():
                    kind = None
        if kind is None:
            if kept is not None:
                release_booking(kept, self.member_id)
            return None
        held = kept
        if kept is not None and not key_only(task, kind, self.limits):
            release_booking(kept, self.member_id)  # it books more: one booking of it all
            held = None
        try:
            return claim(self.session, self.store, self.member_id, task, kind,
                         register=self._register, forget=self._forget, stats=self.stats,
                         limits=self.limits, slots=self._slots, first_checked=True,
                         held=held)
        except (CoordError, StoreError) as exc:
            log.warning("member %s: task %s not started: %s", self.member_id, task.id, exc)
            return None

    def _run_one(self, r: Running) -> tuple[Outcome, Booking | None]:
        """Run ``r``; its outcome, and its booking when kept for the key's next task (a
        finished task whose booking is its ordering key alone)."""
        outcome = Outcome.CANCELLED
        kept = None
        try:
            outcome = self.execution.run(r)
            if outcome is Outcome.DECLINED:  # left to the other nodes for a while
                with self._lock:
                    self._declined[r.task.id] = time.monotonic() + self.decline_for
            kind = self.registry.get(r.task.type)
            if outcome is Outcome.FINISHED and r.booking is not None \
                    and not self._stopping.is_set() and key_only(r.task, kind, self.limits):
                kept = r.booking
        finally:
            # locks go only after the attempt and the task are written
            release(r.lock, None if kept is not None else r.booking, self.member_id)
            self._forget(r)
            r.done.set()
            if outcome is Outcome.RETRY_LATER and r.task.run_at is not None:
                # its next attempt is this member's to time (the others' listings find it too)
                self._later.add(r.task, True)
        return outcome, kept
