"""Retention's store side: finished tasks by the day they finished, and their removal with a
tombstone saying where they went. A missing tombstone raises nothing: ``tombstone()`` is None.
"""

from __future__ import annotations

from runner.store import codec
from runner.store.api import Graph
from runner.store.gremlin.rows import task_from_row
from runner.store.gremlin.steps import get_or_add
from runner.store.model import Task, Tombstone
from runner.store.traversal import Traversal


class GremlinRetentionStore:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def end_days(self) -> list[str]:
        """Every day some kept task finished on (a full read: once, to start the cursor)."""
        days = self.graph.read(  # gremlite has no dedup step
            lambda g: g.V().has("task_end_day").values("task_end_day").to_list())
        return sorted(set(days))

    def finished_on(self, day: str) -> list[Task]:
        rows = self.graph.read(
            lambda g: g.V().has("task_end_day", day).element_map().to_list())
        return sorted((task_from_row(r) for r in rows), key=lambda t: t.id)

    def remove(self, tasks: list[Task], where: str) -> None:
        """Drop the tasks, their attempts and incidents, and leave a tombstone for each, in
        one write (a task already gone is skipped); a workflow none of whose members is left
        goes with them."""
        at = codec.encode_time(codec.now())

        def write(g: Traversal) -> None:
            for task in tasks:
                g.V().has("incident_task", task.id).drop().iterate()
                g.V().has("task_id", task.id).out("has_attempt").drop().iterate()
                g.V().has("task_id", task.id).drop().iterate()
                get_or_add(g, "tomb_task", task.id, "archived_task", {
                    "tomb_task": task.id, "tomb_where": where, "tomb_at": at}).iterate()
            # a workflow whose last members went: its vertex too
            for wf in sorted({t.workflow for t in tasks if t.workflow is not None}):
                if not g.V().has("task_wf", wf).limit(1).to_list():
                    g.V().has("wf_id", wf).drop().iterate()
        self.graph.write(write)

    def tombstone(self, task_id: str) -> Tombstone | None:
        rows = self.graph.read(
            lambda g: g.V().has("tomb_task", task_id).element_map().to_list())
        if not rows:
            return None
        return Tombstone(rows[0]["tomb_task"], rows[0]["tomb_where"], rows[0]["tomb_at"])
