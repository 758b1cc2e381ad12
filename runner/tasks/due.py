"""The due-time index's cursor: which time buckets the master has moved into the open queue.

A task due later than the open queue's horizon waits in a minute bucket
(:mod:`runner.store.due`). ``due/promoted`` in ZooKeeper (a :class:`~coord.VersionedRegister`)
holds the last bucket moved. Whoever
writes a task into a bucket first makes sure the cursor exists (:func:`ensure_cursor`: the
current minute when absent), so the master never starts past a bucket that holds a task; the
master then moves every bucket after the cursor up to the horizon, a hundred per read, and
records each step (:func:`promote`). A master that dies between a move and its record moves
the same buckets again: moving is idempotent.

Failure behaviour: ZooKeeper errors surface as :class:`~coord.errors.CoordError`, store errors
as :class:`~runner.errors.StoreError`; the master logs them and tries again next round.
Documented limit: the nodes' clocks must agree within a bucket (a minute).

The ready lanes' floors (:class:`LaneFloors`, ``due/ready/<lane>``): per lane, a second before
which no WAITING task of the lane became ready (but for a few seconds of clock skew or a slow
write, which a walk reads again once a second): where a node that has no cursor of its own yet
starts reading the lane (:class:`~runner.tasks.worker.ready.ReadyScan`), instead of reading the
lane's every task. Only a hint: lost or absent, the node reads the lane once.
"""

from __future__ import annotations

import logging
from datetime import datetime

from coord import CoordError, Session, VersionConflict, VersionedRegister
from runner.store import codec
from runner.store.api import TaskStore
from runner.store.due import BUCKET, HORIZON, bucket_of, promote_through

CURSOR = "due/promoted"
PER_READ = 100
FLOORS = "due/ready"

log = logging.getLogger(__name__)


def ensure_cursor(session: Session, now: datetime | None = None) -> None:
    """Create the cursor at the current minute unless it exists (before a bucketed write)."""
    try:
        VersionedRegister(session, CURSOR).compare_and_set(-1, bucket_of(now or codec.now()))
    except VersionConflict:
        pass  # it exists


def promote(session: Session, tasks: TaskStore, now: datetime | None = None) -> int:
    """Move every bucket after the cursor that is within the horizon into the open queue;
    how many tasks moved. No cursor: no task was ever bucketed, nothing to do."""
    target = promote_through(now or codec.now())
    moved = 0
    cursor = VersionedRegister(session, CURSOR)
    value, version = cursor.get()
    if version == -1:
        return 0
    last = int(value)
    while last < target:
        upto = min(last + PER_READ, target)
        moved += tasks.promote(list(range(last + 1, upto + 1)))
        try:
            version = cursor.compare_and_set(version, upto)
        except VersionConflict:  # another master moved it meanwhile: it goes on
            return moved
        last = upto
    return moved


def needs_cursor(run_at: datetime | None) -> bool:
    """Whether a task with this ``run_at`` may be written into a bucket."""
    return run_at is not None and (run_at - codec.now()).total_seconds() > HORIZON + 2 * BUCKET


class LaneFloors:
    """The ready lanes' floors in ZooKeeper (see the module), one register per lane that a
    node has read. Failure behaviour: a ZooKeeper error is logged at DEBUG and the floor is
    treated as absent (a read) or left as it was (a write): the caller reads the lane instead;
    nothing depends on a floor being written."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._registers: dict[str, VersionedRegister] = {}
        self._known: dict[str, tuple[datetime | None, int]] = {}  # lane -> (floor, version)

    def _register(self, lane: str) -> VersionedRegister:
        if lane not in self._registers:
            self._registers[lane] = VersionedRegister(self.session, f"{FLOORS}/{lane}")
        return self._registers[lane]

    def get(self, lane: str) -> datetime | None:
        """The lane's floor (one read), or None when none was written or it cannot be read."""
        try:
            value, version = self._register(lane).get()
        except CoordError as exc:
            log.debug("cannot read the floor of lane %s: %s", lane, exc)
            return None
        floor = None if value is None else datetime.fromisoformat(value)
        self._known[lane] = (floor, version)
        return floor

    def move(self, lane: str, at: datetime, *, back: bool = False) -> None:
        """Move the lane's floor to ``at``: forward only, or back only with ``back`` (a walk
        found a task behind it). One write at the version last read (a read first when none
        was), once more after a conflict; a move the floor is already past is left out."""
        for _ in range(2):
            if lane not in self._known:
                self.get(lane)
                if lane not in self._known:
                    return  # unreadable
            floor, version = self._known[lane]
            if floor is not None and (at <= floor if not back else at >= floor):
                return
            try:
                version = self._register(lane).compare_and_set(version, at.isoformat())
            except VersionConflict:
                self._known.pop(lane, None)
                continue
            except CoordError as exc:
                log.debug("cannot move the floor of lane %s: %s", lane, exc)
                return
            self._known[lane] = (at, version)
            return
