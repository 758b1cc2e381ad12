"""Traversal building blocks of the portable subset: chunking bulk writes under gremlite's
recursion limit, property writes with explicit single cardinality, and vertex creation."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from gremlin_python.process.graph_traversal import __
from gremlin_python.process.traversal import Cardinality, P
from gremlin_python.statics import long

from runner.store.api import Graph
from runner.store.model import ASPECT_PATTERN
from runner.store.traversal import Props, Traversal

# gremlite evaluates a traversal recursively, one Python frame per step, so a chained bulk
# traversal must stay well under the interpreter's recursion limit (1000): at most ~400 steps
BATCH = 100  # rows per bulk traversal (at most 4 steps per row)
EDGE_BATCH = 50  # edges per traversal (5 steps each)
ASPECT_NAME = re.compile(ASPECT_PATTERN)
X = TypeVar("X")


def chunks(items: Sequence[X], size: int) -> Iterator[Sequence[X]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


#: the classes ``Bytecode.add_step`` keeps as they are (it converts traversals, dicts, lists,
#: sets and bindings): a step whose arguments are all of these is appended to the bytecode as
#: ``add_step`` would append it, without its per-argument checks (building a claim's or an
#: end's batch through gremlinpython's step methods was 12% of a node's samples under load)
_AS_IS = frozenset({str, int, long, bool, float, type(None), Cardinality})


def _step(t: Traversal, name: str, *args: object) -> Traversal:
    """``t``'s step ``name(*args)``: appended directly when every argument is kept as it is."""
    for arg in args:  # a loop, not all() over a generator: 0.27 against 0.73 us a step
        if arg.__class__ not in _AS_IS:
            step: Callable[..., Traversal] = getattr(t, name)  # gremlinpython's own method
            return step(*args)
    t.bytecode.step_instructions.append([name, *args])
    return t


def set_props(t: Traversal, props: Props) -> Traversal:
    for key, value in props.items():
        t = _step(t, "property", Cardinality.single, key, value)
    return t


def add_vertex(g: Traversal, label: str, props: Props) -> Traversal:
    t = g.add_v(label)
    for key, value in props.items():
        t = _step(t, "property", key, value)
    return t


def has_all(t: Traversal, *pairs: tuple[str, object]) -> Traversal:
    """``t.has(k1, v1).has(k2, v2)...``."""
    for key, value in pairs:
        t = _step(t, "has", key, value)
    return t


def any_of(graph: Graph, g: Traversal, key: str, values: Sequence[object],
           each: int | None = None,
           where: tuple[str, Sequence[object]] | None = None) -> Traversal:
    """The vertices whose ``key`` is one of ``values``, found by index on every graph: one
    ``P.within`` where the graph indexes it (``graph.within_indexed``), else an equality per
    value (TinkerGraph 3.5 scans every vertex for a ``within``, and its cost grew with the
    graph): the first at the traversal's start, the others in a ``union`` after a ``fold``
    that always leaves one traverser, so no vertex has to exist to stand on. ``each``: at most
    that many vertices of each value (a caller that keeps no more in all: the ``fold`` holds
    every vertex of the first value, and a page of ready tasks over a dense second's 1,500
    cost a Gremlin Server twice the server time of one that stops at 64). ``where``: only the
    vertices whose property (not indexed) is one of the values, filtered before ``each``."""
    values = list(dict.fromkeys(values))
    if not values:
        return g.V().has(key, "").limit(0)

    def refined(found: Traversal) -> Traversal:
        if where is not None:
            found = found.has(where[0], P.within(list(where[1])))
        return found
    if graph.within_indexed or len(values) == 1:
        return refined(g.V().has(key, P.within(values) if len(values) > 1 else values[0]))

    def lookup(t: Traversal, value: object) -> Traversal:
        found = refined(t.V().has(key, value))
        return found if each is None else found.limit(each)
    first, *rest = values
    return lookup(g, first).fold().union(__.unfold(), *(lookup(__, v) for v in rest))


def get_or_add(g: Traversal, key: str, value: object, label: str, props: Props) -> Traversal:
    """The vertex whose ``key`` is ``value``, or a new ``label`` vertex with ``props``, in one
    traversal (the caller tells which by a value only a new one has)."""
    return g.V().has(key, value).fold().coalesce(__.unfold(), add_vertex(__, label, props))


