"""The strings an embedded graph's SQLite connection keeps: gremlite's string lookups through
them.

gremlite stores every property name and string value once, in a table of strings, and reads
each of a row's names and values with a query of its own (an element map of ten properties is
21 queries; a claim and an end of one task looked up 43 names and values, 40% of their
statements, inside the write lock). A connection (``runner.store.embedded.graph._LazyBegin``:
``by_id``, ``by_value``, ``reading``, ``found``) keeps what its reads looked up, and its lookups
and writes use it. A string's id never changes once committed (gremlite never deletes one), so
what a read (a snapshot of committed data) found stays true. What a write found is held apart
(``found``) until its transaction commits, and kept only then: the write may have added the
string itself, and if it rolls back the string is gone and its id may be given to another. A
string a write adds is not kept at all (mostly values of one task: a state, an attempt's id).
Nothing here does I/O of its own; a connection that is not one of ours goes straight to
gremlite.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

from runner.store.embedded import schema

#: strings (property names and values) a connection keeps, by id and by value; past it, it
#: forgets them all and starts again
STRINGS_KEPT = 4096
_KEPT_LOCK = threading.Lock()



class KeptStrings(Protocol):
    """The strings one of the embedded graph's connections keeps (its ``_LazyBegin``)."""
    reading: bool
    by_id: dict[int, str]
    by_value: dict[str, int]
    found: dict[str, int]

def kept_strings() -> None:
    """gremlite's two string lookups, through the connection's kept strings (see
    :class:`_LazyBegin`); once per process."""
    from gremlite import querytools

    with _KEPT_LOCK:
        if not getattr(querytools, "_latchwork_kept", False):
            _wrap_lookups(querytools)
            querytools._latchwork_kept = True


def _wrap_lookups(querytools: Any) -> None:
    def kept(lookup: Callable[[Any, Any], Any], by_id: bool) -> Callable[[Any, Any], Any]:
        """``lookup`` (an id's string, or a string's id) through the kept strings."""
        def find(con: sqlite3.Connection, key: Any) -> Any:
            strings = getattr(con, "by_id" if by_id else "by_value", None)
            if strings is None:  # not one of ours
                return lookup(con, key)
            found = strings.get(key)
            if found is None:
                found = lookup(con, key)
                if found is not None:
                    _found(con, *((key, found) if by_id else (found, key)))
            return found
        return find

    id_to_string = kept(querytools.id_to_string, True)
    string_to_id = kept(querytools.string_to_id, False)
    look_up, merge = querytools.string_to_id, querytools.merge_string

    def merge_string(con: sqlite3.Connection, value: Any) -> Any:  # a write's: kept ones used
        strings = getattr(con, "by_value", None)
        if strings is None:
            return merge(con, value)
        i = strings.get(value)
        if i is None:
            i = look_up(con, value)
            if i is None:  # new: added, not kept
                cur = con.cursor()
                i = cur.execute(schema.INSERT_STRING, [value]).fetchone()[0]
                cur.close()
            else:
                _found(con, i, value)
        return i

    querytools.id_to_string, querytools.string_to_id = id_to_string, string_to_id
    querytools.merge_string = merge_string


def string_ids(con: sqlite3.Connection, values: Sequence[str], add: bool = False) -> dict[str, int]:
    """The ids of those of the strings ``values`` the table holds: the kept ones, the others
    looked up in one query a few hundred at a time. ``add`` (inside a write): the missing ones
    added too, in one statement per query, as gremlite's ``merge_string`` adds one; what such
    a write found is kept once it commits, what it added is not (see the module). A read keeps
    nothing here (a window of ready seconds, up to 3,840, would flush the kept strings)."""
    kept = getattr(con, "by_value", {})
    out = {v: kept[v] for v in values if v in kept}
    left = list(dict.fromkeys(v for v in values if v not in out))
    cur = con.cursor()
    try:
        for first in range(0, len(left), 400):
            part = left[first:first + 400]
            found = dict(cur.execute(schema.strings_by_value(len(part)), part))
            if add and hasattr(con, "found"):  # one of ours
                for value, i in found.items():
                    _found(con, i, value)
            new = [v for v in part if v not in found] if add else []
            if new:
                found.update(cur.execute(schema.new_strings(len(new)), new).fetchall())
            out.update(found)
    finally:
        cur.close()
    return out


def _found(con: object, i: int, value: str) -> None:
    """A string looked up and found: kept at once by a read, after its commit by a write."""
    con = cast(KeptStrings, con)
    if con.reading:
        _keep(con, i, value)
    else:
        con.found[value] = i


def committed(con: KeptStrings) -> None:
    """``con``'s write committed: what it found is kept (see the module)."""
    for value, i in con.found.items():
        _keep(con, i, value)
    con.found.clear()


def _keep(con: KeptStrings, i: int, value: str) -> None:
    if len(con.by_id) >= STRINGS_KEPT:
        con.by_id.clear()
        con.by_value.clear()
    con.by_id[i] = value
    con.by_value[value] = i
