"""ReadyScan: the next ready tasks a node tries, read a page at a time from the ready buckets
(:mod:`runner.store.due`), so what a scan costs does not grow with the tasks that wait.

One probe read says which lanes (priorities) hold a task (see :data:`PROBE_EVERY`; the listings
between read the lanes whose last walk found tasks); in the highest of them, from the lane's
cursor (the oldest second a WAITING task of the lane may have become ready in), it reads
windows of seconds forward, one index lookup each (``task_queue`` in the window's keys,
``limit`` at most), narrow first (a dense backlog is read a second at a time, so the oldest go
first) and wider while they come back empty, up to an hour while the window is past (a window
over a minute that finds tasks is read again a quarter at a time, down to a minute; ahead of
now a minute at most), until it has ``limit`` tasks or reaches the end of the ready horizon;
then the next lane. A window asks for half as many again as the tasks still needed and keeps
the oldest of them, so the order within a window holds while it is no denser than that (every
row read costs its deserialisation; the nodes read the same oldest rows). A window read empty
before any task was found moves the cursor past it.

Why a cursor can only move forward: a task becomes ready at the moment of its change (its
creation, being put back) or at its ``run_at``, never in the past; so the windows behind the
cursor stay empty, but for clocks that disagree and writes that land late: a walk starts
:data:`SKEW` seconds before the cursor every :data:`SKEW_EVERY` seconds, and every
:data:`REFIND` seconds one read looks :data:`BACKSTOP` seconds behind it (a task found there
moves the cursor back); a writer that knows its write landed late says so
(:meth:`ReadyScan.rewind`, through TRIGGER_SCAN). A lane that holds nothing ready or running
has its cursor at now (what comes next is written at now or later), and no cursor passes now
less :data:`LAG` seconds (a task written now was stamped when it was made, a moment before).

Where a cursor starts: the lane's shared floor in ZooKeeper (:class:`~runner.tasks.due.
LaneFloors`), which each node moves to its cursor every :data:`PUBLISH_EVERY` seconds, so a
node that starts while 100,000 tasks wait begins where the others are, with no read that grows
with them. Only with no floor (a new cluster, a graph migrated from format 1) is the lane's
oldest second read from the lane itself (every waiting task's ``task_queue``: 6 s at 100,000
on gremlite), and the floor moved to it.

A node's own read (``shards``: :meth:`ReadyScan.read`) finds only the tasks of its shards
(those it is preferred for: :mod:`runner.store.due`), so a window it reads empty may still hold
the others' tasks: it never moves a cursor forward nor says a lane holds nothing. The full reads
(every task) do, as before.

Failure behaviour: a store error propagates to the caller (the backlog logs it and the scan
ends); nothing is kept half updated.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Protocol

from runner.store import Task, codec, due
from runner.store.api import TaskStore

#: seconds a walk starts before its lane's cursor (clocks that disagree, writes that land late)
SKEW = 5
#: seconds a cursor stays behind now (a task written now may have been stamped a second ago:
#: a walk that does not start SKEW back still reads it)
LAG = 2
#: seconds between two walks of a lane that start before its cursor (the others start at it:
#: two reads of windows that are empty but for a late write are not paid on every listing)
SKEW_EVERY = 1.0
#: seconds between two reads of the :data:`BACKSTOP` seconds behind a lane's cursor
REFIND = 300.0
#: seconds behind a lane's cursor read again every :data:`REFIND` seconds (a task written late)
BACKSTOP = 900
#: seconds between a node's moves of a lane's shared floor
PUBLISH_EVERY = 30.0
#: the windows a walk reads, in seconds: narrow first, wider while they come back empty (a
#: gap in the arrivals is crossed in a few reads: the widest is an hour)
WINDOWS = (1, 4, 15, 40, 60, 240, 960, 3840)
#: the widest window whose tasks are taken as found: one wider that finds tasks is read again
#: a quarter at a time (each size past the narrow ones is four times the last), down to this
ORDERED = 60
#: windows a walk reads in one lane at most (past tasks that cannot start, or empty ones)
MAX_WINDOWS = 32
#: seconds between two reads, by one node, of the windows past now (the tasks due within the
#: horizon, which the due timer starts at their time) that no write asked for: a listing
#: after each finished task reads up to now only. On a Gremlin Server the three minute-wide
#: windows ahead were most of an idle cluster's reads, about 20 ms each of the serial
#: server's time, and the paced submits queued behind them: every 2 s, the p99 of 300 paced
#: submits was 24 / 30 ms, every 10 s 17 / 18 ms. Safe while far below the horizon (180 s):
#: a task due later is planned that long before its time, and a write of a task due soon asks
#: for the read (TRIGGER_SCAN)
AHEAD_EVERY = 10.0
#: seconds between two probes, by one node, of the lanes that held nothing (one read, a
#: lookup per lane: 11 ms of a serial Gremlin Server) that no write asked for: the others
#: walk only the lanes whose last walk found tasks. A task put back in an empty lane without
#: a TRIGGER_SCAN (one a node declined) is found by the first listing this long after the last
#: probe
PROBE_EVERY = 2.0


class Floors(Protocol):
    """The lanes' shared floors (:class:`~runner.tasks.due.LaneFloors`)."""

    def get(self, lane: str) -> datetime | None: ...

    def move(self, lane: str, at: datetime, *, back: bool = False) -> None: ...


