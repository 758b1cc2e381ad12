"""What the embedded driver relies on in gremlite, in one place, and its check at open.

The embedded driver writes SQL into gremlite's own tables where interpreting a traversal is too
slow (:mod:`.direct`, :mod:`.strings`, :mod:`.replace`), and patches a few of gremlite's Python
functions (:mod:`.replace`, :mod:`.branches`, :mod:`.strings`, each checking what it patches).
Those rely on gremlite's private schema: the tables, columns and indexes below, the value
encoding of ``quads.o`` (strings by id in ``strings``; ``0``/``1``/``2`` for false, true and
null; an integer ``n`` as ``n - 2**62``) and the row gremlite writes per vertex, property and
edge. Every statement the driver runs against those tables is built here, from these names.

:func:`check` runs when a graph is opened, before anything is written: the gremlite and
gremlinpython versions must be ones this code was tested with (:data:`GREMLITE`,
:data:`GREMLINPYTHON`, the pins in pyproject.toml), and the file's schema, read from SQLite
(``PRAGMA table_info``, ``index_list``, ``index_info``), must be :data:`TABLES` and
:data:`INDEXES`. Anything else raises :class:`~runner.errors.StoreSchemaUnknown` in one line
naming what differs, and nothing is written. When gremlite changes: install it beside a copy
of a graph, run ``tests/test_store_direct.py`` and the contract suite, read its schema and
encoding, then widen these (docs/graph.md, "What the embedded driver relies on").
"""

from __future__ import annotations

import sqlite3
from importlib import metadata
from pathlib import Path

from runner.errors import StoreSchemaUnknown

#: the gremlite releases this driver was tested with (exact: its schema is private)
GREMLITE = ("0.1.2",)
#: the gremlinpython minor this driver was tested with (its bytecode and steps)
GREMLINPYTHON = "3.7."

#: gremlite's tables and their columns, in order, with their declared types
TABLES: dict[str, tuple[tuple[str, str], ...]] = {
    "quads": (("s", "INT"), ("p", "INT"), ("o", "INT"), ("g", "INT")),
    "strings": (("id", "INTEGER"), ("v", "TEXT")),
    "graphelts": (("id", "INTEGER"),),
}
#: the indexes the statements here are planned on: (table, columns, unique)
INDEXES: dict[str, tuple[str, tuple[str, ...], bool]] = {
    "ops": ("quads", ("o", "p", "s"), False),
    "sp": ("quads", ("s", "p"), False),
    "pg": ("quads", ("p", "g"), False),
    "g": ("quads", ("g",), False),
    "sqlite_autoindex_strings_1": ("strings", ("v",), True),
}


def check_versions() -> None:
    """The installed gremlite and gremlinpython are ones this driver was tested with."""
    gremlite = metadata.version("gremlite")
    gremlinpython = metadata.version("gremlinpython")
    if gremlite not in GREMLITE:
        raise StoreSchemaUnknown(
            f"gremlite {gremlite} is installed; the embedded graph's driver was tested with "
            f"gremlite {', '.join(GREMLITE)} only (it writes into gremlite's tables): install "
            f"that version (pip install 'gremlite=={GREMLITE[-1]}')")
    if not gremlinpython.startswith(GREMLINPYTHON):
        raise StoreSchemaUnknown(
            f"gremlinpython {gremlinpython} is installed; the embedded graph's driver was "
            f"tested with gremlinpython {GREMLINPYTHON}x: install that (pip install "
            f"'gremlinpython>={GREMLINPYTHON}0,<3.8')")


def differences(con: sqlite3.Connection) -> list[str]:
    """What the schema of the file on ``con`` has other than :data:`TABLES` and
    :data:`INDEXES` (empty: what the driver relies on)."""
    found: list[str] = []
    for table, columns in TABLES.items():
        have = tuple((str(r[1]), str(r[2]).upper())
                     for r in con.execute(f"PRAGMA table_info({table})"))
        if not have:
            found.append(f"table {table} is missing")
        elif have != columns:
            found.append(f"table {table} has columns "
                         f"{', '.join(f'{c} {t}' for c, t in have)}, not "
                         f"{', '.join(f'{c} {t}' for c, t in columns)}")
    for index, (table, on, unique) in INDEXES.items():
        listed = {str(r[1]): bool(r[2]) for r in con.execute(f"PRAGMA index_list({table})")}
        if index not in listed:
            found.append(f"index {index} on {table} is missing")
            continue
        cols = tuple(str(r[2]) for r in con.execute(f"PRAGMA index_info({index})"))
        if cols != on or listed[index] != unique:
            found.append(f"index {index} is on {table}({', '.join(cols)}), not "
                         f"({', '.join(on)})")
    return found


