"""The web console's list properties on every task created before them.

Format 0 is a graph written before store formats existed: its tasks lack the properties the
web console's task list finds them by (``runner/store/gremlin/search.py``), so `latchwork web`
did not list them. This step writes, on every task without ``task_h``, what the create path
writes since: ``task_list`` (waiting, running, stopped, finished or skipped), ``task_owner``,
``task_h`` and ``task_s`` (the creation hour and second, as digits) and one
``task_res_<hex of the name>`` per resource. Nothing else changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runner.store.gremlin.rows import resource_key, task_props
from runner.store.migrations.backfill import TaskBackfill
from runner.store.model import Task, TaskStatus

#: the properties this step writes (the resource keys besides)
KEYS = ("task_list", "task_owner", "task_h", "task_s")


def list_state_v1(task: Task) -> str:
    """``task_list`` as format 1 wrote it, frozen here: the words changed with format 5
    (``v005_task_states``), which rewrites them from these."""
    if task.finished:
        return "skipped" if task.skipped else "finished"
    if not task.active:
        return "stopped"
    return "running" if task.status is TaskStatus.RUNNING else "waiting"


def console_props(task: Task, row: Mapping[Any, Any]) -> dict[str, Any]:
    props = task_props(task)
    wanted = {key: props[key] for key in KEYS}
    wanted["task_list"] = list_state_v1(task)
    wanted.update({resource_key(r): "1" for r in task.resources})
    return wanted


STEP = TaskBackfill(version=1, marker="task_h", compute=console_props)
