"""A guarded write applied to the embedded graph's tables by SQL, not interpreted as a traversal.

gremlite runs a traversal by compiling each step into a chain of Python producers and then
pulling traversers through them, one SQL query per step and per lookup: a profile of the
embedded drain had gremlite at 58% of the nodes' samples, a claim's and an end's batches
compiled (16%) and interpreted step by step. The task loop's writes are a small algebra
(:class:`~runner.store.gremlin.guards.Write`): guards (``V().has(k, v)...``, each standing on
one vertex), properties set with single cardinality on a guarded vertex, a vertex added with
its properties and an edge to it from a guarded vertex. Here a write's data form
(``Write.plan``) is applied with the statements gremlite itself would end up running, in the
transaction of the graph's write:

* a guard: one query over the ``ops`` index (``o``, ``p``, ``s``), a join per further pair
  over ``sp``; its values encoded by gremlite's own encoder (the connection's kept strings,
  :mod:`runner.store.strings`); a value gremlite has no string for matches nothing, as in
  gremlite;
* a property set: one ``UPDATE`` of the vertex's row by ``sp`` (its value looked up or added
  once), or the property created as gremlite creates one when the vertex has none (what
  :mod:`runner.store.replace` does inside gremlite's step);
* a vertex, its properties and its edge: gremlite's own ``create_vertex``,
  ``create_vertex_property`` and ``create_edge``.

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

from collections.abc import Sequence
from typing import Any

#: the property values applied here: gremlite's plain encodings (a float is a string's id)
_PLAIN = (str, bool, int, type(None))
_MIN_INT, _MAX_INT = -2**62, 2**62 - 1


def plain(plan: Sequence[tuple[Any, ...]]) -> bool:
    """Whether every value of ``plan`` (guards and changes) is one :func:`apply` writes as
    gremlite would: a string, a bool, None, or an integer in gremlite's range."""
    for op in plan:
        if op[0] == "guard":
            values = [v for _, v in op[2]]
        elif op[0] == "set":
            values = list(op[2].values())
        else:
            values = list(op[2].values())
        for value in values:
            if value.__class__ not in _PLAIN:
                return False
            if value.__class__ is int and not _MIN_INT <= value <= _MAX_INT:
                return False
    return True


def apply(con: Any, plan: Sequence[tuple[Any, ...]]) -> bool | None:
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
            if op[0] != "guard":
                continue
            found = _vertices(cur, con, qt, op[2])
            if not found:
                return False
            if len(found) > 1:
                return None
            at[op[1]] = found[0]
        for op in plan:
            if op[0] == "set":
                _set(cur, con, qt, at[op[1]], op[2])
            elif op[0] == "add":
                _, label, props, edge, source = op
                vertex = qt.create_vertex(con, label)
                for key, value in props.items():
                    qt.create_vertex_property(con, vertex, key, value)
                qt.create_edge(con, at[source], edge, vertex)
        return True
    finally:
        cur.close()


def _vertices(cur: Any, con: Any, qt: Any, pairs: Sequence[tuple[str, Any]]) -> list[int]:
    """The vertices (two at most) that have every ``(key, value)`` of ``pairs``."""
    codes: list[int] = []
    for key, value in pairs:
        name = qt.string_to_id(con, key)
        code = None if name is None else qt.encode_property_value(con, value)
        if code is None:  # a name or a string no vertex has
            return []
        codes += [name, code]
    joins = "".join(f" JOIN quads q{n} ON q{n}.s = q0.s AND q{n}.p = ? AND q{n}.o = ?"
                    for n in range(1, len(pairs)))
    rows = cur.execute(f"SELECT DISTINCT q0.s FROM quads q0{joins} "
                       f"WHERE q0.p = ? AND q0.o = ? AND +q0.g > 0 LIMIT 2",
                       [*codes[2:], *codes[:2]]).fetchall()
    return [row[0] for row in rows]


def _set(cur: Any, con: Any, qt: Any, vertex: int, props: Any) -> None:
    """``props`` set on ``vertex`` with single cardinality (its row's value replaced in place,
    or the property created)."""
    for key, value in props.items():
        name = qt.merge_string(con, key)
        code = qt.encode_property_value(con, value, merge=True)
        cur.execute("UPDATE quads SET o = ? WHERE s = ? AND p = ? AND +g > 0",
                    [code, vertex, name])
        if cur.rowcount == 0:
            qt.create_vertex_property(con, vertex, key, value)
