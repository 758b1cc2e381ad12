"""A guarded write applied to the embedded graph's tables by SQL, not interpreted as a traversal.

gremlite runs a traversal by compiling each step into a chain of Python producers and then
pulling traversers through them, one SQL query per step and per lookup: a profile of the
embedded drain had gremlite at 58% of the nodes' samples, a claim's and an end's batches
compiled (16%) and interpreted step by step. The task loop's writes are a small algebra
(:class:`~runner.store.gremlin.guards.Write`): guards (``V().has(k, v)...``, each standing on
one vertex), properties set with single cardinality on a guarded vertex, a vertex added with
its properties and an edge to it from a guarded vertex; and a new task written claimed
(:meth:`~runner.store.Store.create_claimed`): a vertex of its own, its attempt with an
edge from it, after a guard that no task has its id yet (``absent``, a redelivered
submit's). Here a write's data form
(``Write.plan``) is applied with the statements gremlite itself would end up running, in the
transaction of the graph's write:

* a guard: one query over the ``ops`` index (``o``, ``p``, ``s``), a join per further pair
  over ``sp``; its values encoded by gremlite's own encoder (the connection's kept strings,
  :mod:`runner.store.embedded.strings`); a value gremlite has no string for matches nothing, as in
  gremlite;
* a property set: one ``UPDATE`` of the vertex's row by ``sp`` (its value looked up or added
  once), or the property created as gremlite creates one when the vertex has none (what
  :mod:`runner.store.embedded.replace` does inside gremlite's step);
* a vertex, its properties and its edge: the rows gremlite's ``create_vertex``,
  ``create_vertex_property`` and ``create_edge`` make, in four statements (:func:`_created`).

The ops: ``("guard", name, pairs)``, ``("absent", "", pairs)`` (no vertex may match),
``("set", name, props)``, ``("add", label, props, edge, from_name)``, ``("new", label,
props, name)`` (a vertex with no edge, named for the ops after it) and ``("edge", label, {},
from_name, to_name)`` (an edge between two guarded vertices: a workflow's ``depends_on``).

What a read gives back afterwards is what the traversal would have left (the contract suite
runs the store's writes both ways: ``tests/test_store_direct.py``). A write this cannot apply as
gremlite would answers None, and the caller writes its traversal instead, in the same
transaction: a guard that matches several vertices (the traversal would make its changes once
per combination), a value of a type gremlite does not encode as written here.

Nothing here begins or ends a transaction: the caller's write holds it (a failed statement
rolls the whole write back). Guards are all evaluated before the first change, as in the
traversal, so a write whose guards match nothing changed nothing.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from runner.store.embedded import schema
from runner.store.embedded.replace import set_single
from runner.store.embedded.strings import string_ids
from runner.store.gremlin.plans import Op
from runner.store.traversal import PropValue

#: the property values applied here: gremlite's plain encodings (a float is a string's id)
_PLAIN = (str, bool, int, type(None))
_MIN_INT, _MAX_INT = -2**62, 2**62 - 1
#: the ops that find vertices (their pairs third): ``guard`` must match, ``absent`` must not
_FINDS = ("guard", "absent")


def plain(plan: Sequence[Op]) -> bool:
    """Whether every value of ``plan`` (guards and changes) is one :func:`apply` writes as
    gremlite would: a string, a bool, None, or an integer in gremlite's range."""
    for op in plan:
        values = [v for _, v in op[2]] if op[0] in _FINDS else list(op[2].values())
        for value in values:
            if value.__class__ not in _PLAIN:
                return False
            if value.__class__ is int and not _MIN_INT <= value <= _MAX_INT:
                return False
    return True


def apply(con: sqlite3.Connection, plan: Sequence[Op]) -> bool | None:
    """Apply one write's ``plan`` on ``con`` (the embedded graph's connection, inside its write
    transaction): True written, False its guards matched nothing (nothing written), None not
    applied (see the module: the caller writes it as a traversal)."""
    from gremlite import querytools as qt

    if not plain(plan):
        return None
    cur = con.cursor()
    try:
        at: dict[str, int] = {}
        for op in plan:
            if op[0] not in _FINDS:
                continue
            found = _vertices(cur, con, qt, op[2])
            if op[0] == "absent":
                if found:
                    return False
                continue
            if not found:
                return False
            if len(found) > 1:
                return None
            at[op[1]] = found[0]
        for op in plan:
            if op[0] == "set":
                for key, value in op[2].items():  # plain values: each one gremlite encodes
                    set_single(con, qt, at[op[1]], key, value)
            elif op[0] == "add":
                _created(cur, con, op[1], op[2], (op[3], at[op[4]]))
            elif op[0] == "new":
                at[op[3]] = _created(cur, con, op[1], op[2], None)
            elif op[0] == "edge":
                _edge(cur, con, op[1], at[op[3]], at[op[4]])
        return True
    finally:
        cur.close()


