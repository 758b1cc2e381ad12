"""The ordering-key chain: the worker that finished a task of an ordering key runs the key's
next task itself, without a scan.

The last listing leaves a key's later tasks out (one task per key is a candidate), so a keyed
queue would otherwise advance one scan at a time. The worker keeps the key's hold when the key
is all its task booked (:func:`~runner.tasks.worker.claim.key_only`), so the next claim needs no
new booking either. The key's queue as the chain last read it is used without a read while it
lasts: tasks are only ever added at its end, and the claim is guarded by the version read, so
an entry changed since (an operator stopped or skipped it) makes the claim fail and the queue is
read once more.

Failure behaviour: a store error reading the key's queue ends the chain (logged; the scans take
the key up); a ZooKeeper or store error in the claim ends it the same way, with the key let go.
"""

from __future__ import annotations

import logging

from coord import Booking, CoordError
from runner.errors import StoreError, TaskError
from runner.store import Store, Task, TaskStatus, codec
from runner.tasks.registry import TaskRegistry, TaskType
from runner.tasks.worker.claim import Claimer, key_only, release_booking
from runner.tasks.worker.running import Slot

log = logging.getLogger("latchwork.tasks")


class KeyChain:
    """Claims the next task of an ordering key for the worker that just finished one."""

    def __init__(self, claimer: Claimer, store: Store, registry: TaskRegistry) -> None:
        self.claimer = claimer
        self.store = store
        self.registry = registry

    def next(self, key: str, kept: Booking | None, queue: list[Task]) -> Slot | None:
        """The next task of ``key``, claimed by this worker, which may still hold the key
        (``kept``); ``queue`` is the key's queue as this chain last read it (consumed here).
        None, with the key let go, when there is nothing to start now or someone else has it
        (the scans find it then)."""
        if queue:
            started = self._claim(queue.pop(0), kept)
            if started is not None:
                return started
            kept = None  # a refused claim let the key go
        try:
            queue[:] = self.store.tasks.with_key(key)
        except StoreError as exc:
            log.info("member %s: next task of key %s unknown: %s", self.claimer.member_id,
                     key, exc)
            queue.clear()
        if not queue:
            if kept is not None:
                release_booking(kept, self.claimer.member_id)
            return None
        return self._claim(queue.pop(0), kept)

    def _claim(self, task: Task, kept: Booking | None) -> Slot | None:
        """Claim ``task``, the first of its key's queue; ``kept`` is used when the key is all
        it books, else let go."""
        kind = self._startable(task)
        if kind is None:
            if kept is not None:
                release_booking(kept, self.claimer.member_id)
            return None
        held = kept
        if kept is not None and not key_only(task, kind, self.claimer.limits):
            release_booking(kept, self.claimer.member_id)  # it books more: one booking of it all
            held = None
        try:
            return self.claimer.claim(task, kind, first_checked=True, held=held)
        except (CoordError, StoreError) as exc:
            log.warning("member %s: task %s not started: %s", self.claimer.member_id, task.id,
                        exc)
            return None

    def _startable(self, task: Task) -> TaskType | None:
        """The task's type, when this worker may start it now: open, waiting, due, of a type
        this node has (else the nodes that have it), not declined here."""
        if not (task.open and task.status is TaskStatus.WAITING
                and (task.run_at is None or task.run_at <= codec.now())):
            return None
        if self.claimer.running.declined(task.id):
            return None
        try:
            return self.registry.get(task.type)
        except TaskError:
            return None
