"""Where an open task waits: a ready bucket the task loop reads, or a time bucket.

``task_queue`` says it, one indexed equality per task:

* ``r<lane>:<second>``: WAITING and due (or due within :data:`HORIZON` plus two buckets). Its
  lane is its priority, clamped to -9..9 (:func:`lane_of`: ``r00`` the highest); its second
  is when it became ready (``YYYYMMDDHHMMSS`` of its ``run_at``, or of its last change when
  that is later: its creation, the moment it was put back or reactivated; never a second
  already past when it is written, which a node's cursor may have walked by). A node reads
  the highest lane with tasks first, and in it the oldest seconds first, a minute's worth at
  a time (:class:`~runner.tasks.worker.ready.ReadyScan`): a scan costs a few index reads,
  whatever number of tasks wait;
* ``running``: claimed; ``closed``: finished or stopped; ``deps``: a workflow member whose
  dependencies have not all succeeded (in no ready bucket: no scan finds it; the end that
  releases it writes its ready bucket: :mod:`runner.store.gremlin.workflows`);
* ``at:<n>``: due later, in the bucket of its minute (``n`` = its epoch second //
  :data:`BUCKET`), so no scan reads far-future tasks. The master moves buckets into the ready
  ones as they come within the horizon (a cursor in ZooKeeper records the last bucket moved;
  see :mod:`runner.tasks.due`). A bucket is only ever written more than two buckets past the
  one the cursor may reach now, so a clock skew of up to a bucket between nodes never writes a
  task into a bucket already moved.

``task_lane`` holds the lane of every open task that is ready or running (none in a time
bucket, none once closed): the tasks the loop lists, and which lanes hold any.

``task_shard`` (from format 4) is one of :data:`SHARDS` shards, from the task's id
(:func:`shard_of`), written once when the task is made. A task's preferred member is its shard
modulo the live members (:func:`preferred_index`), so a node reads the ready buckets for its own
shards' tasks only (a filter after the index lookup), and the others' rows are not read,
shipped and decoded by every node. Pure; nothing fails.
"""

from __future__ import annotations

import zlib
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runner.store.model import Task

#: the queue of a workflow member that still waits for a dependency
DEPS = "deps"
#: seconds per bucket
BUCKET = 60
#: tasks due within this many seconds (plus two buckets) are in the ``open`` queue
HORIZON = 60


#: shards of the tasks (``task_shard``): divisible by 1 to 6, 10, 12, 15, 20 and 30 members, so
#: that each of those gets as many; a member past the 60th has none of its own
SHARDS = 60


def shard_of(task_id: str) -> str:
    """``task_shard``: the task's shard, from its id."""
    return str(zlib.crc32(task_id.encode()) % SHARDS)


def preferred_index(task_id: str, members: int) -> int:
    """The index, among ``members`` sorted live member ids, of the task's preferred member: its
    shard modulo ``members``."""
    return (zlib.crc32(task_id.encode()) % SHARDS) % members


def shards_of(index: int, members: int) -> list[str]:
    """The shards of the member at ``index`` among ``members`` (the tasks it is preferred for)."""
    return [str(shard) for shard in range(SHARDS) if shard % members == index]


def bucket_of(at: datetime) -> int:
    return int(at.timestamp()) // BUCKET


def bucket_name(bucket: int) -> str:
    return f"at:{bucket}"


#: the lanes, highest priority first: a priority above 9 or below -9 shares the end lane
LANES = tuple(f"r{n:02d}" for n in range(19))


def lane_of(priority: int) -> str:
    """The lane of a priority: ``r00`` for 9 and above ... ``r18`` for -9 and below."""
    return LANES[9 - max(-9, min(9, priority))]


def second(at: datetime) -> str:
    """``YYYYMMDDHHMMSS`` of ``at`` in UTC."""
    return at.astimezone(UTC).strftime("%Y%m%d%H%M%S")


def instant(digits: str) -> datetime:
    """The UTC second ``YYYYMMDDHHMMSS`` stands for."""
    return datetime.strptime(digits, "%Y%m%d%H%M%S").replace(tzinfo=UTC)


def ready_key(lane: str, at: str) -> str:
    return f"{lane}:{at}"


def is_ready_key(queue: str) -> bool:
    return queue.startswith("r") and ":" in queue


def queue_of(task: Task, now: datetime) -> str:
    """``closed`` (finished or stopped), ``running``, the task's ready bucket, or its time
    bucket."""
    if not task.open:
        return "closed"
    if task.status.value == "RUNNING":
        return "running"
    if task.pending > 0 or task.awaits_commit:  # a workflow member that waits
        return DEPS
    if task.run_at is None or task.run_at <= now + timedelta(seconds=HORIZON + 2 * BUCKET):
        return ready_key(lane_of(task.priority), second(ready_at(task, task.updated_at)))
    return bucket_name(bucket_of(task.run_at))


def ready_at(task: Task, now: datetime) -> datetime:
    """When a task written ready at ``now`` became ready: its ``run_at``, unless that is past."""
    return max(task.run_at, now) if task.run_at is not None else now


def lane_field(task: Task, queue: str) -> str:
    """``task_lane``: the lane of a task that is ready or running, else empty."""
    return lane_of(task.priority) if queue == "running" or is_ready_key(queue) else ""


def seconds_from(start: datetime, count: int) -> list[str]:
    """``count`` seconds (``YYYYMMDDHHMMSS``) from ``start`` on."""
    return [second(start + timedelta(seconds=n)) for n in range(count)]


def promote_through(now: datetime) -> int:
    """The last bucket the master moves into ``open`` at ``now``."""
    return bucket_of(now + timedelta(seconds=HORIZON))
