"""Properties written the cheap way on the embedded graph: a vertex property of single
cardinality replaced in place (gremlite's ``property(single, key, value)`` on a vertex that has
the key, in one statement instead of six), and the properties of a vertex just added given
list cardinality (:func:`fresh_props_listed`: no lookup of earlier values it cannot have).

gremlite keeps a vertex property as a row of its ``quads`` table (vertex, name, value, the
property's element id) and an element id in ``graphelts``. Its replace reads the vertex's
values of the key (one query, then the old value's string looked up to compare it), deletes
the old element id, takes a new one, looks the new value up (adding it to the strings), and
updates the row: six statements and two string lookups per property. A claim and an end change
about ten properties in all, and a profile of the embedded drain had gremlite's property
replaces as the largest part of the nodes' CPU (a scratch probe of batched claims and ends:
250-275 tasks/s with gremlite's replace, 506-519 with this one).

Here the row is found by the ``sp`` index (vertex, name) and its value column updated
(:func:`set_single`): the value looked up or added once, the property keeping its element id. What a
read gives back is the same: the value, by name, found by ``has(key, value)`` through the
same index. Only the property's element id, which the store never reads, stays the old one
(TinkerPop leaves it to the graph). Anything else (list or set cardinality, an edge, a value
gremlite cannot encode) goes to gremlite's own.

Installed once per process by :func:`lean_replace` when the embedded graph opens a
connection; a gremlite whose internals differ (another minor version) keeps its own replace,
and says so in the log.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from types import ModuleType
from typing import Any

from gremlin_python.process.traversal import Bytecode, Cardinality

from runner.store.embedded import schema

log = logging.getLogger("latchwork.store")

_LOCK = threading.Lock()


def lean_replace() -> None:
    """Put the replace in place (:func:`_lean`) instead of gremlite's ``Result.set_property``
    (once per process)."""
    from gremlite import querytools, results

    with _LOCK:
        if getattr(results.Result, "_latchwork_lean", False):
            return
        own = getattr(results.Result, "set_property", None)
        needed = ("string_to_id", "encode_property_value", "create_vertex_property")
        if own is None or not all(hasattr(querytools, name) for name in needed):
            log.warning("gremlite's internals are not the ones this replace was written for: "
                        "properties are replaced gremlite's own way")
            results.Result._latchwork_lean = True
            return
        results.Result.set_property = _lean(own, querytools)
        results.Result._latchwork_own = own  # gremlite's, for the test that compares the two
        results.Result._latchwork_lean = True


def _lean(own: Any, qt: ModuleType) -> Any:
    from gremlin_python.process.traversal import Cardinality
    from gremlin_python.structure import graph

    def set_property(self: Any, obj: Any, prop_name: str, prop_value: Any,
                     cardinality: Any = Cardinality.single) -> Any:
        if cardinality is not Cardinality.single or not isinstance(obj, graph.Vertex):
            return own(self, obj, prop_name, prop_value, cardinality)
        if not set_single(self.con, qt, obj.id, prop_name, prop_value):
            return own(self, obj, prop_name, prop_value, cardinality)  # it says why
        return None

    return set_property


def set_single(con: sqlite3.Connection, qt: ModuleType, vertex: int, key: str, value: Any) -> bool:
    """``key`` set to ``value`` on ``vertex`` with single cardinality, gremlite's own table rows:
    the row found by the ``sp`` index and its value updated in place (the property keeps its
    element id), or the property created as gremlite creates one when the vertex has none.
    False, nothing written, for a value gremlite does not encode (its own way says why). Both
    the lean replace here and the embedded graph's writes as SQL
    (:mod:`runner.store.embedded.direct`) set properties this way."""
    code = qt.encode_property_value(con, value, merge=True)
    if code is None:
        return False
    name = qt.merge_string(con, key)
    cur = con.cursor()
    try:
        # +g: SQLite would otherwise plan it on the pg index (every row of that name)
        cur.execute(schema.UPDATE_VALUE, [code, vertex, name])
        if cur.rowcount == 0:  # this vertex does not have it: a new property
            qt.create_vertex_property(con, vertex, key, value)
    finally:
        cur.close()
    return True


def fresh_props_listed(bytecode: Bytecode) -> Bytecode:
    """``bytecode`` with the ``property(key, value)`` steps that directly follow an ``addV``
    (nested traversals too) given list cardinality, for gremlite. A vertex just added has no
    values yet, so the result is the same; but gremlite looks a single property's earlier
    values up first (one SQL query each: 30% of writing a new task and its attempt), a list
    property's not. Other graphs get the steps as written (list cardinality is not portable).
    ``bytecode`` is changed in place; a second pass changes nothing more."""
    fresh = False
    steps = bytecode.step_instructions
    for n, step in enumerate(steps):
        name = step[0]
        if name == "property" and fresh and len(step) == 3 and isinstance(step[1], str):
            steps[n] = [name, Cardinality.list_, step[1], step[2]]
            continue
        fresh = name == "addV"
        for arg in step[1:]:
            inner = getattr(arg, "bytecode", arg)
            if isinstance(inner, Bytecode):
                fresh_props_listed(inner)
    return bytecode
