"""What a workflow member's success (or skip) does to its dependants: each one's ``pending``
count less the number of them it depends on, as changes guarded by the dependant's version, to
be written in the same write as the end (:mod:`.workflows`, :mod:`.batch`); and what a
member's stop does: its workflow's ``on_failure`` step starts (:func:`on_failure`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gremlin_python.process.graph_traversal import __

from runner.store.api import Graph
from runner.store.gremlin.plans import Plans
from runner.store.gremlin.rows import TASK_ROW, task_from_row
from runner.store.gremlin.steps import any_of
from runner.store.gremlin.writes import TaskChange, task_change
from runner.store.model import Task
from runner.store.traversal import Row, Traversal

#: the edge from a dependant to a member it depends on
DEPENDS_ON = "depends_on"


def _read(graph: Graph, fn: Callable[[Traversal], list[Row]],
          within: Traversal | None) -> list[Row]:
    """``fn`` as a read of ``graph``, or on ``within`` (a write's own traversal source: what
    it reads is what that write sees)."""
    return fn(within) if within is not None else graph.read(fn)


def dependants_sql(plans: Plans, task_ids: Sequence[str]
                   ) -> tuple[dict[str, Task], dict[str, set[str]]]:
    """:func:`dependants` on the embedded graph, by SQL inside its write (``plans``): the
    edges into each of ``task_ids``, then each dependant's row once."""
    pairs = plans.into("task_id", task_ids, DEPENDS_ON)
    if not pairs:
        return {}, {}
    vertices = sorted({v for _, v in pairs})
    found_rows = plans.rows(vertices, TASK_ROW)
    by_vertex = {v: task_from_row(r) for v, r in zip(vertices, found_rows, strict=True)}
    on: dict[str, set[str]] = {}
    for value, vertex in pairs:
        on.setdefault(by_vertex[vertex].id, set()).add(value)
    return {t.id: t for t in by_vertex.values()}, on


def dependants(graph: Graph, task_ids: Sequence[str], within: Traversal | None = None
               ) -> tuple[dict[str, Task], dict[str, set[str]]]:
    """The dependants of ``task_ids`` (members that depend on them), by id, and for each the
    ones of ``task_ids`` it depends on: one read (``within``: inside a write)."""
    pairs = _read(graph, lambda g: any_of(graph, g, "task_id", list(task_ids)).as_("on")
                  .in_(DEPENDS_ON).project("on", "d").by(__.select("on").values("task_id"))
                  .by(__.values("task_id")).to_list(), within)
    on: dict[str, set[str]] = {}
    for r in pairs:
        on.setdefault(str(r["d"]), set()).add(str(r["on"]))
    if not on:
        return {}, {}
    # each dependant's row once (a join that 64 ending members share: one row, not 64)
    rows = _read(graph, lambda g: any_of(graph, g, "task_id", sorted(on))
                 .element_map(*TASK_ROW).to_list(), within)
    found = {t.id: t for t in map(task_from_row, rows)}
    return found, {k: v for k, v in on.items() if k in found}


def releases(graph: Graph, succeeded: Sequence[str],
             within: Traversal | None = None, plans: Plans | None = None) -> list[TaskChange]:
    """The changes of the dependants of ``succeeded`` (members whose successes are written
    together) that those successes make: each dependant's ``pending`` less the number of them
    it depends on (one change per dependant however many of them it shares), guarded by the
    dependant's version. A dependant already stopped or finished is left alone."""
    if not succeeded:
        return []
    found, on = (dependants_sql(plans, succeeded) if plans is not None
                 else dependants(graph, succeeded, within))
    changes = []
    for task_id, task in sorted(found.items()):
        if task.finished:
            continue
        left = max(0, task.pending - len(on[task_id]))
        changes.append(task_change(task, None, {"pending": left}))
    return changes


def released(changes: Sequence[TaskChange]) -> tuple[Task, ...]:
    """The dependants ``changes`` make claimable."""
    return tuple(c.task for c in changes if c.task.open and c.task.pending == 0
                 and not c.task.awaits_commit)


def on_failure(graph: Graph, workflows: Sequence[str],
               within: Traversal | None = None) -> list[TaskChange]:
    """The changes that start the ``on_failure`` steps of ``workflows`` (one of whose members
    stops now), each guarded by its version: one already started (released by an earlier
    stop) is not found again, so it runs once."""
    if not workflows:
        return []
    rows = _read(graph, lambda g: any_of(graph, g, "task_wfonfail", list(workflows))
                 .element_map(*TASK_ROW).to_list(), within)
    return [task_change(t, None, {"pending": 0}) for t in map(task_from_row, rows)
            if t.open and t.pending]
