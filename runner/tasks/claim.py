"""Taking a task: its slot, its lock, and the claim that writes the RUNNING attempt.

:func:`claim` books the type's cluster-wide slot (when the type has a limit), registers the
task as running here (with a lost-lock listener, before the lock is tried, so a lost lock or
session during the try or the claim still cancels it), tries the lock without waiting, and
claims the task with a version- and token-guarded update that writes the RUNNING attempt in the
same transaction, before any handler runs.

Failure behaviour: a slot or lock held elsewhere, or a task that changed since it was listed
(CommitConflict, StaleFencingToken), gives None with everything taken released; ZooKeeper and
store errors propagate after the same release.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from coord import Booking, CoordError, LockNotHeld, Session, SlotLevel, Slots, TaskLock
from runner.store import Attempt, CommitConflict, GraphStore, StaleFencingToken, Task
from runner.tasks.context import CancelToken
from runner.tasks.registry import TaskType

log = logging.getLogger("latchwork.tasks")


@dataclass
class Running:
    """A task this node is starting or running. ``token`` and ``attempt`` are set once the
    claim is written."""
    task: Task
    lock: TaskLock
    booking: Booking | None
    token: int = 0
    attempt: Attempt | None = None
    completed: bool = False  # the handler's ctx.complete() concluded the attempt
    cancel: CancelToken = field(default_factory=CancelToken)
    done: threading.Event = field(default_factory=threading.Event)


def release(lock: TaskLock, booking: Booking | None, member_id: str) -> None:
    """Release the lock and the slot; either already gone is logged, not raised."""
    try:
        lock.release()
    except (LockNotHeld, CoordError) as exc:
        log.info("member %s: lock of task %s already gone: %s", member_id, lock.task_id, exc)
    if booking is not None:
        try:
            booking.release()
        except CoordError as exc:
            log.info("member %s: slot booking already gone: %s", member_id, exc)


def claim(session: Session, store: GraphStore, member_id: str, task: Task, kind: TaskType,
          register: Callable[[Running], None], forget: Callable[[Running], None],
          stats: Counter[str]) -> Running | None:
    """Take ``task`` for this member, or None when someone else has it (see the module)."""
    booking = None
    if kind.slot_limit is not None:
        booking = Slots(session, member_id).try_book(
            [SlotLevel(f"type/{task.type}", kind.slot_limit)])
        if booking is None:
            return None
    lock = TaskLock(session, task.id, member_id)
    running = Running(task, lock, booking)
    lock.add_lost_listener(lambda _task: running.cancel.cancel("its task lock was lost"))
    register(running)

    def abandon() -> None:
        release(lock, booking, member_id)
        forget(running)
        running.done.set()

    try:
        token = lock.try_acquire()
        if token is None:  # someone else runs it
            stats["lock_busy"] += 1
            abandon()
            return None
        # the version read by the scan guards the claim: if the task changed since (another
        # node finished it, an operator stopped it), the claim is a conflict and we move on.
        running.task, running.attempt = store.claim(task, token, member_id)
        running.token = token
    except (CommitConflict, StaleFencingToken):
        stats["stale"] += 1
        abandon()
        return None
    except BaseException:
        abandon()
        raise
    stats["started"] += 1
    return running
