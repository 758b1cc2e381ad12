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
"""

from __future__ import annotations

from datetime import datetime

from coord import Session, VersionConflict, VersionedRegister
from runner.store import codec
from runner.store.due import BUCKET, HORIZON, bucket_of, promote_through
from runner.store.ports import TaskStore

CURSOR = "due/promoted"
PER_READ = 100


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
