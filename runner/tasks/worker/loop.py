"""TaskLoop: the task loop every node runs (the design's "TaskProcessHandler"): its lifecycle,
its one way in, its workers.

Scans (:mod:`.scan`) run every ``scan_interval`` seconds (APScheduler), at once on
:meth:`trigger` (a MODEL TRIGGER_SCAN), and when a worker frees up; they claim tasks
(:mod:`.claim`) and hand each to a worker of the bounded pool, which runs it (:mod:`.execution`).
When its handler returns the worker is free, and the task's end goes to the group commit
(:mod:`.commit`), which writes it with the others', releases the locks together and tells
:meth:`TaskLoop._ended`; a task of an ordering key waits for its end instead, and its worker runs
the key's next task (:mod:`.chain`). A task the node accepts comes in through :meth:`accept`.

Failure behaviour: SUSPENDED session: no claim is tried, running handlers go on (a confirmation
they ask for waits, bounded by the deadline, for RECONNECTED or LOST); LOST: every handler is
cancelled, its attempt written CANCELLED_BY_SYSTEM, then its lock let go; an operator's cancel
reaches a handler through :meth:`cancel_running` (the node's mailbox); a task this node lost
(its end refused) is looked for again ``rescan_after_cancel`` seconds later (at once would loop
on a lock that keeps being lost); :meth:`close`: no new tasks, running ones cancelled, their ends
written and locks released, within ``shutdown_timeout``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime

from apscheduler.schedulers.background import BackgroundScheduler

from coord import Booking, Session, SessionState
from runner.store import Store, Task
from runner.store import due as queues
from runner.tasks import due
from runner.tasks.context import Services
from runner.tasks.observer import Observer, notify_released
from runner.tasks.outcomes import Outcome
from runner.tasks.registry import TaskRegistry
from runner.tasks.worker.chain import KeyChain
from runner.tasks.worker.claim import Claimer, key_only, plain, release_booking
from runner.tasks.worker.commit import GroupCommit
from runner.tasks.worker.ends import Written
from runner.tasks.worker.execution import AttemptSupport, Execution
from runner.tasks.worker.running import Admission, Admitted, Ending, RunningSet, Slot
from runner.tasks.worker.scan import Scanner
from runner.tasks.worker.settings import LoopSettings

log = logging.getLogger("latchwork.tasks")
#: how long a submit that could start its task here waits for a scan in progress (seconds)
ACCEPT_WAIT = 0.025

__all__ = ["Admission", "Admitted", "LoopSettings", "TaskLoop"]


class TaskLoop:
    def __init__(self, session: Session, member_id: str, store: Store,
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
        #: the one writer of attempts' ends; it tells this loop what it wrote (EndReporter)
        self.commits = GroupCommit(store, member_id, self,
                                   store_retry_for=settings.store_retry_for)
        self.execution = Execution(session, member_id, store, registry, self.commits,
                                   AttemptSupport(self.observers, services,
                                                  lambda: due.ensure_cursor(session)),
                                   settings)
        self.running = RunningSet(settings.workers, settings.prefetch, settings.short_handler)
        self.claimer = Claimer(session, store, member_id, self.running, settings.limits)
        self.chain = KeyChain(self.claimer, store, registry)
        #: how long this node leaves a task its handler declined to the others
        self.decline_for = max(10.0, 3 * settings.scan_interval)
        #: a worker whose task was lost looks for work again after this long
        self.rescan_after_cancel = min(1.0, settings.scan_interval)
        self._stopping = threading.Event()
        self._pool = ThreadPoolExecutor(settings.workers, thread_name_prefix="task-worker")
        self._scheduler = BackgroundScheduler(timezone=UTC)
        self.scanner = Scanner(self.claimer, registry,
                               lambda slot: self._pool.submit(self._execute, slot),
                               self._stopping, settings, observers=self.observers,
                               live_members=live_members)
        self._feeder = threading.Thread(target=self.scanner.feed, daemon=True,
                                        name=f"task-feeder-{member_id}")
        self.backlog = self.scanner.backlog
        self.later = self.scanner.later

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
        self._feeder.start()
        return self

    def trigger(self, behind: datetime | None = None) -> None:
        """Scan now (thread-safe), instead of waiting for the interval; ``behind``: tasks were
        written ready at that second, maybe behind the scan's cursors (a write that landed
        late: :meth:`ReadyScan.rewind`)."""
        if behind is not None:
            self.backlog.ready.rewind(behind)
        self.backlog.ready.ask()  # the next listing reads every lane, whenever it can run
        if not self._stopping.is_set():
            # the feeder's pass, after one under way: re-timing the interval's scan job would
            # be skipped by its scheduler while that job runs (its one instance), leaving a
            # task written meanwhile to the next interval
            self.scanner.wake(relist=True)

    def close(self, timeout: float = 20.0) -> None:
        """Stop taking tasks, cancel the running ones and wait for their ends and locks."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self.later.close()
        self.session.remove_listener(self._on_session)
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        self.scanner.wake()
        if self._feeder.is_alive():
            self._feeder.join(timeout)
        slots = self.scanner.quiesced()  # a scan in progress finishes its claims first
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
        self.execution.close()
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
    def accept(self, task: Task, again: bool = False) -> Admitted:
        """A task this node has just accepted (``tasks.new``, not written yet). When a worker
        is free and nothing has to be looked up or booked first (a plain task: no slot level,
        resource or ordering key; no uniqueness key; due now), it is written already claimed
        by this node, RUNNING with its attempt, in one store write after its lock, and its
        handler starts: STARTED. Otherwise it is written WAITING: QUEUED when this node has a
        free worker (its scan runs now), ELSEWHERE when it has none (the caller tells the
        other nodes). Store and ZooKeeper errors propagate with nothing written.

        ``again``: ``task``'s id is its request's, which an earlier sending of the request may
        have written (a submit redelivered): then that task is found and nothing is written
        (:meth:`~runner.store.Store.create_claimed_again`, ``add_many(again=True)``)."""
        slot = self._start_new(task, again)
        if slot is not None and slot.claim is not None:
            self.stats["offered"] += 1
            self._pool.submit(self._execute, slot)
            # the GIL to the worker now, not after this thread's answer to the request (the
            # handler waited for it: 0.86 ms of a paced submit -> start's p50, 0.14 with this)
            time.sleep(0)
            return Admitted(slot.claim.task, Admission.STARTED)
        written = (self.store.tasks.add_many([task], again=True)[0] if again
                   else self.store.tasks.add(task))
        if self.scanner.may_start(written):
            self.trigger()
            return Admitted(written, Admission.QUEUED)
        self.backlog.ready.ask()  # a worker freed here lists it, if the others have not
        return Admitted(written, Admission.ELSEWHERE)

    def _start_new(self, task: Task, again: bool) -> Slot | None:
        if not self.scanner.may_start(task) or task.unique_key is not None:
            return None
        kind = self.scanner.kind_of(task)
        if kind is None or not plain(task, kind, self.claimer.limits):
            return None
        # a scan in progress holds the loop: the submit waits for it a little (the paced
        # p99's tail), not for a long pass
        return self.scanner.try_start(task, again, ACCEPT_WAIT)

    # -- connection state ----------------------------------------------------------------------
    def _on_session(self, state: SessionState) -> None:
        if state is SessionState.LOST:
            for slot in self.running.snapshot():
                slot.cancel.cancel("the ZooKeeper session was lost")
        elif state is SessionState.CONNECTED:
            self.trigger()

    # -- the scan -------------------------------------------------------------------------------
    def scan(self, relist: bool = True) -> int:
        """One pass of the scanner (:meth:`Scanner.scan`): how many tasks it started."""
        return self.scanner.scan(relist)

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
            self.running.begin(slot)
            ending = self.execution.run(slot)
            self.running.returned(slot)
            key = slot.task.ordering_key
            if key is None:
                self.running.ending(slot)
                self.commits.submit(ending)
                outcome, slot = ending.outcome, None
                continue
            outcome = self.commits.conclude(replace(ending, waited=True)).outcome
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
        self.scanner.wake()  # a worker is free: the feeder claims for it

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

    # -- what the group commit wrote (its EndReporter) -------------------------------------------
    def written(self, ending: Ending, written: Written) -> None:
        """``ending`` is written (or given up), its lock still held: its observers hear it."""
        self.execution.report(ending.audience, written.status, written.error)

    def _released(self, tasks: Sequence[Task]) -> None:
        """Scan now for workflow members an end made claimable (from their ready second), and
        tell the observers (the node's broadcasts TRIGGER_SCAN to the others)."""
        behind = min(queues.ready_at(t, t.updated_at) for t in tasks)
        self.trigger(behind)
        notify_released(self.observers, tasks, behind)

    def ended(self, ending: Ending, written: Written) -> None:
        """The group commit wrote ``ending`` (the outcome written, the task as written) and
        released its lock: a declined task is left to the others, a retry's time planned;
        and, unless its worker waits for it, the slot is done."""
        outcome, task = written.outcome, written.task
        slot = ending.slot
        if written.released:  # workflow members its end made claimable: no scan waits
            self._released(written.released)
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

