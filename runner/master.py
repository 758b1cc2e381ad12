"""Master duties: free the locks of dead members, and ask for a model synchronisation.

Only the master runs them, and only after the latch's server-side check confirms leadership.

* **Reaper** (every ``reap_interval`` seconds): a task lock whose owner is not a live member
  belongs to a node that died (its session expired, but a lock node can outlive it only briefly;
  more often the owner is a member id from before a restart). The master first closes that
  owner's RUNNING attempts of the task as CANCELLED_BY_SYSTEM and puts the task back to WAITING,
  then force-releases the lock, then broadcasts TRIGGER_SCAN so another node picks it up at
  once. Every other RUNNING attempt whose executor is not a live member is closed the same way
  (its lock vanished with the session before the reaper saw it, and another node may already
  run the task: the task is only reset if the dead member still owns it).
* **On becoming master** it publishes SYNCHRONIZE_MODEL on the MASTER queue.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from coord import CoordError, LeaderLatch, Session, force_release, held_locks, read_members
from runner.store import (
    AttemptAlreadyFinished,
    AttemptStatus,
    CommitConflict,
    GraphStore,
    StoreError,
    TaskNotFound,
    TaskStatus,
)

log = logging.getLogger("latchwork.master")


class MasterDuties:
    def __init__(self, session: Session, latch: LeaderLatch, member_id: str, store: GraphStore,
                 *, reap_interval: float = 2.0,
                 on_master: Callable[[], object] | None = None,
                 on_freed: Callable[[list[str]], object] | None = None) -> None:
        self.session = session
        self.latch = latch
        self.member_id = member_id
        self.store = store
        self.reap_interval = reap_interval
        self.on_master = on_master
        self.on_freed = on_freed
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="master-duties", daemon=True)

    def start(self) -> MasterDuties:
        self.latch.add_listener(on_gain=self._gained)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.ident is not None:
            self._thread.join(10)

    def _gained(self) -> None:
        self._wake.set()
        if self.on_master is not None:
            threading.Thread(target=self._announce, name="master-announce", daemon=True).start()

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
                if self.latch.check_leadership():
                    self.reap()
            except (CoordError, StoreError) as exc:
                log.warning("member %s: reaper pass failed: %s", self.member_id, exc)

    def reap(self) -> list[str]:
        """One pass; returns the ids of the tasks it freed."""
        members = set(read_members(self.session))
        freed = []
        for held in held_locks(self.session):
            if held.owner in members:
                continue
            self._close_attempts(held.task_id, held.owner)
            force_release(self.session, held.task_id)
            log.warning("member %s (master): freed the lock of task %s held by %s, which is not "
                        "a live member", self.member_id, held.task_id, held.owner)
            freed.append(held.task_id)
        # attempts of members that are gone, whose lock vanished with their session (or was
        # taken by a live member since): close them too
        for attempt in self.store.attempts.running():
            if attempt.executor not in members:
                self._close_attempts(attempt.task_id, attempt.executor)
                if attempt.task_id not in freed:
                    freed.append(attempt.task_id)
        if freed and self.on_freed is not None:
            self.on_freed(freed)
        return freed

    def _close_attempts(self, task_id: str, owner: str) -> None:
        for attempt in self.store.attempts.for_task(task_id):
            if attempt.status is AttemptStatus.RUNNING and attempt.executor == owner:
                try:
                    self.store.attempts.finish(
                        attempt.id, AttemptStatus.CANCELLED_BY_SYSTEM,
                        f"cancelled by system: executor {owner} left the cluster; lock freed by "
                        f"master {self.member_id}")
                except AttemptAlreadyFinished:
                    pass
        for _ in range(10):
            try:
                task = self.store.tasks.get(task_id)
                if task.status is TaskStatus.RUNNING and task.owner == owner:
                    self.store.tasks.update(task.id, task.version, None,
                                            status=TaskStatus.WAITING)
                return
            except CommitConflict:
                continue
            except TaskNotFound:
                return
