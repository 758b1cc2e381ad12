"""Task shards: the ready reads for a node's own tasks only.

From format 4 every task carries ``task_shard`` (``runner/store/due.py``: one of 60, from its
id), and a task's preferred member is its shard modulo the live members. A node's listing reads
the ready buckets for its own shards' tasks (a filter after the index lookup) and reads every
task only every ``steal_after`` seconds or when its own ran out
(``runner/tasks/worker/backlog.py``): with three nodes each read two thirds fewer rows. This
step writes ``task_shard`` on every task without it; a task without it would never be read by
its preferred member's own listings (the full ones still find it), so nodes refuse a graph at
format 3. The shard is computed here as format 4 defined it, frozen.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

from runner.store.migrations.backfill import TaskBackfill

#: format 4's number of shards
SHARDS = 60


def shard_props(row: Mapping[Any, Any]) -> dict[str, str]:
    return {"task_shard": str(zlib.crc32(str(row["task_id"]).encode()) % SHARDS)}


STEP = TaskBackfill(version=4, marker="task_shard", compute=shard_props)
