"""Properties written the cheap way on the embedded graph: a vertex property of single
cardinality replaced in place (gremlite's ``property(single, key, value)`` on a vertex that has
the key, in two statements instead of six), and the properties of a vertex just added given
list cardinality (:func:`fresh_props_listed`: no lookup of earlier values it cannot have).

gremlite keeps a vertex property as a row of its ``quads`` table (vertex, name, value, the
property's element id) and an element id in ``graphelts``. Its replace reads the vertex's
values of the key (one query, then the old value's string looked up to compare it), deletes
the old element id, takes a new one, looks the new value up (adding it to the strings), and
updates the row: six statements and two string lookups per property. A claim and an end change
about ten properties in all, and a profile of the embedded drain had gremlite's property
replaces as the largest part of the nodes' CPU (a scratch probe of batched claims and ends:
250-275 tasks/s with gremlite's replace, 506-519 with this one).

Here the row is found by the ``sp`` index (vertex, name) and its value column updated where
it differs: the value looked up or added once, the property keeping its element id. What a
read gives back is the same: the value, by name, found by ``has(key, value)`` through the
same index. Only the property's element id, which the store never reads, stays the old one
(TinkerPop leaves it to the graph). Anything else (list or set cardinality, an edge, a key
the strings table does not hold yet, a value gremlite cannot encode) goes to gremlite's own.

Installed once per process by :func:`lean_replace` when the embedded graph opens a
connection; a gremlite whose internals differ (another minor version) keeps its own replace,
and says so in the log.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from gremlin_python.process.traversal import Bytecode, Cardinality

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


def _lean(own: Any, qt: Any) -> Any:
    from gremlin_python.process.traversal import Cardinality
    from gremlin_python.structure import graph

    def set_property(self: Any, obj: Any, prop_name: str, prop_value: Any,
                     cardinality: Any = Cardinality.single) -> Any:
        if cardinality is not Cardinality.single or not isinstance(obj, graph.Vertex):
            return own(self, obj, prop_name, prop_value, cardinality)
        con = self.con
        name_id = qt.string_to_id(con, prop_name)
        if name_id is None:  # no vertex has the key yet
            return own(self, obj, prop_name, prop_value, cardinality)
        cur = con.cursor()
        try:
            row = cur.execute("SELECT o, g FROM quads WHERE s = ? AND p = ? LIMIT 1",
                              [obj.id, name_id]).fetchone()
            if row is None:  # this vertex does not have it: a new property
                return qt.create_vertex_property(con, obj.id, prop_name, prop_value)
            code = qt.encode_property_value(con, prop_value, merge=True)
            if code is None:  # beyond what gremlite encodes: its own way says so
                return own(self, obj, prop_name, prop_value, cardinality)
            if code != row[0]:
                cur.execute("UPDATE quads SET o = ? WHERE g = ?", [code, row[1]])
            return None
        finally:
            cur.close()

    return set_property


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
