"""Connections to the graph: the embedded gremlite file or a remote Gremlin Server.

Both give the store a gremlinpython ``GraphTraversalSource`` through two calls:

* ``read(fn)``: run ``fn(g)`` and return its result;
* ``write(fn)``: run ``fn(g)`` as one atomic step. Embedded: inside ``BEGIN IMMEDIATE`` ...
  ``COMMIT`` on a WAL database, so the write lock is taken before the first statement and
  concurrent processes on one host queue for it (SQLite's busy timeout) instead of failing with
  "database is locked" when a read lock would have to be upgraded; a lock still held past the
  deadline raises :class:`StoreUnavailable`. The transaction begins when gremlite asks for its
  first cursor, not when ``fn`` is called: building the traversal and compiling it into
  gremlite's plan run outside the single writer slot (in one process about 0.12 ms of a write's
  0.9 ms in it).
  Remote: every write runs in a transaction of its own (``g.tx()``), so a guarded write's
  check and its change commit together; or, on a server that runs one traversal at a time,
  as plain requests whose single guarded traversals are atomic there; a node refuses to start
  against a server with neither unless told otherwise (:mod:`runner.store.server.graph`,
  docs/graph.md).

``open_graph(location)`` picks the backend: ``ws://`` or ``wss://`` URLs are remote, anything
else is a path to the SQLite file.
"""

from __future__ import annotations

import fcntl
import logging
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from gremlin_python.process.anonymous_traversal import traversal

from runner.errors import StoreFull, StoreUnavailable
from runner.store.calls import CallStats
from runner.store.embedded import schema
from runner.store.embedded.alarm import StorageAlarm, unwritable
from runner.store.embedded.branches import early_branches
from runner.store.embedded.direct import SqlPlans
from runner.store.embedded.replace import fresh_props_listed, lean_replace
from runner.store.embedded.strings import committed, kept_strings
from runner.store.embedded.wal import WAL_AUTOCHECKPOINT, WalCheckpointer
from runner.store.traversal import Traversal

log = logging.getLogger("latchwork.store")

T = TypeVar("T")


class _LazyBegin(sqlite3.Connection):
    """A SQLite connection whose transaction begins at the first cursor asked for after
    :meth:`begin_lazily`, so that only statements run inside it: gremlite reaches SQLite through
    ``cursor()`` only, after gremlinpython has built the traversal and gremlite has compiled it.

    It also keeps the strings its reads looked up, and those its writes found once they commit
    (:mod:`runner.store.embedded.strings`)."""

    def __init__(self, path: Path, busy_timeout: float) -> None:
        super().__init__(path, timeout=busy_timeout, isolation_level=None)
        self.file = path
        self.busy_timeout = busy_timeout
        self._pending: tuple[str, float] | None = None  # (BEGIN statement, deadline)
        self.reading = False  # in a read's transaction: what it looks up may be kept
        self.by_id: dict[int, str] = {}
        self.by_value: dict[str, int] = {}
        self.found: dict[str, int] = {}  # what a write found, kept once it commits

    def begin_lazily(self, begin: str | None) -> None:
        """``begin`` runs before the next cursor is handed out (None: forget a pending one)."""
        self._pending = None if begin is None else (begin,
                                                    time.monotonic() + self.busy_timeout)

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        if self._pending is not None:
            begin, deadline = self._pending
            self._pending = None
            self._begin(begin, deadline)
        return super().cursor(*args, **kwargs)

    def _begin(self, begin: str, deadline: float) -> None:
        """Run ``begin``; a write's ``BEGIN IMMEDIATE`` waits for the write lock here, asking
        again after 0.2 to 4 ms (jittered), not in SQLite's busy handler, which sleeps up to
        100 ms between tries whether or not the lock was freed meanwhile."""
        immediate = begin == "BEGIN IMMEDIATE"
        if immediate:
            self.execute("PRAGMA busy_timeout = 0")
        try:
            tries = 0
            while True:
                try:
                    self.execute(begin)
                    return
                except sqlite3.OperationalError as exc:
                    if "locked" not in str(exc) and "busy" not in str(exc):
                        raise (unwritable(self.file, exc)
                               or StoreUnavailable(f"graph file {self.file}: {exc}")) from exc
                    if time.monotonic() > deadline:
                        raise StoreUnavailable(f"graph file {self.file} stayed locked for "
                                               f"{self.busy_timeout:g}s") from exc
                    tries = min(tries + 1, 5)  # 0.4, 0.8, ... 4 ms, then 4 ms for good
                    time.sleep(random.uniform(0.5, 1.0) * 0.0002 * 2 ** tries)
        finally:
            if immediate:
                self.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")