def _vertices(cur: sqlite3.Cursor, con: sqlite3.Connection, qt: ModuleType,
              pairs: Sequence[tuple[str, object]]) -> list[int]:
    """The vertices (two at most) that have every ``(key, value)`` of ``pairs``."""
    codes: list[int] = []
    for key, value in pairs:
        name = qt.string_to_id(con, key)
        code = None if name is None else qt.encode_property_value(con, value)
        if code is None:  # a name or a string no vertex has
            return []
        codes += [name, code]
    rows = cur.execute(schema.vertices_with(len(pairs)), [*codes[2:], *codes[:2]]).fetchall()
    return [row[0] for row in rows]


def _created(cur: sqlite3.Cursor, con: sqlite3.Connection, label: str, props: Any,
             edge: tuple[str, int] | None) -> int:
    """A vertex ``label`` with ``props`` (and ``edge``: an edge of that label to it from that
    vertex) as gremlite's ``create_vertex``, ``create_vertex_property`` and ``create_edge``
    make them, in four statements instead of three or four per property: their element ids
    taken at once, in gremlite's order (the vertex, each property, the edge); the strings
    looked up and added at once (:func:`~runner.store.embedded.strings.string_ids`); the rows in one
    ``executemany``. The new vertex's id."""
    count = 2 + len(props) if edge is not None else 1 + len(props)
    ids = sorted(i for (i,) in cur.execute(schema.new_elements(count)))
    strings = string_ids(con, [label, *props, *(v for v in props.values() if v.__class__ is str),
                               *((edge[0],) if edge is not None else ())], add=True)
    vertex = ids[0]
    rows = [(vertex, 0, strings[label], 0)]  # gremlite's label row: p 0, g 0
    for (key, value), prop in zip(props.items(), ids[1:], strict=False):
        code = (strings[value] if value.__class__ is str else
                2 if value is None else int(value) if value.__class__ is bool else
                value + _MIN_INT)
        rows.append((vertex, strings[key], code, prop))
    if edge is not None:
        rows.append((edge[1], -strings[edge[0]], vertex, -ids[-1]))
    cur.executemany(schema.INSERT_QUAD, rows)
    return int(vertex)


def _edge(cur: sqlite3.Cursor, con: sqlite3.Connection, label: str, source: int,
          target: int) -> None:
    """An edge ``label`` from vertex ``source`` to vertex ``target``, as gremlite's
    ``create_edge`` makes it: a new element id, one row (from, -label, to, -element)."""
    (element,) = [i for (i,) in cur.execute(schema.new_elements(1))]
    strings = string_ids(con, [label], add=True)
    cur.execute(schema.INSERT_QUAD, (source, -strings[label], target, -element))


def having(con: sqlite3.Connection, key: str, values: Sequence[str], limit: int,
           where: tuple[str, Sequence[str]] | None = None) -> list[int]:
    """Up to ``limit`` vertices whose ``key`` is one of the strings ``values`` (and, ``where``,
    whose other property is one of its strings): one query over the ``ops`` index, as gremlite's
    ``V().has(key, within(values)).has(...).limit(limit)`` finds them, in no particular order."""
    from gremlite import querytools as qt

    name = qt.string_to_id(con, key)
    codes = list(string_ids(con, values).values())
    if name is None or not codes:
        return []
    args: list[Any] = []
    allowed_count = None
    if where is not None:
        other = qt.string_to_id(con, where[0])
        allowed = list(string_ids(con, where[1]).values())
        if other is None or not allowed:
            return []
        allowed_count = len(allowed)
        args += [other, *allowed]
    rows = con.cursor().execute(schema.vertices_having(len(codes), allowed_count),
                                [*args, name, *codes, limit]).fetchall()
    return [row[0] for row in rows]


