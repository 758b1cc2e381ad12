"""What a workflow member's success (or skip) does to its dependants: each one's ``pending``
count less the number of them it depends on, as changes guarded by the dependant's version, to
be written in the same write as the end (:mod:`.workflows`, :mod:`.batch`); and what a
member's stop does: its workflow's ``on_failure`` step starts (:func:`on_failure`)."""

from __future__ import annotations

from collections.abc import Sequence

from gremlin_python.process.graph_traversal import __

from runner.store.api import Graph
from runner.store.gremlin.rows import TASK_ROW, task_from_row
from runner.store.gremlin.steps import any_of
from runner.store.gremlin.writes import TaskChange, task_change
from runner.store.model import Task

#: the edge from a dependant to a member it depends on
DEPENDS_ON = "depends_on"


def dependants(graph: Graph, task_ids: Sequence[str]) -> tuple[dict[str, Task],
                                                                dict[str, set[str]]]:
    """The dependants of ``task_ids`` (members that depend on them), by id, and for each the
    ones of ``task_ids`` it depends on: one read."""
    rows = graph.read(
        lambda g: any_of(graph, g, "task_id", list(task_ids)).as_("on")
        .in_(DEPENDS_ON).project("on", "row").by(__.select("on").values("task_id"))
        .by(__.element_map(*TASK_ROW)).to_list())
    found: dict[str, Task] = {}
    on: dict[str, set[str]] = {}
    for r in rows:
        task = task_from_row(r["row"])
        found[task.id] = task
        on.setdefault(task.id, set()).add(str(r["on"]))
    return found, on


def releases(graph: Graph, succeeded: Sequence[str]) -> list[TaskChange]:
    """The changes of the dependants of ``succeeded`` (members whose successes are written
    together) that those successes make: each dependant's ``pending`` less the number of them
    it depends on (one change per dependant however many of them it shares), guarded by the
    dependant's version. A dependant already stopped or finished is left alone."""
    if not succeeded:
        return []
    found, on = dependants(graph, succeeded)
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


def on_failure(graph: Graph, workflows: Sequence[str]) -> list[TaskChange]:
    """The changes that start the ``on_failure`` steps of ``workflows`` (one of whose members
    stops now), each guarded by its version: one already started (released by an earlier
    stop) is not found again, so it runs once."""
    if not workflows:
        return []
    rows = graph.read(lambda g: any_of(graph, g, "task_wfonfail", list(workflows))
                      .element_map(*TASK_ROW).to_list())
    return [task_change(t, None, {"pending": 0}) for t in map(task_from_row, rows)
            if t.open and t.pending]
