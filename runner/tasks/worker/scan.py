"""Scanner: one node's scans of the open tasks and the claims they make.

A scan (:meth:`Scanner.scan`) takes, while workers are free, candidates from the node's
:class:`~runner.tasks.worker.backlog.Backlog` (a page of the ready tasks at a time:
:class:`~runner.tasks.worker.ready.ReadyScan`) and claims them: plain tasks in batches
(:meth:`~runner.tasks.worker.claim.Claimer.claim_many`), the others one by one; each task it
starts goes to ``start`` (the loop's pool). Tasks whose time has not come wait on a timer
(:class:`~runner.tasks.worker.timing.DueTimer`), which scans again when one is due. One lock
(:attr:`Scanner.lock`) covers a pass, so passes never overlap and a submit that starts a task
itself (:meth:`TaskLoop.accept`) waits for one in progress only briefly (``ACCEPT_WAIT``).

Failure behaviour: a lock or slot it cannot take: someone else runs the task, the scan moves
on; a store or ZooKeeper error on a claim: logged, the task left for the next scan; no claim is
tried while the session is not CONNECTED (SUSPENDED: unknown) nor once the loop stops.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence

from coord import CoordError, SessionState, live_member_ids
from runner.errors import StoreError, TaskError
from runner.store import Task, codec
from runner.tasks.due import LaneFloors
from runner.tasks.observer import Observer, notify_scan
from runner.tasks.registry import TaskRegistry, TaskType
from runner.tasks.worker.backlog import Backlog
from runner.tasks.worker.claim import Claimer, plain
from runner.tasks.worker.running import Slot
from runner.tasks.worker.settings import LoopSettings
from runner.tasks.worker.timing import DueTimer

log = logging.getLogger("latchwork.tasks")


class Scanner:
    """The scans of one member's task loop (see the module)."""

    def __init__(self, claimer: Claimer, registry: TaskRegistry,
                 start: Callable[[Slot], object], stopping: threading.Event,
                 settings: LoopSettings, *, observers: Sequence[Observer] = (),
                 live_members: Callable[[], set[str] | None] | None = None) -> None:
        #: the claimer's session, member, store and running set are the scan's
        self.session = session = claimer.session
        self.member_id = member_id = claimer.member_id
        self.store = store = claimer.store
        self.running = running = claimer.running
        self.registry = registry
        self.claimer = claimer
        self.start = start  # a started task's slot goes here (the loop's pool)
        self.stopping = stopping
        self.observers = observers
        # the live member ids without a read (the node's membership watch); None: read them
        self.live_members = live_members
        #: one pass at a time; a submit's own start does not wait for one in progress
        self.lock = threading.Lock()
        #: listed tasks not due yet, and the timer that starts a scan when one is
        self.later = DueTimer(self.on_due, settings.others_grace)
        self.backlog = Backlog(store, member_id, self.later, self.stats, running.__contains__,
                               lambda task: self.kind_of(task) is not None, settings=settings,
                               floors=LaneFloors(session))
        self._skipped_types: set[str] = set()
        self._wake = threading.Event()  # a worker freed up: the feeder's next pass
        self._relist = False  # the feeder's next pass lists again (a task was written)
        self._timer: threading.Timer | None = None  # a pass put off (:meth:`_wake_in`)
        self._timer_lock = threading.Lock()

    @property
    def stats(self) -> Counter[str]:
        return self.claimer.stats

    def scan(self, relist: bool = True, ahead: bool = False) -> int:
        """One pass, timed for the observers: how many tasks it started. ``relist=False`` (a
        worker just finished) works through the backlog first and lists again only when it is
        empty and listing stays within its share of the time (listing every open task after
        every finished one would cost more than the tasks when thousands are queued).
        ``ahead``: a write asked for it, so its listing reads the tasks due soon whatever the
        time since the last that did (:meth:`ReadyScan.read`)."""
        began = time.monotonic()
        try:
            return self._scan(relist, ahead)
        finally:
            notify_scan(self.observers, time.monotonic() - began)

    def wake(self, relist: bool = False) -> None:
        """A worker freed up: the feeder scans for it (thread-safe, never blocks). Wakes that
        come while a pass claims are one more pass, so the workers freed meanwhile are
        claimed for together: the batch grows with the load, with no timer. ``relist``: the
        pass lists the open tasks again (a task was written: :meth:`TaskLoop.trigger`), after
        the pass under way if there is one."""
        if relist:
            self._relist = True  # before the wake: the feeder reads it after it clears one
        self._wake.set()

    def _wake_in(self, seconds: float) -> None:
        """A pass of the feeder in ``seconds`` (one timer at a time: an earlier one stands)."""
        with self._timer_lock:
            if self._timer is not None and self._timer.is_alive():
                return
            self._timer = threading.Timer(max(0.0, seconds), self.wake)
            self._timer.daemon = True
            self._timer.start()

    def feed(self) -> None:
        """The feeder thread's loop (:meth:`TaskLoop.start` runs it): a pass whenever a worker
        frees up or a task was written (that one lists again), again while the last one
        started tasks and workers are free; it ends when the loop stops."""
        while not self.stopping.is_set():
            if not self._wake.wait(1.0):
                continue
            self._wake.clear()
            relist, self._relist = self._relist, False
            try:  # a pass asked for by a write (relist) reads ahead too
                while self.scan(relist=relist, ahead=relist) > 0 and self.running.free() > 0:
                    relist = False
            except Exception:
                log.exception("member %s: follow-up scan failed", self.member_id)

    def _scan(self, relist: bool, ahead: bool = False) -> int:
        if not self.may_claim():
            return 0
        with self.lock:
            started = self._start_due(self.later.take_due())
            if self.running.free() <= 0:
                return started
            if not relist and not self.backlog and not self.later.planned() \
                    and not self.backlog.may_relist():
                # listing now would pass its share of the time: a pass when it no longer does
                # (nothing else may come: a free worker never waits for the interval's scan)
                self._wake_in(self.backlog.relist_in())
                return started
            if (relist or (not self.backlog and not self.later.planned())) \
                    and not self._list(claimed=relist, ahead=ahead):
                return started
            while self.running.free() > 0 and self.may_claim():
                batch = self.backlog.take(self.running.free(), self.running.__contains__,
                                          self._list, self.running.room)
                if not batch:
                    break
                started += self._start_batch(batch)
        return started

    def _list(self, claimed: bool = False, ahead: bool = False) -> bool:
        return self.backlog.list_open(self._live(), claimed, ahead)

    def _start_batch(self, batch: list[Task]) -> int:
        """Start ``batch``: the plain tasks together (:meth:`Claimer.claim_many`), the others
        (slots, holds, keys) one by one; how many started."""
        alone: list[tuple[Task, TaskType]] = []
        together: list[Task] = []
        for task in batch:
            kind = self.kind_of(task)
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
            self.start(slot)
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
        free = self.running.room([t for t, _ in ready]) if self.may_claim() else 0
        self.backlog.push_front(ready[free:])
        return self._start_batch([t for t, _ in ready[:free] if t.id not in self.running])

    def on_due(self) -> None:
        try:
            self.scan(relist=False)
        except Exception:
            log.exception("member %s: scan of due tasks failed", self.member_id)

    def may_claim(self) -> bool:
        """No claim is tried while the session is not CONNECTED (SUSPENDED: unknown), nor
        once the loop stops; the scan that follows RECONNECTED picks the work up."""
        return not self.stopping.is_set() and self.session.state is SessionState.CONNECTED

    def may_start(self, task: Task) -> bool:
        """Whether a task due now may start here now: a free worker (or room ahead for a task
        of a short type: :meth:`RunningSet.room`), the session CONNECTED, the loop running."""
        return (self.running.room([task]) > 0 and self.may_claim()
                and (task.run_at is None or task.run_at <= codec.now()))

    def try_start(self, task: Task, again: bool, wait: float) -> Slot | None:
        """A task a node has just accepted, claimed here at once (written claimed by
        :meth:`Claimer.claim_new`) when it may start now, waiting up to ``wait`` seconds for
        a pass in progress (a listing takes milliseconds; written WAITING, the task would cost
        a listing and a claim more); None when it may not, or the pass held on."""
        if self.running.room([task]) <= 0 or not self.may_claim():
            return None
        if not self.lock.acquire(timeout=wait):
            return None
        try:
            if self.running.room([task]) <= 0 or not self.may_claim():
                return None
            return self.claimer.claim_new(task, again)
        finally:
            self.lock.release()

    def quiesced(self) -> list[Slot]:
        """The slots running once a pass in progress has finished its claims (the loop's
        close cancels each)."""
        with self.lock:
            return self.running.snapshot()

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

    def kind_of(self, task: Task) -> TaskType | None:
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
