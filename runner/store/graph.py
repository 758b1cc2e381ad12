"""Connections to the graph: the embedded gremlite file or a remote Gremlin Server.

Both give the store a gremlinpython ``GraphTraversalSource`` through two calls:

* ``read(fn)``: run ``fn(g)`` and return its result;
* ``write(fn)``: run ``fn(g)`` as one atomic step. Embedded: inside ``BEGIN IMMEDIATE`` ...
  ``COMMIT`` on a WAL database, so the write lock is taken up front and concurrent processes on
  one host queue for it (SQLite's busy timeout) instead of failing with "database is locked" when
  a read lock would have to be upgraded; a lock still held past the deadline raises
  :class:`StoreUnavailable`. Remote: every write the store makes is a single traversal, which
  the server applies as one request (use a transactional graph for multi-client setups).

``open_graph(location)`` picks the backend: ``ws://`` or ``wss://`` URLs are remote, anything
else is a path to the SQLite file.
"""

from __future__ import annotations

import fcntl
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from gremlin_python.process.anonymous_traversal import traversal

from runner.store.errors import StoreUnavailable

log = logging.getLogger("latchwork.store")

T = TypeVar("T")


class Graph(Protocol):
    name: str

    def read(self, fn: Callable[[Any], T]) -> T: ...

    def write(self, fn: Callable[[Any], T]) -> T: ...

    def close(self) -> None: ...


class EmbeddedGraph:
    """gremlite on a SQLite file; one SQLite connection per thread."""

    name = "gremlite"

    def __init__(self, path: str | Path, busy_timeout: float = 30.0) -> None:
        self.path = Path(path)
        self.busy_timeout = busy_timeout
        self._local = threading.local()
        self._all: list[Any] = []
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._connection()  # create and initialise the file now, so errors show early

    def _connection(self) -> Any:
        remote = getattr(self._local, "remote", None)
        if remote is not None:
            return remote
        from gremlite import SQLiteConnection

        # gremlite creates its tables on first open; several processes opening a new file at
        # once would race on that, so the first open holds an exclusive file lock
        with open(f"{self.path}.init-lock", "w") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            try:
                remote = SQLiteConnection(self.path, isolation_level=None,
                                          timeout=self.busy_timeout)
                remote.con.execute("PRAGMA journal_mode=WAL")
                remote.con.execute("PRAGMA synchronous=NORMAL")
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"cannot open graph file {self.path}: {exc}") from exc
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)
        self._local.remote = remote
        self._local.g = traversal().with_remote(remote)
        self._local.depth = 0
        with self._lock:
            self._all.append(remote)
        return remote

    def _run(self, begin: str, fn: Callable[[Any], T]) -> T:
        remote = self._connection()
        if self._local.depth:  # nested: already inside the outer transaction
            return fn(self._local.g)
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                remote.con.execute(begin)
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise StoreUnavailable(f"graph file {self.path}: {exc}") from exc
                if time.monotonic() > deadline:
                    raise StoreUnavailable(f"graph file {self.path} stayed locked for "
                                           f"{self.busy_timeout:g}s") from exc
                time.sleep(0.01)
        self._local.depth = 1
        try:
            result = fn(self._local.g)
            remote.con.execute("COMMIT")
            return result
        except BaseException:
            if remote.con.in_transaction:
                remote.con.execute("ROLLBACK")
            raise
        finally:
            self._local.depth = 0

    def read(self, fn: Callable[[Any], T]) -> T:
        return self._run("BEGIN DEFERRED", fn)  # one consistent snapshot for the whole read

    def write(self, fn: Callable[[Any], T]) -> T:
        return self._run("BEGIN IMMEDIATE", fn)

    def close(self) -> None:
        with self._lock:
            remotes, self._all = self._all, []
        for remote in remotes:
            try:
                remote.close()
            except sqlite3.ProgrammingError:
                pass  # opened by another thread, which is gone; SQLite closes it with the file
        self._local = threading.local()


class RemoteGraph:
    """A Gremlin Server (``ws://host:8182/gremlin``) through gremlinpython's driver."""

    name = "remote"

    def __init__(self, url: str, traversal_source: str = "g") -> None:
        from gremlin_python.driver.driver_remote_connection import DriverRemoteConnection

        self.url = url
        try:
            self._remote = DriverRemoteConnection(url, traversal_source)
        except Exception as exc:  # the driver raises plain exceptions for refused connections
            raise StoreUnavailable(f"cannot reach Gremlin Server {url}: {exc}") from exc
        self._g = traversal().with_remote(self._remote)

    def read(self, fn: Callable[[Any], T]) -> T:
        return fn(self._g)

    def write(self, fn: Callable[[Any], T]) -> T:
        return fn(self._g)

    def close(self) -> None:
        self._remote.close()


def open_graph(location: str) -> Graph:
    """``ws://``/``wss://`` URL: remote Gremlin Server; anything else: a gremlite file path."""
    if location.startswith(("ws://", "wss://")):
        return RemoteGraph(location)
    return EmbeddedGraph(location)