def _read_only(path: Path, timeout: float) -> sqlite3.Connection:
    """A connection that cannot write to the file (its URI percent-encoded: any path)."""
    return sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True,
                           timeout=timeout)


def has_tables(path: Path, timeout: float) -> bool:
    """Whether the file at ``path`` holds any table yet (a new or empty file does not)."""
    if not path.exists() or path.stat().st_size == 0:
        return False
    con = _read_only(path, timeout)
    try:
        return bool(con.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'")
                    .fetchone()[0])
    except sqlite3.DatabaseError:
        return True  # not a database we can read: the check says what is wrong
    finally:
        con.close()


def check(path: Path, timeout: float) -> None:
    """Refuse the graph file at ``path`` unless the versions and its schema are what the
    driver relies on (read only; nothing is written)."""
    check_versions()
    con = _read_only(path, timeout)
    try:
        found = differences(con)
    except sqlite3.DatabaseError as exc:
        found = [f"SQLite cannot read it: {exc}"]
    finally:
        con.close()
    if found:
        raise StoreSchemaUnknown(
            f"graph file {path}: its gremlite schema is not the one latchwork's embedded "
            f"driver writes into ({'; '.join(found)}); nothing was written (a gremlite "
            f"other than {', '.join(GREMLITE)} made it? docs/graph.md)")


# -- the statements, every one the driver runs against gremlite's tables ---------------------

#: the highest element id handed out (vertex ids are below it)
MAX_ELEMENT_ID = "SELECT max(id) FROM graphelts"
#: one row per vertex label, property and edge: (subject, predicate, object, graph element)
INSERT_QUAD = "INSERT INTO quads VALUES (?, ?, ?, ?)"
#: the sources of the edges of one label into one vertex (planned on ``ops``: o, p)
EDGES_INTO = "SELECT s FROM quads WHERE o = ? AND p = ?"
#: a property's value replaced in place on one vertex (+g: not planned on the pg index)
UPDATE_VALUE = "UPDATE quads SET o = ? WHERE s = ? AND p = ? AND +g > 0"
#: one new string, its id back
INSERT_STRING = "INSERT INTO strings (v) VALUES (?) RETURNING id"
#: the distinct values of one property on the vertices whose other property has one value
VALUES_OF = ("SELECT DISTINCT v.o FROM quads q JOIN quads v ON v.s = q.s AND v.p = ? "
             "AND +v.g > 0 WHERE q.p = ? AND q.o = ? AND +q.g > 0")


def _marks(count: int) -> str:
    return ",".join("?" * count)


def new_elements(count: int) -> str:
    """``count`` new element ids, in gremlite's order."""
    return f"INSERT INTO graphelts VALUES {','.join(['(NULL)'] * count)} RETURNING id"


def vertices_with(pairs: int) -> str:
    """The vertices (two at most) having ``pairs`` (predicate, object) pairs: the first pair's
    arguments last (the ``ops`` index), each further pair a join over ``sp``."""
    joins = "".join(f" JOIN quads q{n} ON q{n}.s = q0.s AND q{n}.p = ? AND q{n}.o = ?"
                    for n in range(1, pairs))
    return (f"SELECT DISTINCT q0.s FROM quads q0{joins} "
            f"WHERE q0.p = ? AND q0.o = ? AND +q0.g > 0 LIMIT 2")


def vertices_having(values: int, allowed: int | None) -> str:
    """Up to ``?`` vertices whose property ``?`` is one of ``values`` objects (and, with
    ``allowed``, whose other property ``?`` is one of that many)."""
    join = ("" if allowed is None else
            f" JOIN quads w ON w.s = q.s AND w.p = ? AND w.o IN ({_marks(allowed)})")
    return (f"SELECT q.s FROM quads q{join} WHERE q.p = ? AND q.o IN ({_marks(values)})"
            " AND +q.g > 0 LIMIT ?")


def properties_of(vertices: int, names: int) -> str:
    """The (subject, predicate, object) rows of these properties of these vertices."""
    return (f"SELECT s, p, o FROM quads WHERE s IN ({_marks(vertices)}) AND p IN "
            f"({_marks(names)}) AND +g > 0")


def strings_by_id(count: int) -> str:
    return f"SELECT id, v FROM strings WHERE id IN ({_marks(count)})"


def strings_by_value(count: int) -> str:
    return f"SELECT v, id FROM strings WHERE v IN ({_marks(count)})"


def new_strings(count: int) -> str:
    return f"INSERT INTO strings (v) VALUES {','.join(['(?)'] * count)} RETURNING v, id"