def rows(con: sqlite3.Connection, vertices: Sequence[int], keys: Sequence[str]
         ) -> list[dict[str, PropValue]]:
    """The properties ``keys`` of each of ``vertices`` (those it has), in their order, decoded
    as gremlite decodes them: what ``element_map(*keys)`` gives, without the id and label."""
    from gremlite import querytools as qt

    names = {i: key for key in keys if (i := qt.string_to_id(con, key)) is not None}
    if not vertices or not names:
        return [{} for _ in vertices]
    found = con.cursor().execute(schema.properties_of(len(vertices), len(names)),
                                 [*vertices, *names]).fetchall()
    strings = _strings(con, {o for _, _, o in found if 2 < o <= _MAX_INT})
    out: dict[int, dict[str, PropValue]] = {v: {} for v in vertices}
    for s, p, o in found:
        row = out[s]
        if names[p] in row:  # a second value (list cardinality): element_map shows the first
            continue
        if o > _MAX_INT:
            row[names[p]] = float(qt.id_to_string(con, o - _MAX_INT))
        elif o > 2:
            row[names[p]] = strings[o]
        else:
            row[names[p]] = o - _MIN_INT if o < 0 else (False, True, None)[o]
    return [out[v] for v in vertices]


def _strings(con: sqlite3.Connection, ids: set[int]) -> dict[int, str]:
    """The strings of ``ids``: the connection's kept ones, the others in one query a few
    hundred at a time (not kept: mostly one task's values, a state, a payload)."""
    kept = getattr(con, "by_id", {})
    out = {i: kept[i] for i in ids if i in kept}
    left = [i for i in ids if i not in out]
    for first in range(0, len(left), 500):
        part = left[first:first + 500]
        out.update(con.cursor().execute(schema.strings_by_id(len(part)), part).fetchall())
    return out


def values_of(con: sqlite3.Connection, key: str, value: str, wanted: str) -> set[str]:
    """The distinct string values of ``wanted`` on the vertices whose ``key`` is ``value``
    (what a traversal of those values would give, without repeats; strings only): one query,
    whatever number of vertices share them."""
    from gremlite import querytools as qt

    name, code, other = (qt.string_to_id(con, x) for x in (key, value, wanted))
    if name is None or code is None or other is None:
        return set()
    found = con.cursor().execute(schema.VALUES_OF, [other, name, code]).fetchall()
    return set(_strings(con, {o for (o,) in found if 2 < o <= _MAX_INT}).values())


def into(con: sqlite3.Connection, key: str, values: Sequence[str], label: str
         ) -> list[tuple[str, int]]:
    """For each vertex whose ``key`` is one of ``values``: the sources of its ``label``
    edges, as ``(value, source vertex)`` (a workflow member's dependants: ``depends_on``
    edges point from a dependant to it)."""
    from gremlite import querytools as qt

    label_id = qt.string_to_id(con, label)
    if label_id is None:  # no such edge anywhere
        return []
    cur = con.cursor()
    try:
        out = []
        for value in dict.fromkeys(values):
            for target in _vertices(cur, con, qt, [(key, value)]):
                out += [(value, int(s)) for (s,) in cur.execute(schema.EDGES_INTO,
                                                                (target, -label_id))]
        return out
    finally:
        cur.close()


class SqlPlans:
    """:class:`~runner.store.gremlin.plans.Plans` on one SQLite connection (inside the
    transaction its graph holds)."""

    def __init__(self, con: sqlite3.Connection) -> None:
        self.con = con

    def apply(self, plan: Sequence[Op]) -> bool | None:
        return apply(self.con, plan)

    def having(self, key: str, values: Sequence[str], limit: int,
               where: tuple[str, list[str]] | None = None) -> list[int]:
        return having(self.con, key, values, limit, where)

    def rows(self, vertices: Sequence[int], keys: Sequence[str]) -> list[dict[str, PropValue]]:
        return rows(self.con, vertices, keys)

    def values_of(self, key: str, value: str, wanted: str) -> set[str]:
        return values_of(self.con, key, value, wanted)

    def into(self, key: str, values: Sequence[str], label: str) -> list[tuple[str, int]]:
        return into(self.con, key, values, label)
