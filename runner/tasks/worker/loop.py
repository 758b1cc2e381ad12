"""TaskLoop: the task loop every node runs (the scan, its workers and its one way in; the
design's "TaskProcessHandler").

Every ``scan_interval`` seconds (an APScheduler interval job), and at once when :meth:`trigger`
is called (a MODEL TRIGGER_SCAN after a submission), it takes candidates from its
:class:`~runner.tasks.worker.backlog.Backlog` while workers are free and claims them: plain
tasks in batches (their locks in one ZooKeeper transaction, their claims in one store write),
the others (slots, resources, ordering keys) one by one (:mod:`.claim`). Each claimed task runs
on a worker of the bounded pool (:mod:`.execution`); when its handler returns the worker is
free and the task's end goes to the group commit (:mod:`.commit`), which writes it with the
others', releases the locks together and tells :meth:`_ended`. A task of an ordering key waits
for its end instead, and its worker runs the key's next task (:mod:`.chain`). Tasks not due
yet wait on a timer (:mod:`.timing`).

A task a node accepts comes in through :meth:`accept`, which says what became of it
(:class:`Admission`).

Failure behaviour:

* a lock or slot it cannot take: someone else runs the task; it moves on;
* SUSPENDED session: no claim is tried until CONNECTED again, but running handlers go on: a
  confirmation they ask for meanwhile waits, bounded by the session's deadline, for
  RECONNECTED (confirmed) or LOST (cancelled), so a ZooKeeper leader election costs no work;
  LOST: every handler is cancelled, its attempt written CANCELLED_BY_SYSTEM, then its lock let
  go (a LOST session has dropped them already);
* an operator's cancel: the node that writes it posts to the owner's mailbox, and the owner
  cancels the handler (:meth:`cancel_running`);
* a task this node lost (its end refused, a lost lock): the loop looks for work again
  ``rescan_after_cancel`` seconds later (at once would loop on a lock that keeps being lost);
* :meth:`close`: no new tasks, running ones cancelled, their ends written and locks released,
  within ``shutdown_timeout``.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from apscheduler.schedulers.background import BackgroundScheduler

from coord import Booking, CoordError, Session, SessionState, live_member_ids
from runner.errors import StoreError, TaskError
from runner.store import AttemptStatus, GraphStore, Task, codec
from runner.tasks.context import Services
from runner.tasks.observer import Observer, notify_scan
from runner.tasks.outcomes import Outcome
from runner.tasks.registry import TaskRegistry, TaskType
from runner.tasks.worker.backlog import Backlog
from runner.tasks.worker.chain import KeyChain
from runner.tasks.worker.claim import Claimer, key_only, plain, release_booking
from runner.tasks.worker.commit import GroupCommit
from runner.tasks.worker.execution import Execution
from runner.tasks.worker.running import Ending, RunningSet, Slot
from runner.tasks.worker.timing import DueTimer

log = logging.getLogger("latchwork.tasks")


@dataclass(frozen=True)
class LoopSettings:
    """How a node's task loop runs (the node fills it from its :class:`~runner.config.Settings`).

    ``fresh_for`` / ``own_fresh_for`` / ``relist_share``: the backlog's freshness rules
    (:class:`~runner.tasks.worker.backlog.Backlog`); ``others_grace``: how long a due task waits
    for its preferred member; ``limits``: cluster-wide limits per task group
    (:func:`~runner.tasks.worker.claim.levels`); ``store_retry_for``: how long the end of an
    attempt is tried again while the graph is unreachable."""

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


class Admission(enum.Enum):
    """What became of a task a node accepted (:meth:`TaskLoop.accept`)."""

    STARTED = "started"  # written RUNNING here, with its attempt; its handler runs
    QUEUED = "queued"  # written WAITING; this node has a free worker and scans for it now
    ELSEWHERE = "elsewhere"  # written WAITING; this node cannot start it now: tell the others


@dataclass(frozen=True)
class Admitted:
    task: Task  # as written
    admission: Admission


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
                                   conflict_backoff=settings.conflict_backoff)
        self.commits = GroupCommit(store, member_id, self._ended,
                                   store_retry_for=settings.store_retry_for)
        # the live member ids without a read (the node's membership watch); None: read them
        self.live_members = live_members
        self.running = RunningSet(settings.workers)
        self.claimer = Claimer(session, store, member_id, self.running, settings.limits)
        self.chain = KeyChain(self.claimer, store, registry)
        #: listed tasks not due yet, and the timer that starts a scan when one is
        self.later = DueTimer(self._on_due, settings.others_grace)
        self.backlog = Backlog(store, member_id, settings.workers, self.later, self.stats,
                               self.running.__contains__, fresh_for=settings.fresh_for,
                               own_fresh_for=settings.own_fresh_for,
                               relist_share=settings.relist_share)
        #: how long this node leaves a task its handler declined to the others
        self.decline_for = max(10.0, 3 * settings.scan_interval)
        #: a worker whose task was lost looks for work again after this long
        self.rescan_after_cancel = min(1.0, settings.scan_interval)
        self._scan_lock = threading.Lock()
        self._stopping = threading.Event()
        self._pool = ThreadPoolExecutor(settings.workers, thread_name_prefix="task-worker")
        self._scheduler = BackgroundScheduler(timezone=UTC)
        self._skipped_types: set[str] = set()

    @property
    def stats(self) -> Counter[str]:
        """How claims and scans went: started / lock held elsewhere / stale listing (claim
        conflict) / ..., and the scans' own counts (skipped, listings)."""
        return self.claimer.stats

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> TaskLoop:
        self.session.add_listener(self._on_session)
        self._scheduler.add_job(self.scan, "interval", seconds=self.settings.scan_interval,
                                id="scan", max_instances=1, coalesce=True,
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
        """Stop taking tasks, cancel the running ones and wait for their ends and locks."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self.later.close()
        self.session.remove_listener(self._on_session)
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        with self._scan_lock:  # a scan in progress finishes its claims first
            slots = self.running.snapshot()
        for slot in slots:
            slot.cancel.cancel("node shutting down")
        deadline = threading.Event()
        timer = threading.Timer(timeout, deadline.set)
        timer.start()
        for slot in slots:
            while not slot.done.wait(0.05):
                if deadline.is_set():
                    log.error("member %s: task %s did not stop within %gs", self.member_id,
                              slot.task_id, timeout)
                    break
        timer.cancel()
        self.commits.close(timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.execution.progress_writer.close()
        c = self.commits.stats
        log.info("member %s: task loop stopped; claims: %s; %d ends written in %d groups "
                 "(largest %d)", self.member_id, dict(self.stats), c["concluded"], c["groups"],
                 c["largest"])

    def running_tasks(self) -> list[str]:
        return [slot.task_id for slot in self.running.snapshot()]

    def cancel_running(self, task_id: str, reason: str) -> bool:
        """Cancel the handler of ``task_id`` if this node runs it (an operator's cancel,
        posted to this node's mailbox); whether it did."""
        slot = self.running.get(task_id)
        if slot is not None:
            slot.cancel.cancel(reason)
        return slot is not None

    # -- one way in ---------------------------------------------------------------------------
    def accept(self, task: Task) -> Admitted:
        """A task this node has just accepted (``tasks.new``, not written yet). When a worker
        is free and nothing has to be looked up or booked first (a plain task: no slot level,
        resource or ordering key; no uniqueness key; due now), it is written already claimed
        by this node, RUNNING with its attempt, in one store write after its lock, and its
        handler starts: STARTED. Otherwise it is written WAITING: QUEUED when this node has a
        free worker (its scan runs now), ELSEWHERE when it has none (the caller tells the
        other nodes). Store and ZooKeeper errors propagate with nothing written."""
        slot = self._start_new(task)
        if slot is not None and slot.claim is not None:
            self.stats["offered"] += 1
            self._pool.submit(self._execute, slot)
            return Admitted(slot.claim.task, Admission.STARTED)
        written = self.store.tasks.add(task)
        if self._may_start(written):
            self.trigger()
            return Admitted(written, Admission.QUEUED)
        return Admitted(written, Admission.ELSEWHERE)

    def _start_new(self, task: Task) -> Slot | None:
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
            return self.claimer.claim_new(task)
        finally:
            self._scan_lock.release()

    # -- connection state ----------------------------------------------------------------------
    def _on_session(self, state: SessionState) -> None:
        if state is SessionState.LOST:
            for slot in self.running.snapshot():
                slot.cancel.cancel("the ZooKeeper session was lost")
        elif state is SessionState.CONNECTED:
            self.trigger()

    # -- the scan -------------------------------------------------------------------------------
    def scan(self, relist: bool = True) -> int:
        """One pass, timed for the observers: how many tasks it started. ``relist=False`` (a
        worker just finished) works through the backlog first and lists again only when it is
        empty and listing stays within its share of the time (listing every open task after
        every finished one would cost more than the tasks when thousands are queued)."""
        began = time.monotonic()
        try:
            return self._scan(relist)
        finally:
            notify_scan(self.observers, time.monotonic() - began)

    def _scan(self, relist: bool) -> int:
        if not self._may_claim():
            return 0
        with self._scan_lock:
            started = self._start_due(self.later.take_due())
            if self.running.free() <= 0:
                return started
            if (relist or (not self.backlog and not self.later.planned()
                           and self.backlog.may_relist())) and not self._list(claimed=relist):
                return started
            while self.running.free() > 0 and self._may_claim():
                batch = self.backlog.take(self.running.free(), self.running.__contains__,
                                          self._list)
                if not batch:
                    break
                started += self._start_batch(batch)
        return started

    def _list(self, claimed: bool = False) -> bool:
        return self.backlog.list_open(self._live(), claimed)

    def _start_batch(self, batch: list[Task]) -> int:
        """Start ``batch``: the plain tasks together (:meth:`Claimer.claim_many`), the others
        (slots, holds, keys) one by one; how many started."""
        alone: list[tuple[Task, TaskType]] = []
        together: list[Task] = []
        for task in batch:
            kind = self._kind_of(task)
            if kind is not None:
                if plain(task, kind, self.claimer.limits):
                    together.append(task)
                else:
                    alone.append((task, kind))
        slots = []
        for task, kind in alone:
            try:
                slot = self.claimer.claim(task, kind)
            except (CoordError, StoreError) as exc:
                log.warning("member %s: task %s not started: %s", self.member_id, task.id, exc)
                continue
            if slot is not None:
                slots.append(slot)
        try:
            slots += self.claimer.claim_many(together)
        except (CoordError, StoreError) as exc:
            log.warning("member %s: tasks %s not started: %s", self.member_id,
                        ", ".join(task.id for task in together), exc)
        for slot in slots:
            self._pool.submit(self._execute, slot)
        return len(slots)

    def _start_due(self, due: list[tuple[Task, bool]]) -> int:
        """Start the tasks whose time came (the due-time timer), before the backlog: this
        member's as listed, the others' (their preferred member had ``others_grace`` to take
        them) after one read of their versions. Those left when the workers are busy go to
        the front of the backlog."""
        if not due:
            return 0
        others = [t.id for t, own in due if not own]
        current: dict[str, int] = {}
        if others:
            try:
                current = self.store.tasks.versions(others)
            except StoreError as exc:
                log.error("member %s: cannot check due tasks: %s", self.member_id, exc)
        ready = [(t, own) for t, own in due if own or current.get(t.id) == t.version]
        self.stats["skipped_stale"] += len(due) - len(ready)
        free = max(0, self.running.free()) if self._may_claim() else 0
        self.backlog.push_front(ready[free:])
        return self._start_batch([t for t, _ in ready[:free] if t.id not in self.running])

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
        """Whether a task due now may start here now: a free worker, the session CONNECTED,
        the loop running."""
        return (self.running.free() > 0 and self._may_claim()
                and (task.run_at is None or task.run_at <= codec.now()))

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

    # -- the workers ---------------------------------------------------------------------------
    def _execute(self, first: Slot) -> None:
        """Run ``first``. A task without an ordering key hands its end to the group commit and
        frees its worker at once; one with a key waits for its end and, when it finished, runs
        the key's next task in this worker (:class:`KeyChain`), and so on. Then it looks for
        work."""
        slot: Slot | None = first
        outcome = Outcome.CANCELLED
        queue = list(first.key_queue)  # the key's queue as read at the chain's last read
        while slot is not None:
            ending = self.execution.run(slot)
            key = slot.task.ordering_key
            if key is None:
                self.running.ending(slot)
                self.commits.submit(ending)
                outcome, slot = ending.outcome, None
                continue
            outcome = self.commits.conclude(replace(ending, waited=True))
            kept = self._settle_keyed(slot, outcome)
            slot = None
            if not self._stopping.is_set() and outcome is Outcome.FINISHED:
                slot = self.chain.next(key, kept, queue)
            elif kept is not None:
                release_booking(kept, self.member_id)
        if self._stopping.is_set():
            return
        if outcome is Outcome.CANCELLED:
            self._rescan_later()
            return
        try:
            self.scan(relist=False)  # a worker is free
        except Exception:
            log.exception("member %s: follow-up scan failed", self.member_id)

    def _settle_keyed(self, slot: Slot, outcome: Outcome) -> Booking | None:
        """A keyed task's end is written: its booking kept for the key's next task when the
        key is all it booked and it finished (returned), else released; its slot done."""
        kept = None
        kind = self.registry.get(slot.task.type)
        if outcome is Outcome.FINISHED and slot.booking is not None \
                and not self._stopping.is_set() and key_only(slot.task, kind,
                                                              self.claimer.limits):
            kept = slot.booking
        elif slot.booking is not None:
            release_booking(slot.booking, self.member_id)
        self.running.discard(slot)
        slot.done.set()
        return kept

    def _ended(self, ending: Ending, outcome: Outcome, task: Task | None,
               ended: tuple[AttemptStatus, str | None]) -> None:
        """The group commit wrote ``ending`` (the ``outcome`` written, the task as written)
        and released its lock: the observers are told; a declined task is left to the others,
        a retry's time planned; and, unless its worker waits for it, the slot is done."""
        ending.tell(*ended)
        slot = ending.slot
        if outcome is Outcome.DECLINED:  # left to the other nodes for a while
            self.running.decline(slot.task_id, self.decline_for)
        if outcome is Outcome.RETRY_LATER and task is not None and task.run_at is not None:
            self.later.add(task, True)  # its next attempt is this member's to time
        if ending.waited:
            return
        if slot.booking is not None:
            release_booking(slot.booking, self.member_id)
        self.running.discard(slot)
        slot.done.set()
        if outcome is Outcome.CANCELLED and ending.outcome is not Outcome.CANCELLED:
            self._rescan_later()  # its end was refused: this node lost the task

    def _rescan_later(self) -> None:
        """A task this node lost goes back as it stands; look again a little later (at once
        would loop on a lock that keeps being lost), whoever takes it."""
        if self._stopping.is_set():
            return
        timer = threading.Timer(self.rescan_after_cancel, self.trigger)
        timer.daemon = True
        timer.start()

