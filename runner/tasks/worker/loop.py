"""TaskLoop: the task loop every node runs (the scan and its driver; the design's
"TaskProcessHandler").

Every ``scan_interval`` seconds (an APScheduler interval job), and at once when :meth:`trigger`
is called (a MODEL TRIGGER_SCAN after a submission), it lists the unfinished active tasks
(highest priority first), and for each while a worker is free: books a slot for the task's type
(when the type has a cluster-wide limit), tries the task's lock without waiting, claims the
task with a version- and token-guarded update that writes a RUNNING attempt in the same
transaction, and runs the handler in the bounded worker pool with a cancellation token.

The order comes from :mod:`.backlog`, the claim from :mod:`.claim` (into the running set of
:mod:`.running`), the run and its conclusion from :mod:`.execution`, the next task of an ordering
key from :mod:`.chain`, the due-time timer from :mod:`.timing`. Every task has a preferred
member (a hash of its id over the sorted live members). Within a priority a node walks its own
preferred tasks first, oldest first, and then the others', so nodes working through one queue
rarely try
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
* a commit conflict: a new attempt after a backoff, up to ``max_conflict_retries`` (its
  :class:`LoopSettings`); any other
  error: the attempt FAILED with error and stack trace, the task deactivated (or, with a retry
  policy, back to WAITING until its backoff ends);
* a task this node lost (its attempt cancelled by the master, a lost lock): the worker looks
  for work again ``rescan_after_cancel`` seconds later (at once would loop on a lock that keeps
  being lost), and the task, back as it stands, is taken by whichever node lists it first;
* :meth:`close`: no new tasks, running ones cancelled, attempts written, locks released, within
  ``shutdown_timeout``.

Why one module: the scan, the backlog it walks and the listing's freshness rules share one lock
(``_scan_lock`` over a pass) and one set of counters; everything else is apart.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime

from apscheduler.schedulers.background import BackgroundScheduler

from coord import Booking, CoordError, Session, SessionState, live_member_ids
from runner.errors import StoreError, TaskError
from runner.store import GraphStore, Task, codec
from runner.tasks.context import Services
from runner.tasks.observer import Observer, notify_scan
from runner.tasks.outcomes import Outcome
from runner.tasks.registry import TaskRegistry, TaskType
from runner.tasks.worker import backlog
from runner.tasks.worker.chain import KeyChain
from runner.tasks.worker.claim import Claimer, key_only, plain, release, release_booking
from runner.tasks.worker.execution import Execution
from runner.tasks.worker.running import Running, RunningSet
from runner.tasks.worker.timing import DueTimer

log = logging.getLogger("latchwork.tasks")


@dataclass(frozen=True)
class LoopSettings:
    """How a node's task loop runs (the node fills it from its :class:`~runner.config.Settings`).

    ``fresh_for`` / ``own_fresh_for``: how long a listed candidate's version is trusted before
    a claim (see :meth:`TaskLoop._scan`); ``relist_share``: the share of the time a listing may
    take; ``others_grace``: how long a due task waits for its preferred member; ``limits``:
    cluster-wide limits per task group (:func:`~runner.tasks.worker.claim.levels`);
    ``store_retry_for``: how long the end of an attempt is tried again while the graph is
    unreachable."""

    workers: int = 4
    scan_interval: float = 5.0
    max_conflict_retries: int = 10
    conflict_backoff: tuple[float, float] = (0.1, 5.0)
    fresh_for: float = 0.05
    own_fresh_for: float = 1.0
    relist_share: float = 0.1
    others_grace: float = 0.3
    limits: Mapping[str, int] = field(default_factory=dict)
    store_retry_for: float = 60.0


class TaskLoop:
    def __init__(self, session: Session, member_id: str, store: GraphStore,
                 registry: TaskRegistry, settings: LoopSettings | None = None, *,
                 observers: Sequence[Observer] = (),
                 services: Services | None = None,
                 live_members: Callable[[], set[str] | None] | None = None) -> None:
        self.session = session
        self.member_id = member_id
        self.store = store
        self.registry = registry
        self.settings = settings = settings or LoopSettings()
        self.observers = list(observers)  # hear attempts and scans (runner.tasks.observer)
        self.execution = Execution(session, member_id, store, registry,
                                   observers=self.observers, services=services,
                                   max_conflict_retries=settings.max_conflict_retries,
                                   conflict_backoff=settings.conflict_backoff,
                                   store_retry_for=settings.store_retry_for)
        # the live member ids without a read (the node's membership watch); None: read them
        self.live_members = live_members
        self.running = RunningSet(settings.workers)
        self.claimer = Claimer(session, store, member_id, self.running, settings.limits)
        self.chain = KeyChain(self.claimer, store, registry)
        #: how long this node leaves a task its handler declined to the others
        self.decline_for = max(10.0, 3 * settings.scan_interval)
        #: a worker whose task was cancelled (lost) looks for work again after this long
        self.rescan_after_cancel = min(1.0, settings.scan_interval)
        self._scan_lock = threading.Lock()
        self._stopping = threading.Event()
        self._pool = ThreadPoolExecutor(settings.workers, thread_name_prefix="task-worker")
        #: claims of tasks this node has just created (:meth:`offer`), one at a time
        self._offers = ThreadPoolExecutor(1, thread_name_prefix="task-offer")
        self._scheduler = BackgroundScheduler(timezone=UTC)
        self._skipped_types: set[str] = set()
        # candidates from the last listing: the task, when its version was last confirmed, and
        # whether this member is its preferred one
        self._backlog: list[tuple[Task, float, bool]] = []
        #: listed tasks not due yet, and the timer that starts a scan when one is
        self._later = DueTimer(self._on_due, settings.others_grace)
        self._stale_chunks = 0  # version checks in a row that found every candidate changed
        self._listed = (0.0, 0.0)  # when the last listing ended, and how long it took

    @property
    def stats(self) -> Counter[str]:
        """How claims and scans went: started / lock held elsewhere / stale listing (claim
        conflict) / ..., and the scans' own counts (skipped, listings)."""
        return self.claimer.stats

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> TaskLoop:
        self.session.add_listener(self._on_session)
        self._scheduler.add_job(self.scan, "interval", seconds=self.settings.scan_interval,
                                id="scan",
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

    def offer(self, task: Task, otherwise: Callable[[], object] | None = None) -> bool:
        """A task this node has just created (its create committed): claimed at once by a free
        worker of this node, without waiting for a scan or listing the open tasks. Handed to a
        thread of its own, so the submitter's reply is not held up. False when it is not tried
        (no free worker, not due yet, the session not CONNECTED, the loop stopping); when it
        is tried and not started (its lock taken, a claim refused), ``otherwise()`` is called
        on that thread: the node then tells the others (TRIGGER_SCAN) as it does for a task it
        cannot take. A task that was taken needs no other node, and nobody else lists it."""
        if not self._may_start(task):
            return False
        try:
            self._offers.submit(self._start_offered, task, otherwise)
        except RuntimeError:  # shutting down
            return False
        return True

    def start_new(self, task: Task) -> Task | None:
        """A task this node has just accepted and not written yet (``tasks.new``): when a
        worker of this node is free and nothing has to be looked up or booked first (a plain
        task: no slot level, resource or ordering key; no uniqueness key; due now), it is
        written already claimed by this node, RUNNING with its attempt, in one store write
        after its lock (:meth:`Claimer.claim_new`), and its handler starts in the pool: the
        task as written. None when that is not tried or not had (no free worker, a scan
        holding the loop this instant, the session not CONNECTED, the loop stopping): the
        caller writes the task WAITING and :meth:`offer`\\ s it. Store and ZooKeeper errors
        propagate with nothing written (the submit fails as a failed create does)."""
        if not self._may_start(task) or task.unique_key is not None:
            return None
        kind = self._kind_of(task)
        if kind is None or not plain(task, kind, self.claimer.limits):
            return None
        # a scan walking its backlog now holds the loop: the submit does not wait for it
        if not self._scan_lock.acquire(blocking=False):
            return None
        try:
            if self.running.free() <= 0 or not self._may_claim():
                return None
            running = self.claimer.claim_new(task)
        finally:
            self._scan_lock.release()
        if running is None:
            return None
        self.stats["offered"] += 1
        self._pool.submit(self._execute, running)
        return running.task

    def _start_offered(self, task: Task, otherwise: Callable[[], object] | None) -> None:
        started = False
        with self._scan_lock:
            if self.running.free() > 0 and self._may_claim() and task.id not in self.running:
                try:
                    started = self._try_start(task)
                except (CoordError, StoreError) as exc:
                    log.warning("member %s: task %s not started: %s", self.member_id,
                                task.id, exc)
        if started:
            self.stats["offered"] += 1
        elif otherwise is not None:
            try:
                otherwise()
            except Exception:
                log.exception("member %s: task %s: telling the other nodes failed",
                              self.member_id, task.id)

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
            running = self.running.snapshot()
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
        self._offers.shutdown(wait=False, cancel_futures=True)
        self.execution.progress_writer.close()
        log.info("member %s: task loop stopped; claims: %d started, %d locked elsewhere, "
                 "%d stale; %d changed tasks skipped before locking, %d running elsewhere "
                 "skipped; %d listings; %d ends written in %d groups (largest %d)",
                 self.member_id, self.stats["started"],
                 self.stats["lock_busy"], self.stats["stale"], self.stats["skipped_stale"],
                 self.stats["skipped_running"], self.stats["listings"],
                 self.execution.commits.stats["concluded"],
                 self.execution.commits.stats["groups"],
                 self.execution.commits.stats["largest"])

    def running_tasks(self) -> list[str]:
        return [r.task.id for r in self.running.snapshot()]

    # -- connection state ----------------------------------------------------------------------
    def _on_session(self, state: SessionState) -> None:
        if state is SessionState.LOST:
            for r in self.running.snapshot():
                r.cancel.cancel("the ZooKeeper session was lost")
        elif state is SessionState.CONNECTED:
            self.trigger()

    # -- the scan -------------------------------------------------------------------------------
    def scan(self, relist: bool = True) -> int:
        """One pass (see :meth:`_scan`), timed for the observers."""
        began = time.monotonic()
        try:
            return self._scan(relist)
        finally:
            notify_scan(self.observers, time.monotonic() - began)

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
            if self.running.free() <= 0:
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
                if self.running.free() <= 0 or not self._may_claim():
                    break
                task, seen, own = self._backlog[0]
                trusted = self.settings.own_fresh_for if own else self.settings.fresh_for
                if time.monotonic() - seen > trusted:
                    size = max(4, 2 * self.running.free()) << min(self._stale_chunks, 4)
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
                # as many candidates as there are free workers, all still trusted: one batch
                batch: list[Task] = []
                now = time.monotonic()
                while self._backlog and len(batch) < self.running.free():
                    task, seen, own = self._backlog[0]
                    trusted = self.settings.own_fresh_for if own else self.settings.fresh_for
                    if batch and now - seen > trusted:
                        break  # the next pass through the loop checks its version first
                    self._backlog.pop(0)
                    if task.id not in self.running and task.id not in {t.id for t in batch}:
                        batch.append(task)
                started += self._start_batch(batch)
        return started

    def _start_batch(self, batch: list[Task]) -> int:
        """Start ``batch``: the plain tasks together (:meth:`Claimer.claim_many`: their locks
        pipelined, their claims in one store write), the others (slots, holds, keys) one by
        one; how many started."""
        started = 0
        alone: list[tuple[Task, TaskType]] = []
        together: list[tuple[Task, TaskType]] = []
        for task in batch:
            kind = self._kind_of(task)
            if kind is not None:
                (together if plain(task, kind, self.claimer.limits) else alone).append(
                    (task, kind))
        if len(together) == 1:  # a batch of one is a claim like any other
            alone.append(together.pop())
        for task, kind in alone:
            try:
                started += self._start(task, kind)
            except (CoordError, StoreError) as exc:
                log.warning("member %s: task %s not started: %s", self.member_id, task.id, exc)
        if not together:
            return started
        try:
            runs = self.claimer.claim_many([task for task, _ in together])
        except (CoordError, StoreError) as exc:
            log.warning("member %s: tasks %s not started: %s", self.member_id,
                        ", ".join(task.id for task, _ in together), exc)
            return started
        for running in runs:
            self._pool.submit(self._execute, running)
        return started + len(runs)

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
            if self.running.free() <= 0 or not self._may_claim():
                self._backlog[:0] = [(t, now, o) for t, o in ready[n:]]
                break
            if task.id in self.running:
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
        self._backlog = [(t, seen, own) for t, own in backlog.candidates(
            ready, live, self.member_id, self.settings.workers)]
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

    def _may_start(self, task: Task) -> bool:
        """Whether a task that is due now may start here now: a free worker, the session
        CONNECTED, the loop running (the tasks a submit brings: :meth:`start_new`,
        :meth:`offer`)."""
        return (self.running.free() > 0 and self._may_claim()
                and (task.run_at is None or task.run_at <= codec.now()))

    def _may_relist(self) -> bool:
        """Whether listing again now keeps listing within ``relist_share`` of the time."""
        listed_at, took = self._listed
        return time.monotonic() - listed_at >= took / self.settings.relist_share

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

    def _kind_of(self, task: Task) -> TaskType | None:
        """The type of a task this node may try: None when its handler declined it lately or
        this node has no handler for its type (logged once per type)."""
        if self.running.declined(task.id):
            return None
        try:
            return self.registry.get(task.type)
        except TaskError:
            if task.type not in self._skipped_types:
                self._skipped_types.add(task.type)
                log.warning("member %s: no handler for task type %r here; leaving %s to nodes "
                            "that have one", self.member_id, task.type, task.id)
            return None

    def _try_start(self, task: Task) -> bool:
        kind = self._kind_of(task)
        return kind is not None and self._start(task, kind)

    def _start(self, task: Task, kind: TaskType) -> bool:
        running = self.claimer.claim(task, kind)
        if running is None:
            return False
        # a lock or session lost since registration has cancelled the token already: the
        # handler does not run and the attempt ends CANCELLED_BY_SYSTEM
        self._pool.submit(self._execute, running)
        return True

    def _execute(self, first: Running) -> None:
        """Run ``first``; when it was a task of an ordering key and finished, run the key's
        next task in this same worker (:class:`~runner.tasks.worker.chain.KeyChain`), and so on;
        then look for work."""
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
                r = self.chain.next(key, kept, queue)
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

    def _run_one(self, r: Running) -> tuple[Outcome, Booking | None]:
        """Run ``r``; its outcome, and its booking when kept for the key's next task (a
        finished task whose booking is its ordering key alone)."""
        outcome = Outcome.CANCELLED
        kept = None
        try:
            outcome = self.execution.run(r)
            if outcome is Outcome.DECLINED:  # left to the other nodes for a while
                self.running.decline(r.task.id, self.decline_for)
            kind = self.registry.get(r.task.type)
            if outcome is Outcome.FINISHED and r.booking is not None \
                    and not self._stopping.is_set() \
                    and key_only(r.task, kind, self.claimer.limits):
                kept = r.booking
        finally:
            # locks go only after the attempt and the task are written
            release(r.lock, None if kept is not None else r.booking, self.member_id)
            self.running.discard(r)
            r.done.set()
            if outcome is Outcome.RETRY_LATER and r.task.run_at is not None:
                # its next attempt is this member's to time (the others' listings find it too)
                self._later.add(r.task, True)
        return outcome, kept
