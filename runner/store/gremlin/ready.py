"""The task loop's reads of the ready buckets (:mod:`runner.store.due`), the
:class:`~runner.store.api.TaskStore` methods :class:`~runner.store.gremlin.tasks.
GremlinTaskStore` hands on: which lanes hold tasks, a page of a lane's ready seconds, and a
lane's every ready second (where a node with no floor starts). On the embedded graph the pages
and the seconds are read by SQL (:mod:`runner.store.embedded.direct`): gremlite's interpretation of
the page's element maps was a fifth of a node's CPU in a drain. Reads only; a graph out of reach
raises ``StoreUnavailable``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gremlin_python.process.graph_traversal import __

from runner.store import due
from runner.store.api import Graph
from runner.store.format import FORMAT_KEY, FORMAT_KEY_VALUE
from runner.store.gremlin.plans import direct_of
from runner.store.gremlin.rows import TASK_ROW, task_from_row
from runner.store.gremlin.steps import any_of, chunks
from runner.store.model import Task
from runner.store.traversal import Row, Traversal

#: ready keys per read where each is its own lookup (a window of an hour is 3,840)
READY_KEYS = 240


def lanes(graph: Graph, among: Sequence[str] | None = None) -> list[str]:
    """The lanes that hold a ready or running task, highest first (one read: a ``limit(1)``
    lookup per lane, in one traversal standing on the format vertex); ``among``: only these
    lanes are looked up (none: no read). A graph without its format vertex (emptied or
    replaced under running nodes: an in-memory server restarted) cannot answer so: every lane
    asked about is said to hold tasks, and the walks of the ready buckets find out (without
    it, no lane was ever walked again and a task that needs a listing never started)."""
    asked = list(due.LANES if among is None else among)
    if not asked:
        return []

    def probe(g: Traversal) -> list[str]:
        branches = [__.V().has("task_lane", lane).limit(1).constant(lane) for lane in asked]
        return list(g.V().has(FORMAT_KEY, FORMAT_KEY_VALUE)
                    .union(__.constant(_ANCHORED), *branches).to_list())
    found = set(graph.read(probe))
    if _ANCHORED not in found:
        found = set(asked)
    return [lane for lane in due.LANES if lane in found]


#: what the lanes' probe answers beside the lanes when its format vertex is there
_ANCHORED = "@format"


def ready_page(graph: Graph, lane: str, seconds: Sequence[str], limit: int,
               shards: Sequence[str] | None = None) -> list[Task]:
    """Up to ``limit`` WAITING tasks of ``lane`` that became ready in one of ``seconds``
    (``YYYYMMDDHHMMSS``): one index lookup, in no particular order; ``shards``: only tasks of
    these shards (``task_shard``: a node's own, :func:`runner.store.due.shards_of`)."""
    where = None if shards is None else ("task_shard", list(shards))
    keys = [due.ready_key(lane, s) for s in seconds]
    direct = direct_of(graph)
    if direct is not None:  # the embedded graph: SQL, not a traversal
        found = direct.run(lambda plans, g: plans.rows(
            plans.having("task_queue", keys, limit, where), TASK_ROW))
        return [task_from_row(row) for row in found]
    # a graph that answers each value by its own lookup gets them a few hundred a read (the
    # traversal's size stays well under a server's 64 KiB request limit)
    rows: list[Row] = []
    for part in chunks(keys, max(1, len(keys)) if graph.within_indexed else READY_KEYS):
        def page(g: Traversal, part: Sequence[str] = part,
                 left: int = limit - len(rows)) -> list[Row]:
            return any_of(graph, g, "task_queue", part, each=left, where=where).limit(left)\
                .element_map(*TASK_ROW).to_list()
        rows += graph.read(page)
        if len(rows) >= limit:
            break
    return [task_from_row(row) for row in rows]


def lane_seconds(graph: Graph, lane: str) -> list[str]:
    """The seconds the WAITING tasks of ``lane`` became ready in (a read of every task's
    queue value in the lane: where a node with no floor starts the lane)."""
    direct = direct_of(graph)
    values: Iterable[str]
    if direct is not None:  # the embedded graph: one query
        values = direct.run(lambda plans, g: plans.values_of("task_lane", lane, "task_queue"))
    else:
        values = graph.read(lambda g: g.V().has("task_lane", lane).values("task_queue")
                            .to_list())
    return sorted({v.split(":", 1)[1] for v in values if due.is_ready_key(v)})
