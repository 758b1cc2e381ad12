"""Task states: a stopped task is failed or cancelled, and the lists say succeeded.

From format 5 every task has one state (``runner.store.model.TaskState``: waiting, delayed,
running, succeeded, failed, cancelled, skipped), and the web console's ``state:`` filter finds
each stored one from the ``task_list`` index. Formats 1-4 stored ``finished`` and ``stopped``
there, and a stopped task did not say whether its last attempt failed or an operator stopped
it. This step rewrites ``task_list``: ``finished`` becomes ``succeeded``; ``stopped`` becomes
``failed`` when the task's last attempt (the highest ``seq``) FAILED or TIMED_OUT, else
``cancelled`` (cancelled, deactivated, stopped before it ran), and that cause goes into its
``task_state`` JSON as ``stop``. Nothing else changes.

The step writes with its own frozen writer (the two property names, and ``task_state`` JSON
encoded as format 5 has it), never the row mappers of later code. It is idempotent (it finds
only tasks still listed with a word of format 4) and resumable (each page is one write, after
which its tasks no longer match), so it needs no cursor.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gremlin_python.process.traversal import Cardinality, P

from runner.store.api import Graph
from runner.store.migrations.backfill import StepProgress
from runner.store.traversal import Traversal

#: the words of format 4 this step rewrites
OLD = ("finished", "stopped")
#: an attempt status that makes a stopped task failed (any other, or none: cancelled)
FAILED_STATUSES = ("FAILED", "TIMED_OUT")


def encode(value: Any) -> str:
    """``task_state``'s JSON exactly as format 5 writes it."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)


def new_props(row: dict[str, Any], attempts: list[dict[str, Any]]) -> dict[str, str]:
    """What format 5 holds for a task listed with a format-4 word (its element map) whose
    attempts' element maps are ``attempts``."""
    if row["task_list"] == "finished":
        return {"task_list": "succeeded"}
    last = max(attempts, key=lambda a: int(json.loads(a["attempt_start"])["seq"]),
               default=None)
    stop = "failed" if last is not None and last["attempt_status"] in FAILED_STATUSES \
        else "cancelled"
    state = json.loads(row["task_state"])
    state["stop"] = stop
    return {"task_list": stop, "task_state": encode(state)}


@dataclass(frozen=True)
class TaskStates:
    version: int = 5

    def run(self, graph: Graph, start: int, page: int, progress: StepProgress,
            dry_run: bool) -> tuple[int, int]:
        def count(g: Traversal) -> int:
            return int(g.V().has("task_list", P.within(list(OLD))).count().next())
        total = graph.read(count)
        if dry_run:
            progress(total, total)
            return total, 0
        changed, last_page = 0, None
        while True:
            def read(g: Traversal) -> list[Any]:
                return list(g.V().has("task_list", P.within(list(OLD))).limit(page)
                            .element_map("task_id", "task_list", "task_state").to_list())
            rows = graph.read(read)
            if not rows:
                return changed, 0
            ids = sorted(str(r["task_id"]) for r in rows)
            if ids == last_page:  # written, and still listed so: never loop on it
                raise RuntimeError(f"format 5: tasks {ids[:3]}... kept their format-4 word")
            last_page = ids

            def attempts(g: Traversal, ids: list[str] = ids) -> list[Any]:
                return list(g.V().has("task_id", P.within(ids)).out("has_attempt")
                            .element_map("attempt_status", "attempt_start").to_list())
            of: dict[str, list[dict[str, Any]]] = {}
            for a in graph.read(attempts):
                of.setdefault(json.loads(a["attempt_start"])["task"], []).append(a)
            changes = [(str(r["task_id"]), new_props(r, of.get(str(r["task_id"]), [])))
                       for r in rows]

            def write(g: Traversal, changes: list[tuple[str, dict[str, str]]] = changes) -> None:
                for task_id, props in changes:
                    t = g.V().has("task_id", task_id).has("task_list", P.within(list(OLD)))
                    for key, value in props.items():
                        t = t.property(Cardinality.single, key, value)
                    t.iterate()
            graph.write(write)
            changed += len(changes)
            progress(min(changed, total), total)


STEP = TaskStates()
