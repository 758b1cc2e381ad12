"""The tasks a node is starting or running, and how many workers it has free.

:class:`Running` is one task from its claim to its end: its lock, its slot booking, its
fencing token and attempt once claimed, its cancellation token. :class:`RunningSet` holds them
under one lock, with the tasks this node's handlers declined (left to the other nodes for a
while). A task is added before its lock is tried (so a lost lock or session during the try or
the claim still cancels it) and removed once its attempt and locks are written. Nothing here
does I/O or fails.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import datetime

from coord import Booking, TaskLock
from runner.store import Attempt, AttemptStatus, Task
from runner.tasks.context import CancelToken


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
    #: the handler's last report not yet written (``progress_json``): its end writes it
    progress: str | None = None
    #: when the handler returned: the attempt's end time as written, and the time a retry's
    #: backoff counts from
    returned_at: datetime | None = None
    #: the status and error its attempt's end was written with (or stands at, when it could
    #: not be written), which the observers are told
    ended: tuple[AttemptStatus, str | None] = (AttemptStatus.RUNNING, None)
    cancel: CancelToken = field(default_factory=CancelToken)
    done: threading.Event = field(default_factory=threading.Event)
    #: the tasks after this one in its key's queue, as the claim read it (its first check)
    key_queue: list[Task] = field(default_factory=list)


class RunningSet:
    """The running tasks of one member, its ``workers`` and the tasks it declined."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._running: dict[str, Running] = {}
        #: tasks this node's handlers declined, and until when it leaves them to the others
        self._declined: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, r: Running) -> None:
        with self._lock:
            self._running[r.task.id] = r

    def discard(self, r: Running) -> None:
        with self._lock:
            self._running.pop(r.task.id, None)

    def __contains__(self, task_id: str) -> bool:
        with self._lock:
            return task_id in self._running

    def snapshot(self) -> list[Running]:
        with self._lock:
            return list(self._running.values())

    def free(self) -> int:
        """Workers not running a task."""
        with self._lock:
            return self.workers - len(self._running)

    def decline(self, task_id: str, seconds: float) -> None:
        """Leave ``task_id`` to the other nodes for ``seconds``."""
        with self._lock:
            self._declined[task_id] = time.monotonic() + seconds

    def declined(self, task_id: str) -> bool:
        with self._lock:
            return self._declined.get(task_id, 0.0) > time.monotonic()
