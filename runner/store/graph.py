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
  against a server with neither unless told otherwise (:class:`RemoteGraph`, docs/graph.md).

``open_graph(location)`` picks the backend: ``ws://`` or ``wss://`` URLs are remote, anything
else is a path to the SQLite file.
"""

from __future__ import annotations

import fcntl
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

from gremlin_python.process.anonymous_traversal import traversal

from runner.errors import StoreUnavailable, WriteRaceLost

log = logging.getLogger("latchwork.store")

T = TypeVar("T")


class Graph(Protocol):
    name: str

    def read(self, fn: Callable[[Any], T]) -> T: ...

    def write(self, fn: Callable[[Any], T]) -> T: ...

    def close(self) -> None: ...


class _LazyBegin(sqlite3.Connection):
    """A SQLite connection whose transaction begins at the first cursor asked for after
    :meth:`begin_lazily`, so that only statements run inside it: gremlite reaches SQLite through
    ``cursor()`` only, after gremlinpython has built the traversal and gremlite has compiled it."""

    def __init__(self, path: Path, busy_timeout: float) -> None:
        super().__init__(path, timeout=busy_timeout, isolation_level=None)
        self.file = path
        self.busy_timeout = busy_timeout
        self._pending: tuple[str, float] | None = None  # (BEGIN statement, deadline)

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
        while True:
            try:
                self.execute(begin)  # waits in SQLite's busy handler up to the busy timeout
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise StoreUnavailable(f"graph file {self.file}: {exc}") from exc
                if time.monotonic() > deadline:
                    raise StoreUnavailable(f"graph file {self.file} stayed locked for "
                                           f"{self.busy_timeout:g}s") from exc
                time.sleep(0.01)


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
        #: gremlite's tables are all there: no open of this object needs the init lock
        self._initialised = self._tables_exist()
        self._connection()  # create and initialise the file now, so errors show early

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

        try:
            remote = SQLiteConnection(self.path, isolation_level=None, timeout=self.busy_timeout)
            # gremlite's traversals use ``remote.con``: ours, which begins lazily, replaces it
            remote.con.close()
            remote.con = _LazyBegin(self.path, self.busy_timeout)
            remote.con.execute("PRAGMA journal_mode=WAL")
            remote.con.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open graph file {self.path}: {exc}") from exc
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

    def _run(self, begin: str, fn: Callable[[Any], T]) -> T:
        remote = self._connection()
        if self._local.depth:  # nested: already inside the outer transaction
            return fn(self._local.g)
        con: _LazyBegin = remote.con
        con.begin_lazily(begin)
        self._local.depth = 1
        try:
            result = fn(self._local.g)
            if con.in_transaction:  # not begun when fn ran no statement
                con.execute("COMMIT")
            return result
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise
        finally:
            con.begin_lazily(None)
            self._local.depth = 0

    def read(self, fn: Callable[[Any], T]) -> T:
        return self._run("BEGIN DEFERRED", fn)  # one consistent snapshot for the whole read

    def element_id_bound(self) -> int:
        """The highest element id gremlite has handed out (vertex ids are below it): paging
        over windows of vertex ids stops there. One read of an integer primary key."""
        remote = self._connection()
        try:
            row = remote.con.execute("SELECT max(id) FROM graphelts").fetchone()
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"graph file {self.path}: {exc}") from exc
        return int(row[0] or 0)

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


#: what a server says when its locks refuse a commit (JanusGraph: PermanentLockingException,
#: TemporaryLockingException; Neo4j: DeadlockDetected)
_RACE_LOST = ("lockingexception", "deadlock", "concurrentmodification", "concurrent modification")

#: how a remote graph makes a guarded write atomic (docs/graph.md, "Atomicity")
TRANSACTIONS = "transactions"  # every write in a transaction of its own (g.tx())
SERIAL = "serial"  # the server runs one traversal at a time: each single traversal is atomic
NONE = "none"  # neither: an operator accepted check-then-act (allow_untransactional_graph)
ATOMICITY = (TRANSACTIONS, SERIAL, NONE)


class RemoteGraph:
    """A Gremlin Server (``ws://host:8182/gremlin`` or ``wss://``) through gremlinpython's driver.

    ``atomicity`` says what makes a guarded write atomic there:

    * ``"transactions"`` (the default): each write runs inside a transaction (``g.tx()``: a
      session of its own, committed when the write function returns, rolled back when it
      raises), so a write's checks and changes commit together, however many traversals;
    * ``"serial"``: the server runs one traversal at a time (TinkerGraph with
      ``gremlinPool: 1``): writes are plain requests, and each single traversal, whose guards
      the store places before its changes, is atomic; a write function of several traversals
      is not, so every guarded write of the store is one traversal;
    * ``"none"``: plain requests on a server that guarantees neither (an operator's override).

    Every request has a deadline (``timeout``): a server that does not answer in time, a
    refused or cut connection, raise :class:`StoreUnavailable` in one line and the driver's
    connections are replaced before the next call (gremlinpython never reconnects a broken
    one). A write that timed out may or may not have been applied: the caller reads again
    before it reports anything. :meth:`supports_transactions` asks the server, with the same
    deadline (TinkerPop 3.5 never answers a commit on a graph without transactions).
    ``username``/``password`` authenticate (SASL plain), ``ca_file`` verifies a ``wss://``
    server's certificate.
    """

    name = "remote"

    def __init__(self, url: str, traversal_source: str = "g", *, username: str | None = None,
                 password: str | None = None, ca_file: str | None = None,
                 atomicity: str = TRANSACTIONS, timeout: float = 30.0) -> None:
        if atomicity not in ATOMICITY:
            raise ValueError(f"atomicity must be one of {ATOMICITY}, not {atomicity!r}")
        self.url = url
        self.atomicity = atomicity
        self.timeout = timeout
        self._source = traversal_source
        self._options: dict[str, Any] = {"read_timeout": timeout, "write_timeout": timeout}
        if username is not None:
            self._options.update(username=username, password=password or "")
        if ca_file is not None or url.startswith("wss://"):
            import ssl
            self._options["ssl_options"] = ssl.create_default_context(cafile=ca_file)
        self._lock = threading.Lock()
        self._remote: Any = None
        self._g: Any = None
        self._closed = False
        self._connect()

    def _connect(self) -> Any:
        """The traversal source of a working connection, made anew after a failure."""
        from gremlin_python.driver.driver_remote_connection import DriverRemoteConnection

        with self._lock:
            if self._closed:
                raise StoreUnavailable(f"the connection to Gremlin Server {self.url} is closed")
            if self._g is not None:
                return self._g
            try:
                self._remote = DriverRemoteConnection(self.url, self._source, **self._options)
            except Exception as exc:  # the driver raises plain exceptions for refused connections
                raise StoreUnavailable(f"cannot reach Gremlin Server {self.url}: "
                                       f"{type(exc).__name__}") from None
            self._g = traversal().with_remote(self._remote)
            return self._g

    def _broken(self, g: Any, exc: BaseException) -> StoreUnavailable:
        """Drop the connection ``g`` came from (closed in the background: closing a websocket
        whose server is gone waits for its own timeout) and say so in one line."""
        with self._lock:
            if self._g is g:
                remote, self._remote, self._g = self._remote, None, None
                threading.Thread(target=_close_quietly, args=(remote,), daemon=True,
                                 name="gremlin-close").start()
        what = "no answer in time" if isinstance(exc, TimeoutError) else type(exc).__name__
        log.warning("Gremlin Server %s: %s; reconnecting at the next call", self.url, what)
        return StoreUnavailable(f"Gremlin Server {self.url} unreachable: {what}")

    def _call(self, fn: Callable[[Any], T], g: Any) -> T:
        from gremlin_python.driver.protocol import GremlinServerError

        try:
            return fn(g)
        except GremlinServerError as exc:
            if exc.status_code in (598,):  # the server's own evaluation timeout
                raise StoreUnavailable(f"Gremlin Server {self.url}: {exc.status_message}"
                                       ) from None
            raise
        except (OSError, TimeoutError, RuntimeError) as exc:
            raise self._broken(g, exc) from None
        except Exception as exc:
            if type(exc).__module__.startswith("aiohttp"):
                raise self._broken(g, exc) from None
            raise

    def read(self, fn: Callable[[Any], T]) -> T:
        """``fn(g)``; a read that finds its pooled connection dead (the server restarted, the
        link was cut since) is asked once more on a new connection; a read that timed out is
        not (it would wait as long again)."""
        try:
            return self._call(fn, self._connect())
        except StoreUnavailable as exc:
            if "no answer in time" in str(exc) or self._closed:
                raise
            return self._call(fn, self._connect())

    def write(self, fn: Callable[[Any], T]) -> T:
        g = self._connect()
        if self.atomicity != TRANSACTIONS:
            return self._call(fn, g)
        tx = g.tx()
        try:
            gtx = tx.begin()
            result = fn(gtx)
            tx.commit()
            return result
        except BaseException as exc:
            if tx.is_open():
                try:
                    tx.rollback()
                except Exception:
                    log.warning("Gremlin Server %s: rollback failed; the server drops the "
                                "session's transaction when the session closes", self.url)
            if any(word in str(exc).lower() for word in _RACE_LOST):
                raise WriteRaceLost(f"Gremlin Server {self.url}: a concurrent transaction "
                                    f"won: {type(exc).__name__}") from exc
            if isinstance(exc, OSError | TimeoutError | RuntimeError):
                raise self._broken(g, exc) from None
            raise

    def supports_transactions(self, deadline: float = 10.0) -> bool:
        """Whether the server commits a transaction (one empty transaction); False when it
        refuses, or when it does not answer the commit within ``deadline`` (TinkerPop 3.5 on a
        graph without transactions: TINKERPOP-2751); unreachable: StoreUnavailable."""
        from gremlin_python.driver.driver_remote_connection import DriverRemoteConnection

        self._connect()  # unreachable: StoreUnavailable
        # a connection of its own: closing one whose commit never answered waits for ever, so
        # that one is left to a daemon thread and the store's connection is never held up
        probe_remote = DriverRemoteConnection(self.url, self._source, **self._options)
        answer: list[bool | BaseException] = []

        def probe() -> None:
            tx = traversal().with_remote(probe_remote).tx()
            try:
                gtx = tx.begin()
                gtx.inject(1).to_list()
                tx.commit()
                answer.append(True)
            except Exception as exc:
                text = str(exc).lower()
                answer.append(False if "transaction" in text or "not support" in text else exc)

        thread = threading.Thread(target=probe, daemon=True, name="gremlin-tx-probe")
        thread.start()
        thread.join(deadline)
        threading.Thread(target=_close_quietly, args=(probe_remote,), daemon=True,
                         name="gremlin-tx-probe-close").start()
        if not answer:
            log.info("Gremlin Server %s: no answer to a commit in %gs: no transactions",
                     self.url, deadline)
            return False
        if isinstance(answer[0], BaseException):
            raise StoreUnavailable(f"Gremlin Server {self.url}: "
                                   f"{type(answer[0]).__name__}") from None
        return answer[0]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            remote, self._remote, self._g = self._remote, None, None
        if remote is not None:
            _close_quietly(remote)


def _close_quietly(remote: Any) -> None:
    try:
        remote.close()
    except Exception as exc:  # a broken connection: nothing left to release
        log.debug("closing a Gremlin connection: %s", exc)


def open_graph(location: str, **remote: Any) -> Graph:
    """``ws://``/``wss://`` URL: remote Gremlin Server (``remote``: :class:`RemoteGraph`'s
    credentials and options); anything else: a gremlite file path."""
    if location.startswith(("ws://", "wss://")):
        return RemoteGraph(location, **remote)
    return EmbeddedGraph(location)