class ReadyScan:
    """Per lane, the cursor of one node's reads of the ready buckets (see the module);
    ``floors``: the lanes' shared floors (none: each node reads a lane once to start)."""

    def __init__(self, tasks: TaskStore, floors: Floors | None = None) -> None:
        self.tasks = tasks
        self.floors = floors
        #: lane -> (its cursor, when the lane was last read behind it)
        self.cursors: dict[str, tuple[datetime, float]] = {}
        self._published: dict[str, float] = {}  # lane -> when its floor was last moved
        self._held: set[str] = set()  # the lanes whose last walk found tasks
        self._skewed: dict[str, float] = {}  # lane -> when a walk last started before its cursor
        self.reads = 0  # index reads made (the bench's and the tests' measure)
        self.lane_reads = 0  # reads of a whole lane (the tests' measure)
        self._behind: datetime | None = None  # a rewind asked for, applied by the next read
        self._asked = False  # a write asked for a listing (:meth:`ask`), not read since
        self._behind_lock = threading.Lock()  # over _behind and _asked
        self._ahead_at = -AHEAD_EVERY  # when a read last walked past now (monotonic)
        self._probed_at = -PROBE_EVERY  # when a read last probed the lanes (monotonic)
        #: whether the last read walked to the end of the horizon (False: up to now only)
        self.read_ahead = True

    def rewind(self, at: datetime) -> None:
        """Tasks were written ready at ``at`` (a second) that may lie behind the cursors: a
        write that landed late (its writer paused, or waiting for the graph, after it stamped
        them). The next read starts every lane behind ``at`` there, and moves the lanes' shared
        floors back to it. Thread-safe: called from whoever heard of the write."""
        with self._behind_lock:
            self._behind = at if self._behind is None else min(self._behind, at)

    def ask(self) -> None:
        """A task was written that may start (here or by another node: a TRIGGER_SCAN): the
        next read probes every lane and reads ahead of now, as one a write asked for does,
        even when the listing it asked for could not run (no worker free). Thread-safe."""
        with self._behind_lock:
            self._asked = True

    def _rewound(self) -> None:
        with self._behind_lock:
            at, self._behind = self._behind, None
        if at is None:
            return
        for lane, (cursor, checked) in list(self.cursors.items()):
            if at < cursor:
                self.cursors[lane] = (at, checked)
                if self.floors is not None:
                    self.floors.move(lane, at, back=True)

    def read(self, limit: int, startable: Callable[[Task], bool] = lambda task: True,
             *, ahead: bool = True, shards: Sequence[str] | None = None) -> list[Task]:
        """Up to ``limit`` WAITING tasks this node may start (``startable``: its type known
        here, not declined, the first of its ordering key in what was read), the highest lanes
        first, each lane's oldest first. Tasks that cannot start (a busy key's later tasks, a
        type this node lacks) are walked past, at most :data:`MAX_WINDOWS` windows a lane: so
        they cost reads while they lead their lane, and never stop the tasks behind them.

        The walks go on past now to the end of the horizon (tasks due soon, for the due timer) when
        ``ahead`` or :meth:`ask` (a write asked for the read) or :data:`AHEAD_EVERY` seconds after
        the last read that did; otherwise they end at now (:attr:`read_ahead` says which). The
        lanes that held nothing are probed (one read, a lookup per lane) by those reads, and
        otherwise at most every :data:`PROBE_EVERY` seconds; the listings between walk only the
        lanes whose last walk found tasks. A task written in a lane that was empty comes with its
        write's TRIGGER_SCAN, or is found by the first listing :data:`PROBE_EVERY` seconds after
        the last probe (the interval's scan at the latest). ``shards``: only tasks of these
        shards (this node's own: see the module)."""
        self._rewound()
        with self._behind_lock:
            asked, self._asked = self._asked, False
        found: list[Task] = []
        began = time.monotonic()
        self.read_ahead = ahead or asked or began - self._ahead_at >= AHEAD_EVERY
        if self.read_ahead:
            self._ahead_at = began
            end = codec.now() + timedelta(seconds=due.HORIZON + 2 * due.BUCKET)
        else:
            end = codec.now()
        if self.read_ahead or began - self._probed_at >= PROBE_EVERY:
            self._probed_at = began
            lanes = self._lanes_holding()
        else:
            lanes = sorted(self._held)
        for lane in lanes:
            found += self._lane(lane, limit - len(found), end, startable, shards)
            self._publish(lane)
            if len(found) >= limit:
                break
        return found

    def _lanes_holding(self) -> list[str]:
        """The lanes that hold a ready or running task (one read, when :meth:`read` probes: a
        task submitted a moment ago is listed by the scan its write asked for); the cursors of
        the others move to now. A lane whose last walk found tasks is taken as holding some
        without being asked about (its walk says otherwise at once): a graph whose index lookup
        goes through every vertex with the value (TinkerGraph 3.5 copies the set before
        ``limit(1)``) would pay for the lane's every waiting task once per listing; the lanes asked
        about are the empty or small ones."""
        self.reads += 1
        now = codec.now() - timedelta(seconds=LAG)
        held = set(self._held)
        lanes = sorted(held | set(self.tasks.lanes([lane for lane in due.LANES
                                                    if lane not in held])))
        for lane, (_, checked) in list(self.cursors.items()):
            if lane not in lanes:  # nothing ready or running: what comes is written from now
                self.cursors[lane] = (now, checked)
                self._publish(lane)
        return lanes

    def _cursor(self, lane: str) -> datetime:
        known = self.cursors.get(lane)
        if known is None:
            return self._find(lane)
        if time.monotonic() - known[1] >= REFIND:
            return self._backstop(lane, known[0])
        return known[0]

    def _find(self, lane: str) -> datetime:
        """Where this node starts the lane: its shared floor, else the lane's oldest second
        (neither past now less :data:`LAG`: a floor moved ahead by an older node)."""
        floor = self.floors.get(lane) if self.floors is not None else None
        if floor is None:
            return self._read_lane(lane)
        floor = min(floor, codec.now() - timedelta(seconds=LAG))
        self.cursors[lane] = (floor, time.monotonic())
        return floor

    def _read_lane(self, lane: str) -> datetime:
        """The lane's oldest ready second, read from the lane, but never past now less
        :data:`LAG` (its oldest task may be due later: a task written now is behind it); the
        shared floor moved to it."""
        self.reads += 1
        self.lane_reads += 1
        seconds = self.tasks.lane_seconds(lane)
        at = codec.now() - timedelta(seconds=LAG)
        if seconds:
            at = min(at, due.instant(seconds[0]))
        self.cursors[lane] = (at, time.monotonic())
        if self.floors is not None:
            self.floors.move(lane, at, back=True)
            self.floors.move(lane, at)
            self._published[lane] = time.monotonic()
        return at

    def _backstop(self, lane: str, cursor: datetime) -> datetime:
        """One read of the :data:`BACKSTOP` seconds behind the cursor (but the :data:`SKEW`
        every walk reads): a task there (a clock behind, a write that landed late) moves the
        cursor, and the shared floor, back to where the read began."""
        self.reads += 1
        start = cursor - timedelta(seconds=BACKSTOP)
        behind = self.tasks.ready_page(lane, due.seconds_from(start, BACKSTOP - SKEW), 1)
        at = start if behind else cursor
        self.cursors[lane] = (at, time.monotonic())
        if behind and self.floors is not None:
            self.floors.move(lane, at, back=True)
            self._published[lane] = time.monotonic()
        return at

    def _publish(self, lane: str) -> None:
        """Move the lane's shared floor to this node's cursor, every :data:`PUBLISH_EVERY`
        seconds at most (forward only)."""
        if self.floors is None or lane not in self.cursors:
            return
        last = self._published.get(lane)
        if last is not None and time.monotonic() - last < PUBLISH_EVERY:
            return
        self._published[lane] = time.monotonic()
        self.floors.move(lane, self.cursors[lane][0])

    def _lane(self, lane: str, want: int, end: datetime, startable: Callable[[Task], bool],
              shards: Sequence[str] | None = None) -> list[Task]:
        cursor = self._cursor(lane)
        at = cursor
        if time.monotonic() - self._skewed.get(lane, -SKEW_EVERY) >= SKEW_EVERY:
            at -= timedelta(seconds=SKEW)
            self._skewed[lane] = time.monotonic()
        got: list[Task] = []
        seen = False  # a task of the lane was found (startable or not): the cursor stays
        step = windows = 0  # the window size's index in WINDOWS
        widest = len(WINDOWS) - 1  # narrower after a wide window that found tasks
        now = codec.now()
        while at <= end and len(got) < want and windows < MAX_WINDOWS:
            size = WINDOWS[step]
            if size > ORDERED and at + timedelta(seconds=size) > now:
                # a wide window ends at now: few tasks are ready ahead, and they cost its keys
                size = max(ORDERED, int((now - at).total_seconds()) + 1)
            need = want - len(got)
            self.reads += 1
            windows += 1
            rows = self.tasks.ready_page(lane, due.seconds_from(at, size), need + need // 2 + 1,
                                         shards)
            at += timedelta(seconds=size)
            if rows and size > ORDERED:  # across a gap: its quarters, the first one first
                at -= timedelta(seconds=size)
                widest = step = step - 1
            elif rows:  # more than is needed, the oldest of them kept: a window's order
                seen = True
                rows.sort(key=_order)
                got += [task for task in rows if startable(task)][:need]
                step, widest = 0, len(WINDOWS) - 1
            else:
                step = min(step + 1, widest)  # wider only while they come back empty
                if not seen and shards is None and at <= now - timedelta(seconds=LAG):
                    # before every task found, and past: nothing can come there any more (but a
                    # write under way, which LAG leaves time for)
                    cursor = max(cursor, at)
                    self.cursors[lane] = (cursor, self.cursors.get(lane, (cursor, 0.0))[1])
        if seen:
            self._held.add(lane)
        elif shards is None:  # an own read that found none says nothing of the others' tasks
            self._held.discard(lane)
        return got


def _order(task: Task) -> tuple[datetime, datetime, str]:
    """The order tasks became ready in: their ``run_at``, else their last change."""
    return (task.run_at or task.updated_at, task.created_at, task.id)
