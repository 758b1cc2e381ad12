"""The ready buckets and lanes the task loop reads a page at a time.

Format 1 kept every open task in one ``task_queue`` value, ``open``, and the task loop read
all of them at every listing: a cost that grew with the tasks waiting. From format 2 an open
task's ``task_queue`` is its ready bucket, ``r<lane>:<second>`` (its lane from its priority,
its second from its ``run_at`` or its last change), or ``running`` once claimed, and every task
carries ``task_lane`` (its lane while ready or running, else empty): a scan reads a page of the
highest lane's oldest seconds (``runner/store/due.py``, ``runner/tasks/worker/ready.py``). This
step writes both on every task without ``task_lane``; tasks in a time bucket or closed keep
their ``task_queue``. The buckets are computed here as format 2 defined them, frozen.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from runner.store import codec
from runner.store.migrations.backfill import TaskBackfill

#: format 2's buckets: seconds per time bucket, and how far ahead a task is ready already
BUCKET = 60
HORIZON = 60
LANES = tuple(f"r{n:02d}" for n in range(19))


def _time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def _second(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y%m%d%H%M%S")


def queue_v2(row: Mapping[Any, Any], now: datetime) -> tuple[str, str]:
    """(``task_queue``, ``task_lane``) of a task's row as format 2 wrote them at ``now``."""
    state = json.loads(row["task_state"])
    lane = LANES[9 - max(-9, min(9, int(row["task_priority"])))]
    if state["finished"] or not state["active"]:
        return "closed", ""
    if state["status"] == "RUNNING":
        return "running", lane
    run_at = _time(state["run_at"]) if state.get("run_at") else None
    if run_at is None or run_at <= now + timedelta(seconds=HORIZON + 2 * BUCKET):
        updated = _time(state["updated"])
        ready = max(run_at, updated) if run_at is not None else updated
        return f"{lane}:{_second(ready)}", lane
    return f"at:{int(run_at.timestamp()) // BUCKET}", ""


def ready_props(row: Mapping[Any, Any]) -> dict[str, str]:
    queue, lane = queue_v2(row, codec.now())
    return {"task_queue": queue, "task_lane": lane}


STEP = TaskBackfill(version=2, marker="task_lane", compute=ready_props)
