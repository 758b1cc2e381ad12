"""The format vertex: what store format a graph is written in, and where an interrupted
migration step resumes (see :mod:`runner.store.migrations`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gremlin_python.process.graph_traversal import __
from gremlin_python.process.traversal import Cardinality

from runner import __version__
from runner.store import codec
from runner.store.graph import Graph
from runner.store.gremlin.steps import add_vertex, set_props

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
    #: the graph holds no vertex at all (and so no format vertex either)
    empty: bool = False


def read_state(graph: Graph) -> FormatState:
    """The graph's format (one index lookup; a second read when there is no format vertex)."""
    rows = graph.read(lambda g: g.V().has(FORMAT_KEY, FORMAT_KEY_VALUE)
                      .element_map().to_list())
    if rows:
        row = rows[0]
        cursor_version, _, cursor = str(row.get("format_cursor") or "0:0").partition(":")
        return FormatState(int(row["format_version"]), int(cursor_version), int(cursor or 0))
    empty = not graph.read(lambda g: g.V().limit(1).id_().to_list())
    return FormatState(None, empty=empty)


def stamp(graph: Graph, version: int) -> None:
    """Write ``version`` into the format vertex (created when missing, in the same traversal)
    and clear its cursor."""
    props = {"format_version": version, "format_cursor": "",
             "format_at": codec.encode_time(codec.now()), "format_by": __version__}
    graph.write(lambda g: set_props(
        g.V().has(FORMAT_KEY, FORMAT_KEY_VALUE).fold()
        .coalesce(__.unfold(), add_vertex(__, FORMAT_LABEL, {FORMAT_KEY: FORMAT_KEY_VALUE})),
        props).iterate())


def cursor_traversal(g: Any, version: int, next_id: int) -> Any:
    """The traversal that records where step ``version`` resumes (written with its page)."""
    return g.V().has(FORMAT_KEY, FORMAT_KEY_VALUE).property(
        Cardinality.single, "format_cursor", f"{version}:{next_id}")