class EmbeddedGraph:
    """gremlite on a SQLite file; one SQLite connection per thread."""

    name = "gremlite"
    within_indexed = True  # one SQL lookup per value

    def __init__(self, path: str | Path, busy_timeout: float = 30.0) -> None:
        self.path = Path(path)
        self.busy_timeout = busy_timeout
        self._local = threading.local()
        self._all: list[Any] = []
        self._lock = threading.Lock()
        self.stats = CallStats()
        self.alarm = StorageAlarm(self.path)
        #: checkpoints the WAL beside the writers, not inside a commit (:mod:`.wal`)
        self.checkpointer = WalCheckpointer(self.path, busy_timeout)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        schema.check_versions()
        made = schema.has_tables(self.path, busy_timeout)
        if made:  # what the driver writes into, checked before anything is written
            schema.check(self.path, busy_timeout)
        #: gremlite's tables are all there: no open of this object needs the init lock
        self._initialised = self._tables_exist()
        self._connection()  # create and initialise the file now, so errors show early
        if not made:  # made now (or by another process meanwhile): what gremlite made
            schema.check(self.path, busy_timeout)

    def _connection(self) -> Any:
        remote = getattr(self._local, "remote", None)
        if remote is not None:
            return remote
        if self._initialised:  # no lock: a process frozen holding it stops no new thread
            remote = self._open()
        else:  # gremlite may create its tables: processes opening a new file at once would race
            with self._init_lock():
                remote = self._open()
            self._initialised = True
        self._local.remote = remote
        self._local.g = traversal().with_remote(remote)
        self._local.depth = 0
        with self._lock:
            self._all.append(remote)
        return remote

    def _tables_exist(self) -> bool:
        """Whether another process already created gremlite's tables (a read, which WAL lets
        run beside any writer). Anything short of all of them: the open takes the lock."""
        from gremlite.connection import db_already_initialized

        if not self.path.exists():
            return False
        try:
            con = sqlite3.connect(self.path, timeout=self.busy_timeout)
            try:
                return bool(db_already_initialized(con))
            finally:
                con.close()
        except Exception:  # half made (BadDatabase), unreadable: the locked open will tell
            return False

    def _open(self) -> Any:
        from gremlite import SQLiteConnection

        kept_strings()
        lean_replace()
        early_branches()
        try:
            remote = SQLiteConnection(self.path, isolation_level=None, timeout=self.busy_timeout)
            # gremlite's traversals use ``remote.con``: ours, which begins lazily, replaces it
            remote.con.close()
            remote.con = _LazyBegin(self.path, self.busy_timeout)
            remote.con.execute("PRAGMA journal_mode=WAL")
            remote.con.execute("PRAGMA synchronous=NORMAL")
            remote.con.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT}")
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open graph file {self.path}: {exc}") from exc
        submit = remote.submit
        remote.submit = lambda bytecode: submit(fresh_props_listed(bytecode))
        return remote

    @contextmanager
    def _init_lock(self) -> Iterator[None]:
        """The exclusive file lock over a first open, waited for up to the busy timeout (then
        :class:`StoreUnavailable`), never for ever."""
        deadline = time.monotonic() + self.busy_timeout
        with open(f"{self.path}.init-lock", "w") as lock_file:
            while True:
                try:
                    fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise StoreUnavailable(
                            f"graph file {self.path}: another process held {lock_file.name} "
                            f"(the first open of the file) for {self.busy_timeout:g}s") from None
                    time.sleep(0.01)
            try:
                yield
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)

    def _run(self, begin: str, fn: Callable[[Traversal], T]) -> T:
        remote = self._connection()
        if self._local.depth:  # nested: already inside the outer transaction
            return fn(self._local.g)
        con: _LazyBegin = remote.con
        con.begin_lazily(begin)
        con.reading = begin == "BEGIN DEFERRED"
        self._local.depth = 1
        try:
            result = fn(self._local.g)
            wrote = con.in_transaction and begin == "BEGIN IMMEDIATE"
            if con.in_transaction:  # not begun when fn ran no statement
                con.execute("COMMIT")
                committed(con)
        except BaseException as exc:
            if con.in_transaction:
                try:
                    con.execute("ROLLBACK")
                except sqlite3.Error:
                    pass  # SQLite rolled back itself (a full disk, an I/O error)
            full = unwritable(self.path, exc) if isinstance(exc, sqlite3.Error) else exc
            if isinstance(full, StoreFull):
                self.alarm.refused(full)
                if full is not exc:
                    raise full from exc
            raise
        finally:
            con.begin_lazily(None)
            con.reading = False
            con.found.clear()
            self._local.depth = 0
        if wrote:
            self.alarm.written()
            self.checkpointer.committed()
        return result

    def read(self, fn: Callable[[Traversal], T]) -> T:
        with self.stats.timed("read"):
            return self._run("BEGIN DEFERRED", fn)  # one consistent snapshot for the read

    def element_id_bound(self) -> int:
        """The highest element id gremlite has handed out (vertex ids are below it): paging
        over windows of vertex ids stops there. One read of an integer primary key."""
        remote = self._connection()
        try:
            row = remote.con.execute(schema.MAX_ELEMENT_ID).fetchone()
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"graph file {self.path}: {exc}") from exc
        return int(row[0] or 0)

    def write(self, fn: Callable[[Traversal], T]) -> T:
        with self.stats.timed("write"):
            return self._run("BEGIN IMMEDIATE", fn)

    @property
    def direct(self) -> EmbeddedDirect:
        """Plans applied and reads answered by SQL into gremlite's tables
        (:class:`runner.store.gremlin.plans.Direct`)."""
        return EmbeddedDirect(self)

    def sql(self, fn: Callable[[Any, Any], T], write: bool = False) -> T:
        """``fn(con, g)`` inside one read's (``write``: one write's) transaction, given the
        SQLite connection beside the traversal source: the reads and writes the store applies
        to gremlite's tables directly (:mod:`runner.store.embedded.direct`)."""
        with self.stats.timed("write" if write else "read"):
            return self._run("BEGIN IMMEDIATE" if write else "BEGIN DEFERRED",
                             lambda g: fn(self._local.remote.con, g))

    def close(self) -> None:
        self.checkpointer.close()
        with self._lock:
            remotes, self._all = self._all, []
        for remote in remotes:
            try:
                remote.close()
            except sqlite3.ProgrammingError:
                pass  # opened by another thread, which is gone; SQLite closes it with the file
        self._local = threading.local()


class EmbeddedDirect:
    """:class:`~runner.store.gremlin.plans.Direct` over an embedded graph's connection."""

    def __init__(self, graph: EmbeddedGraph) -> None:
        self.graph = graph

    def run(self, fn: Callable[[SqlPlans, Traversal], T], *, write: bool = False) -> T:
        return self.graph.sql(lambda con, g: fn(SqlPlans(con), g), write=write)
