"""The ready buckets and lanes the task loop reads a page at a time.

Format 1 kept every open task in one ``task_queue`` value, ``open``, and the task loop read
all of them at every listing: a cost that grew with the tasks waiting. From format 2 an open
task's ``task_queue`` is its ready bucket, ``r<lane>:<second>`` (its lane from its priority,
its second from its ``run_at`` or its last change), or ``running`` once claimed, and every task
carries ``task_lane`` (its lane while ready or running, else empty): a scan reads a page of the
highest lane's oldest seconds (``runner/store/due.py``, ``runner/tasks/worker/ready.py``). This
step writes both on every task without ``task_lane``; tasks in a time bucket or closed keep
their ``task_queue``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runner.store import codec, due
from runner.store.migrations.backfill import TaskBackfill
from runner.store.model import Task


def ready_props(task: Task, row: Mapping[Any, Any]) -> dict[str, Any]:
    queue = due.queue_of(task, codec.now())
    return {"task_queue": queue, "task_lane": due.lane_field(task, queue)}


STEP = TaskBackfill(version=2, marker="task_lane", compute=ready_props)
