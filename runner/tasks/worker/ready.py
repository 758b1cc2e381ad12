"""ReadyScan: the next ready tasks a node tries, read a page at a time from the ready buckets
(:mod:`runner.store.due`), so what a scan costs does not grow with the tasks that wait.

One probe read says which lanes (priorities) hold a task; in the highest of them, from the
lane's cursor (the oldest second a WAITING task of the lane may have become ready in), it reads
windows of seconds forward, one index lookup each (``task_queue`` in the window's keys,
``limit`` at most), narrow first (a dense backlog is read a second at a time, so the oldest go
first) and wider while they come back empty, until it has ``limit`` tasks or reaches the end of
the ready horizon; then the next lane. A window asks for half as many again as the tasks still
needed and keeps the oldest of them, so the order within a window holds while it is no denser
than that (every row read costs its deserialisation; the nodes read the same oldest rows). A window
read empty before any task was found moves the cursor past it.

Why a cursor can only move forward: a task becomes ready at the moment of its change (its
creation, being put back) or at its ``run_at``, never in the past; so the windows behind the
cursor stay empty, but for clocks that disagree: each walk starts :data:`SKEW` seconds before
the cursor, and a lane's cursor is found again from the lane itself (one read of its ready
seconds) at first, after :data:`EMPTY_WINDOWS` empty windows in a row (a gap in the arrivals),
and every :data:`REFIND` seconds.

Failure behaviour: a store error propagates to the caller (the backlog logs it and the scan
ends); nothing is kept half updated.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta

from runner.store import Task, codec, due
from runner.store.ports import TaskStore

#: seconds each walk starts before its lane's cursor (clocks that disagree)
SKEW = 5
#: empty windows in a row after which a lane's cursor is found again from the lane
EMPTY_WINDOWS = 6
#: seconds after which a lane's cursor is found again anyway
REFIND = 300.0
#: the windows a walk reads, in seconds: narrow first, then a minute at a time
WINDOWS = (1, 4, 15, 40)
WIDEST = 60
#: windows a walk reads in one lane at most (past tasks that cannot start, or empty ones)
MAX_WINDOWS = 32


class ReadyScan:
    """Per lane, the cursor of one node's reads of the ready buckets (see the module)."""

    def __init__(self, tasks: TaskStore) -> None:
        self.tasks = tasks
        #: lane -> (its cursor, when it was last found from the lane)
        self.cursors: dict[str, tuple[datetime, float]] = {}
        self.reads = 0  # index reads made (the bench's and the tests' measure)

    def read(self, limit: int, startable: Callable[[Task], bool] = lambda task: True
             ) -> list[Task]:
        """Up to ``limit`` WAITING tasks this node may start (``startable``: its type known
        here, not declined, the first of its ordering key in what was read), the highest lanes
        first, each lane's oldest first. Tasks that cannot start (a busy key's later tasks, a
        type this node lacks) are walked past, at most :data:`MAX_WINDOWS` windows a lane: so
        they cost reads while they lead their lane, and never stop the tasks behind them."""
        found: list[Task] = []
        end = codec.now() + timedelta(seconds=due.HORIZON + 2 * due.BUCKET)
        self.reads += 1
        for lane in self.tasks.lanes():
            found += self._lane(lane, limit - len(found), end, startable)
            if len(found) >= limit:
                break
        return found

    def _cursor(self, lane: str) -> datetime:
        known = self.cursors.get(lane)
        if known is not None and time.monotonic() - known[1] < REFIND:
            return known[0]
        return self._find(lane)

    def _find(self, lane: str) -> datetime:
        """The lane's oldest ready second, read from the lane (now when none waits)."""
        self.reads += 1
        seconds = self.tasks.lane_seconds(lane)
        at = due.instant(seconds[0]) if seconds else codec.now()
        self.cursors[lane] = (at, time.monotonic())
        return at

    def _lane(self, lane: str, want: int, end: datetime,
              startable: Callable[[Task], bool]) -> list[Task]:
        cursor = self._cursor(lane)
        at = cursor - timedelta(seconds=SKEW)
        got: list[Task] = []
        seen = False  # a task of the lane was found (startable or not): the cursor stays
        sizes = iter(WINDOWS[1:])
        empty = refinds = windows = 0
        size = WINDOWS[0]
        while at <= end and len(got) < want and windows < MAX_WINDOWS:
            if empty:
                size = next(sizes, WIDEST)  # wider only while they come back empty
            need = want - len(got)
            self.reads += 1
            windows += 1
            rows = self.tasks.ready_page(lane, due.seconds_from(at, size), need + need // 2 + 1)
            at += timedelta(seconds=size)
            if rows:  # more than is needed, the oldest of them kept: a window's order
                seen = True
                rows.sort(key=_order)
                got += [task for task in rows if startable(task)][:need]
                empty = 0
                sizes, size = iter(WINDOWS[1:]), WINDOWS[0]
            else:
                empty += 1
                if not seen and at <= codec.now():
                    # before every task found, and past: nothing can come there any more
                    cursor = max(cursor, at)
                    self.cursors[lane] = (cursor, self.cursors.get(lane, (cursor, 0.0))[1])
                if not seen and empty >= EMPTY_WINDOWS and refinds < 2:  # a gap: ask the lane
                    refinds += 1
                    found = self._find(lane)
                    at, empty = found - timedelta(seconds=SKEW), 0
                    sizes, size = iter(WINDOWS[1:]), WINDOWS[0]
        return got


def _order(task: Task) -> tuple[datetime, datetime, str]:
    """The order tasks became ready in: their ``run_at``, else their last change."""
    return (task.run_at or task.updated_at, task.created_at, task.id)
