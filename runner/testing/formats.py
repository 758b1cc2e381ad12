"""Graphs in older store formats, written with plain traversals as the latchwork of that
format wrote them: what the migration tests (``tests/test_store_format.py``) and
``bench/bench_migrate.py`` migrate. Nothing here goes through the store's own writes, so a
change to those cannot change what "the old format" means."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from runner.store import codec
from runner.store.api import Graph

CREATED = datetime(2026, 10, 1, 8, 30, tzinfo=UTC)


def write_format_0(graph: Graph, count: int) -> list[str]:
    """``count`` tasks as format 0 held them, in pages; every third finished with a SUCCEEDED
    attempt, every fifth stopped, every fourth taking the resource ``printer``. Their ids."""
    ids = []
    for start in range(0, count, 100):
        def page(g: Any, start: int = start) -> None:
            for i in range(start, min(start + 100, count)):
                task_id = f"old-{i:06d}"
                ids.append(task_id)
                created = CREATED + timedelta(seconds=i)
                finished, stopped = i % 3 == 0, i % 5 == 0 and i % 3 != 0
                resources = ["printer"] if i % 4 == 0 else []
                state = {"status": "WAITING", "active": not stopped, "finished": finished,
                         "owner": "", "updated": codec.encode_time(created), "attempts": 1,
                         "run_at": "", "resources": resources, "skipped": False}
                task = (g.add_v("task").property("task_id", task_id)
                        .property("task_type", f"old.kind{i % 2}")
                        .property("task_payload", json.dumps({"i": i}))
                        .property("task_priority", 0)
                        .property("task_created", codec.encode_time(created))
                        .property("task_version", 2).property("task_fence", codec.encode_big(7))
                        .property("task_queue", "closed" if finished or stopped else "open")
                        .property("task_state", json.dumps(state))
                        .property("task_okey_open", "")
                        .property("task_stopped", "1" if stopped else ""))
                if finished:
                    task = task.property("task_end_day", created.strftime("%Y-%m-%d"))
                task.as_("t").add_v("attempt").property("attempt_id", f"{task_id}-a1") \
                    .property("attempt_status", "SUCCEEDED" if finished else "FAILED") \
                    .property("attempt_start", json.dumps({
                        "task": task_id, "seq": 1, "executor": "old-node:1:aa",
                        "started": codec.encode_time(created), "fence": codec.encode_big(7)})) \
                    .property("attempt_end", json.dumps({
                        "ended": codec.encode_time(created + timedelta(seconds=1)),
                        "duration_ms": 1000, "error": "", "stack": ""})) \
                    .as_("a").add_e("has_attempt").from_("t").to("a").iterate()
        graph.write(page)
    return ids


def write_format_0_open_task(graph: Graph, task_id: str, task_type: str,
                             payload: dict[str, Any]) -> None:
    """One open task as a node of a release before store formats wrote it on submit: its state,
    fence and version, and ``task_queue = "open"``, with none of what format 1 and later add
    (no list properties, no ready bucket, no shard): what such a node, still running beside
    new ones after a migration, writes."""
    created = datetime.now(UTC)
    state = {"status": "WAITING", "active": True, "finished": False, "owner": "",
             "updated": codec.encode_time(created), "attempts": 0, "run_at": "",
             "resources": [], "skipped": False}
    graph.write(lambda g: g.add_v("task").property("task_id", task_id)
                .property("task_type", task_type).property("task_payload", json.dumps(payload))
                .property("task_priority", 0)
                .property("task_created", codec.encode_time(created))
                .property("task_version", 0).property("task_fence", codec.encode_big(0))
                .property("task_queue", "open").property("task_state", json.dumps(state))
                .property("task_okey_open", "").property("task_stopped", "").iterate())
