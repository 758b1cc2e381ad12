"""Where an open task waits: the ``open`` queue the task loop lists, or a time bucket.

A task that may not run yet (``run_at``: delayed, scheduled, or a retry waiting for its
backoff) is in the ``open`` queue when it is due within :data:`HORIZON` plus two buckets, and
otherwise in the bucket ``at:<n>`` of its minute (``n`` = its epoch second // :data:`BUCKET`).
So the listing every node makes of the ``open`` queue does not grow with far-future tasks. The
master moves buckets into ``open`` as they come within the horizon (a cursor in ZooKeeper
records the last bucket moved; see :mod:`runner.tasks.due`). A bucket is only ever written
more than two buckets past the one the cursor may reach now, so a clock skew of up to a
bucket between nodes never writes a task into a bucket already moved. Pure; nothing fails.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runner.store.model import Task

#: seconds per bucket
BUCKET = 60
#: tasks due within this many seconds (plus two buckets) are in the ``open`` queue
HORIZON = 60


def bucket_of(at: datetime) -> int:
    return int(at.timestamp()) // BUCKET


def bucket_name(bucket: int) -> str:
    return f"at:{bucket}"


def queue_of(task: Task, now: datetime) -> str:
    """``closed`` (finished or stopped), ``open``, or the task's bucket."""
    if not task.open:
        return "closed"
    if task.run_at is None or task.run_at <= now + timedelta(seconds=HORIZON + 2 * BUCKET):
        return "open"
    return bucket_name(bucket_of(task.run_at))


def promote_through(now: datetime) -> int:
    """The last bucket the master moves into ``open`` at ``now``."""
    return bucket_of(now + timedelta(seconds=HORIZON))
