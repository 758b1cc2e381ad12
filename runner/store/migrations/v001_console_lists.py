"""The web console's list properties on every task created before them.

Format 0 is a graph written before store formats existed: its tasks lack the properties the
web console's task list finds them by, so `latchwork web` did not list them. This step writes,
on every task without ``task_h``, what the create path of format 1 wrote: ``task_list``
(waiting, running, stopped, finished or skipped), ``task_owner``, ``task_h`` and ``task_s``
(the creation hour and second, as digits) and one ``task_res_<hex of the name>`` per resource.
Nothing else changes. Computed from the row alone, by code frozen here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from runner.store.migrations.backfill import TaskBackfill

#: the properties this step writes (the resource keys besides)
KEYS = ("task_list", "task_owner", "task_h", "task_s")


def list_state_v1(state: Mapping[str, Any]) -> str:
    """``task_list`` as format 1 wrote it from a task's ``task_state``: the words changed with
    format 5 (``v005_task_states``), which rewrites them from these."""
    if state["finished"]:
        return "skipped" if state.get("skipped") else "finished"
    if not state["active"]:
        return "stopped"
    return "running" if state["status"] == "RUNNING" else "waiting"


def console_props(row: Mapping[Any, Any]) -> dict[str, str]:
    state = json.loads(row["task_state"])
    digits = "".join(ch for ch in str(row["task_created"]) if ch.isdigit())
    wanted = {"task_list": list_state_v1(state), "task_owner": state.get("owner") or "",
              "task_h": digits[:10], "task_s": digits[:14]}
    wanted.update({"task_res_" + r.encode().hex(): "1" for r in state.get("resources", [])})
    return wanted


STEP = TaskBackfill(version=1, marker="task_h", compute=console_props)
