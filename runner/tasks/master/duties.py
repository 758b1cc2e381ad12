"""Master duties: free the locks of dead members, and ask for a model synchronisation.

Only the master runs them, and only after the latch's server-side check confirms leadership.

* **Reaper** (every ``reap_interval`` seconds a read of the member ids; a full pass when a
  member left or joined since the last one, and every ``FULL_REAP_INTERVAL`` seconds besides,
  so that its cost does not grow with the locks held while nobody leaves): a task lock whose
  owner is not a live member
  belongs to a node that died (its session expired, but a lock node can outlive it only briefly;
  more often the owner is a member id from before a restart). The master first closes that
  owner's RUNNING attempts of the task as CANCELLED_BY_SYSTEM and puts the task back to WAITING,
  then force-releases the lock, then broadcasts TRIGGER_SCAN so another node picks it up at
  once. Every other RUNNING attempt whose executor is not a live member is closed the same way
  (its lock vanished with the session before the reaper saw it, and another node may already
  run the task: the task is only reset if the dead member still owns it). Closing the owner's
  attempt and resetting the task are one write that also moves the task's fence on, so the
  owner, should it wake up, can write nothing more on the task.
* **Processed-message records** (every ``Pruning.interval``): records of MASTER messages older
  than ``Pruning.retention`` (the ``processed_retention`` setting) are deleted; the retention
  must exceed the longest redelivery horizon (retry delays plus the time a message can wait in
  the queue).
* **Due-time buckets** (every round): tasks due later than the open queue's horizon wait in
  minute buckets; the master moves the buckets that came within it into the open queue
  (:mod:`runner.tasks.due`), so nodes list and time them before they are due.
* **On becoming master** it publishes SYNCHRONIZE_MODEL on the MASTER queue.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from coord import (
    CoordError,
    LeaderLatch,
    force_release,
    held_locks,
    live_member_ids,
    read_members,
)
from coord import mailbox as mailboxes
from runner import logs
from runner.errors import StoreError, TaskNotFound
from runner.store import AttemptStatus, Store
from runner.tasks import due
from runner.tasks.observer import Observer, notify_freed

#: seconds between the master's prunes of the mailboxes of members that are gone
MAILBOX_PRUNE_INTERVAL = 10.0
#: seconds between the reaper's full passes while no member has left (see MasterDuties.reap)
FULL_REAP_INTERVAL = 10.0

log = logging.getLogger("latchwork.master")


class Prunable(Protocol):
    def prune(self, older_than: float) -> int: ...


@dataclass(frozen=True)
class Pruning:
    """The processed-message records the master prunes: ``log``'s records older than
    ``retention`` seconds, every ``interval`` seconds."""
    log: Prunable
    retention: float = 7 * 86400
    interval: float = 600.0


class MasterDuties:
    def __init__(self, latch: LeaderLatch, store: Store, *, reap_interval: float = 2.0,
                 on_master: Callable[[], object] | None = None,
                 on_freed: Callable[[list[str]], object] | None = None,
                 pruning: Pruning | None = None,
                 duties: Sequence[tuple[str, Callable[[], object]]] = (),
                 observers: Sequence[Observer] = ()) -> None:
        self.session = latch.session
        self.latch = latch
        self.member_id = latch.participant_id
        self.store = store
        self.reap_interval = reap_interval
        self.on_master = on_master
        self.on_freed = on_freed
        self.pruning = pruning
        #: more passes the master makes every round, each (name, function): schedules
        self.duties = list(duties)
        self.observers = list(observers)  # hear each lock freed (runner.tasks.observer)
        self._next_prune = 0.0
        self._next_mail_prune = 0.0
        #: the member ids the last full reaper pass began with, and when the next is due
        self._members_seen: frozenset[str] | None = None
        self._next_full_reap = 0.0
        self._stop = threading.Event()
        self._wake = threading.Event()
        #: the on-master action's thread, while it may run (close waits for it)
        self._announcing: threading.Thread | None = None
        self._announcing_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="master-duties", daemon=True)

    def start(self) -> MasterDuties:
        self.latch.add_listener(on_gain=self._gained)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop the rounds, and wait (10 s at most each) for the round and for an on-master
        action still running: it uses parts (the bus) that are closed after the duties."""
        self._stop.set()
        self._wake.set()
        if self._thread.ident is not None:
            self._thread.join(10)
        with self._announcing_lock:
            announcing = self._announcing
        if announcing is not None:
            announcing.join(10)

    def _gained(self) -> None:
        self._members_seen = None  # a new master's first pass is a full one
        self._wake.set()
        if self.on_master is None:
            return
        with self._announcing_lock:
            if self._stop.is_set():
                return
            self._announcing = threading.Thread(target=self._announce, name="master-announce",
                                                daemon=True)
            self._announcing.start()

    def _announce(self) -> None:
        assert self.on_master is not None
        try:
            self.on_master()
        except Exception:
            log.exception("member %s: on-master action failed", self.member_id)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.reap_interval)
            self._wake.clear()
            if self._stop.is_set() or not self.latch.is_leader:
                continue
            try:
                if not self.latch.check_leadership():
                    continue
                self.reap()
            except (CoordError, StoreError) as exc:
                log.warning("member %s: reaper pass failed: %s", self.member_id, exc)
            for name, duty in [("due-time buckets", self.promote), *self.duties]:
                try:
                    duty()
                except (CoordError, StoreError) as exc:
                    log.warning("member %s (master): %s pass failed: %s", self.member_id,
                                name, exc)
                except Exception:
                    log.exception("member %s (master): %s pass failed", self.member_id, name)

    def promote(self) -> int:
        """Move the time buckets that came within the horizon into the open queue."""
        moved = due.promote(self.session, self.store.tasks)
        if moved:
            log.info("member %s (master): %d delayed tasks due soon moved to the open queue",
                     self.member_id, moved)
        return moved

    def reap(self) -> list[str]:
        """One pass; returns the ids of the tasks it freed.

        A pass reads the member ids first (one request): when they are the ids the last full
        pass began with and that pass is less than ``FULL_REAP_INTERVAL`` old, no member has
        left since (member ids are never reused), so no lock or attempt can have lost its
        owner, and the pass stops there (the timed prunes still run). Otherwise it is a full
        pass: every held lock and every RUNNING attempt read, O(locks + running) requests and
        reads, which every ``reap_interval`` was the master's largest steady load. The full
        pass every ``FULL_REAP_INTERVAL`` all the same covers what no membership change
        announces (an attempt a killed member's write left after its member was gone).
        """
        ids = frozenset(live_member_ids(self.session))
        now = time.monotonic()
        if ids == self._members_seen and now < self._next_full_reap:
            self._prune()
            return []
        freed = self._reap()
        self._members_seen, self._next_full_reap = ids, now + FULL_REAP_INTERVAL
        return freed

    def _reap(self) -> list[str]:
        """A full pass (see :meth:`reap`).

        The locks are listed before the members are read: a member that joins after the
        member read cannot hold a lock the listing saw, while one absent from a read made after
        the listing is gone for good (member ids are never reused). The other order takes a
        member that joined in between, and its fresh lock, for dead.
        """
        held = held_locks(self.session, prune_empty=True)
        members = set(read_members(self.session))
        freed = []
        for lock in held:
            if lock.owner in members:
                continue
            self._close_attempts(lock.task_id, lock.owner)
            force_release(self.session, lock.task_id)
            log.warning("member %s (master): freed the lock of task %s held by %s, which is not "
                        "a live member", self.member_id, lock.task_id, lock.owner,
                        extra=logs.event("lock.freed", freed_task=lock.task_id,
                                         owner=lock.owner))
            notify_freed(self.observers, lock.task_id, lock.owner)
            freed.append(lock.task_id)
        # attempts of members that are gone, whose lock vanished with their session (or was
        # taken by a live member since): close them too. Listed after the member read, so an
        # attempt started by a member that joined since the read is skipped (and seen alive
        # next pass).
        running = self.store.attempts.running()
        members = set(read_members(self.session))
        for attempt in running:
            if attempt.executor not in members:
                self._close_attempts(attempt.task_id, attempt.executor)
                if attempt.task_id not in freed:
                    freed.append(attempt.task_id)
        self._prune(members)
        if freed and self.on_freed is not None:
            self.on_freed(freed)
        return freed

    def _prune(self, members: set[str] | None = None) -> None:
        """The timed prunes: the mailboxes of members gone, the old processed-message
        records."""
        if time.monotonic() >= self._next_mail_prune:  # the mailboxes of members gone
            self._next_mail_prune = time.monotonic() + MAILBOX_PRUNE_INTERVAL
            mailboxes.prune(self.session, members if members is not None
                            else set(read_members(self.session)))
        pruning = self.pruning
        if pruning is not None and time.monotonic() >= self._next_prune:
            self._next_prune = time.monotonic() + pruning.interval
            removed = pruning.log.prune(pruning.retention)
            if removed:
                log.info("member %s (master): pruned %d processed-message records older than "
                         "%gs", self.member_id, removed, pruning.retention)

    def _close_attempts(self, task_id: str, owner: str) -> None:
        """Close ``owner``'s RUNNING attempts of the task and, if it still owns the task, put
        the task back to WAITING with its fence moved on, in one write."""
        try:
            self.store.close_attempts(
                task_id, AttemptStatus.CANCELLED_BY_SYSTEM,
                f"cancelled by system: executor {owner} left the cluster; lock freed by master "
                f"{self.member_id}", executor=owner)
        except TaskNotFound:
            return
