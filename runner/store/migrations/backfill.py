"""The kind of step most format changes are: properties added to existing tasks.

A step computes its properties from the task's row as the graph holds it (an element map) with
code frozen in the step's own module, and writes them with the one plain property writer here
(:func:`write_props`: ``property(single, key, value)`` per key): nothing of today's row mappers
or write algebra, so what a step writes never changes with later code."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gremlin_python.process.graph_traversal import __
from gremlin_python.process.traversal import Cardinality

from runner.store.api import Graph
from runner.store.format import cursor_traversal
from runner.store.traversal import Row, Traversal

#: (done, total) of the step running
StepProgress = Callable[[int, int], None]


def write_props(t: Traversal, props: Mapping[str, str]) -> Traversal:
    """``props`` set on what ``t`` stands on, each with single cardinality: the writer of
    every backfill step, frozen (a change here changes what old steps write)."""
    for key, value in props.items():
        t = t.property(Cardinality.single, key, value)
    return t


@dataclass(frozen=True)
class TaskBackfill:
    """Adds properties to every readable task that lacks ``marker`` (one of them):
    ``compute(row)`` gives them from the task's element map. Walks the graph in pages:

    * embedded (gremlite): windows of vertex ids (index lookups, in id order) up to the highest
      id; each page's changes and the cursor (the next id) in one transaction;
    * remote: one walk over the tasks for the vertex ids of those still lacking ``marker``
      (``has(task_id).has(task_state).not(has(marker))``: the predicate is the cursor of a run
      killed half-way), then ``page`` of them at a time by id, written as traversals of at most
      :data:`REMOTE_CHUNK` tasks (a task's change a ``sideEffect``, so a frame stays small).
    """

    version: int
    marker: str
    compute: Callable[[Row], dict[str, str]]

    def _needs(self, t: Traversal) -> Traversal:
        return t.not_(__.has(self.marker))

    def run(self, graph: Graph, start: int, page: int, progress: StepProgress,
            dry_run: bool) -> tuple[int, int]:
        bound = getattr(graph, "element_id_bound", None)
        if bound is not None:
            return self._windows(graph, max(1, start), page, int(bound()), progress, dry_run)
        return self._remote(graph, page, progress, dry_run)

    def _changes(self, rows: list[Row]) -> tuple[list[tuple[str, dict[str, str]]], int]:
        changes, unreadable = [], 0
        for row in rows:
            if "task_state" not in row:
                unreadable += 1
                continue
            changes.append((str(row["task_id"]), self.compute(row)))
        return changes, unreadable

    def _windows(self, graph: Graph, start: int, page: int, top: int, progress: StepProgress,
                 dry_run: bool) -> tuple[int, int]:
        changed = unreadable = 0
        window = max(page, 64)
        while start <= top:
            end = min(start + window, top + 1)
            def read(g: Traversal, ids: range = range(start, end)) -> list[Row]:
                return list(self._needs(g.V(*ids).has("task_id")).element_map().to_list())
            changes, bad = self._changes(graph.read(read))
            if not dry_run:
                def write(g: Traversal, changes: list[tuple[str, dict[str, str]]] = changes,
                          cursor: int = end) -> None:
                    for task_id, props in changes:
                        write_props(self._needs(g.V().has("task_id", task_id)), props).iterate()
                    cursor_traversal(g, self.version, cursor).iterate()
                graph.write(write)
            changed += len(changes)
            unreadable += bad
            start = end
            progress(min(start, top), top)
        return changed, unreadable

    def _remote(self, graph: Graph, page: int, progress: StepProgress,
                dry_run: bool) -> tuple[int, int]:
        def lacking(g: Traversal) -> Traversal:
            return self._needs(g.V().has("task_id").has("task_state"))
        # one walk over the tasks for the ids of those still lacking the change (a keyset of
        # the predicate would walk them again for every page); then pages by id lookups
        ids = list(graph.read(lambda g: lacking(g).id_().to_list()))
        unreadable = int(graph.read(lambda g: g.V().has("task_id")
                                    .not_(__.has("task_state")).count().next()))
        total = len(ids)
        if dry_run:
            progress(total, total)
            return total, unreadable
        changed = 0
        for at in range(0, total, page):
            window = ids[at:at + page]
            def read(g: Traversal, window: list[object] = window) -> list[Row]:
                return list(self._needs(g.V(*window)).element_map().to_list())
            changes, _ = self._changes(graph.read(read))
            for c in range(0, len(changes), REMOTE_CHUNK):
                chunk = changes[c:c + REMOTE_CHUNK]

                def write(g: Traversal, chunk: list[tuple[str, dict[str, str]]] = chunk) -> None:
                    t = g.V().has("task_id", chunk[0][0])  # one traverser to hang them on
                    for task_id, props in chunk:
                        t = t.side_effect(write_props(self._needs(
                            __.V().has("task_id", task_id)), props))
                    t.iterate()
                graph.write(write)
                changed += len(chunk)
            progress(min(at + page, total), total)
        return changed, unreadable


#: tasks per traversal on a remote graph (a change is about 10 steps: within gremlite's and a
#: server's frame limits with room to spare)
REMOTE_CHUNK = 40
