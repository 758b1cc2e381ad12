"""The format vertex: what store format a graph is written in, and where an interrupted
migration step resumes (see :mod:`runner.store.migrations`). Below both the shared Gremlin
layer (which reads the vertex's key) and the migrations (which write it): plain traversals of
its own, so neither imports the other."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gremlin_python.process.graph_traversal import __
from gremlin_python.process.traversal import Cardinality

from runner import __version__
from runner.store import codec
from runner.store.api import Graph
from runner.store.traversal import Traversal

FORMAT_LABEL = "latchwork_format"
FORMAT_KEY = "format_key"
FORMAT_KEY_VALUE = "latchwork"


@dataclass(frozen=True)
class FormatState:
    """``version`` None: no format vertex (format 0, or a brand-new graph when ``empty``)."""

    version: int | None
    #: where the step of ``cursor_version`` resumes (a vertex id); 0: from the start
    cursor_version: int = 0
    cursor: int = 0
    #: the graph holds no vertex but, at most, format vertices still being written
    empty: bool = False


#: how long a format vertex found without its version is read again (another store is
#: stamping it: a graph without transactions shows the vertex before its properties)
STAMP_WAIT = 2.0


def read_state(graph: Graph) -> FormatState:
    """The graph's format (one index lookup; two more reads when there is no format vertex).

    Several stores may open one brand-new graph at once (the nodes of a cluster started
    together), each stamping it (:func:`stamp`, an upsert). So a graph found without a format
    vertex is empty when it holds no other vertex (one being stamped may hold the format
    vertex without its key yet); one that is not is looked up again (the others' vertices may
    have come after their format vertex); a format vertex without its version yet is read
    again for up to :data:`STAMP_WAIT` seconds. Only then is the graph at format 0."""
    rows = _format_rows(graph)
    if not rows:  # empty: no vertex but (half-written) format vertices
        if not graph.read(lambda g: g.V().not_(__.has_label(FORMAT_LABEL)).limit(1).id_()
                          .to_list()):
            return FormatState(None, empty=True)
        rows = _format_rows(graph)  # stamped by another store since the first lookup?
        if not rows:
            return FormatState(None)
    row = rows[0]
    end = time.monotonic() + STAMP_WAIT
    while "format_version" not in row and time.monotonic() < end:
        time.sleep(0.05)
        row = next(iter(_format_rows(graph)), row)  # (a graph cleared meanwhile: as it was)
    if "format_version" not in row:
        return FormatState(None)  # a stamp that never finished: as old as no stamp at all
    cursor_version, _, cursor = str(row.get("format_cursor") or "0:0").partition(":")
    return FormatState(int(row["format_version"]), int(cursor_version), int(cursor or 0))


def _format_rows(graph: Graph) -> list[dict[Any, Any]]:
    return list(graph.read(lambda g: g.V().has(FORMAT_KEY, FORMAT_KEY_VALUE)
                           .element_map().to_list()))


def stamp(graph: Graph, version: int) -> None:
    """Write ``version`` into the format vertex (created when missing, in the same traversal)
    and clear its cursor."""
    props = {"format_version": version, "format_cursor": "",
             "format_at": codec.encode_time(codec.now()), "format_by": __version__}
    def write(g: Traversal) -> None:
        t = g.V().has(FORMAT_KEY, FORMAT_KEY_VALUE).fold().coalesce(
            __.unfold(), __.add_v(FORMAT_LABEL).property(FORMAT_KEY, FORMAT_KEY_VALUE))
        for key, value in props.items():
            t = t.property(Cardinality.single, key, value)
        t.iterate()
    graph.write(write)


def cursor_traversal(g: Traversal, version: int, next_id: int) -> Traversal:
    """The traversal that records where step ``version`` resumes (written with its page)."""
    t: Traversal = g.V().has(FORMAT_KEY, FORMAT_KEY_VALUE).property(
        Cardinality.single, "format_cursor", f"{version}:{next_id}")
    return t
