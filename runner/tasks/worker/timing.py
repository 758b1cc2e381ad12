"""DueTimer: the listed tasks that are not due yet, and one timer for the first of them.

The task loop lists the open queue, which holds tasks due within the horizon
(:mod:`runner.store.due`). Those not due yet go here with whether this member is their
preferred one. One timer fires at the first time this node tries one of them: its ``run_at``
when this member is its preferred one, ``others_grace`` seconds later when not (its preferred
member, with a free worker, has started it by then; if it is busy or died, another node does).
The timer calls ``on_due``, which takes the due tasks (:meth:`take_due`) to the front of its
backlog; their versions are checked before a claim, as for any listed task. So a delayed task
starts within milliseconds of its time, not at the next scan. A node that dies takes its
timers with it; the others' timers, ``others_grace`` later, start its tasks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from runner.store import Task


class DueTimer:
    def __init__(self, on_due: Callable[[], None], others_grace: float = 0.3) -> None:
        self.on_due = on_due
        self.others_grace = others_grace
        self._lock = threading.Lock()
        self._future: list[tuple[float, Task, bool]] = []  # (try at, epoch s; task; own)
        self._timer: threading.Timer | None = None
        self._closed = False

    def plan(self, later: list[tuple[Task, bool]], *, keep: bool = False) -> None:
        """Replace the planned tasks with ``later`` (each with whether it is this member's);
        ``keep``: those planned before stay too (a listing that did not read so far ahead),
        as listed now where they are in ``later``."""
        future = []
        for task, own in later:
            assert task.run_at is not None
            future.append((task.run_at.timestamp() + (0.0 if own else self.others_grace),
                           task, own))
        with self._lock:
            if keep:
                listed = {task.id for task, _ in later}
                future += [f for f in self._future if f[1].id not in listed]
            future.sort(key=lambda f: f[0])
            self._future = future
        self._arm()

    def add(self, task: Task, own: bool) -> None:
        """Plan one more task (this member's retry waiting for its backoff), until the next
        :meth:`plan` replaces the lot."""
        assert task.run_at is not None
        entry = (task.run_at.timestamp() + (0.0 if own else self.others_grace), task, own)
        with self._lock:
            self._future = sorted([*[f for f in self._future if f[1].id != task.id], entry],
                                  key=lambda f: f[0])
        self._arm()

    def planned(self) -> int:
        """How many tasks wait for their time here."""
        with self._lock:
            return len(self._future)

    def take_due(self) -> list[tuple[Task, bool]]:
        """The planned tasks whose time has come (highest priority first), removed."""
        now = time.time()
        with self._lock:
            due = [f for f in self._future if f[0] <= now]
            if not due:
                return []
            self._future = [f for f in self._future if f[0] > now]
        self._arm()
        due.sort(key=lambda f: (-f[1].priority, f[0]))
        return [(task, own) for _, task, own in due]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()

    def _arm(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if not self._future or self._closed:
                return
            self._timer = threading.Timer(max(0.0, self._future[0][0] - time.time()),
                                          self.on_due)
            self._timer.daemon = True
            self._timer.start()
