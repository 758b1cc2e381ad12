"""A remote Gremlin Server as the store's graph: :class:`RemoteGraph`.

How a guarded write is made atomic there (``atomicity``): the server's transactions, or a
server that runs one traversal at a time (each guarded write of the store is one traversal,
its guards before its changes), or, as an operator's override, neither. Every request has a
deadline; a dead or silent server raises :class:`~runner.errors.StoreUnavailable` in one line
and the connection is made anew at the next call. See docs/graph.md.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from gremlin_python.driver.driver_remote_connection import DriverRemoteConnection
from gremlin_python.process import strategies
from gremlin_python.process.anonymous_traversal import traversal

from runner.errors import StoreUnavailable, WriteRaceLost
from runner.store.calls import CallStats
from runner.store.server.driver import check_version, deadline_transports, graphson_reads, lean
from runner.store.server.wire import GraphSONReader, graphbinary
from runner.store.traversal import Traversal

log = logging.getLogger("latchwork.store")

T = TypeVar("T")


#: what a server says when its locks refuse a commit (JanusGraph: PermanentLockingException,
#: TemporaryLockingException; Neo4j: DeadlockDetected)
_RACE_LOST = ("lockingexception", "deadlock", "concurrentmodification", "concurrent modification")

#: how a remote graph makes a guarded write atomic (docs/graph.md, "Atomicity")
TRANSACTIONS = "transactions"  # every write in a transaction of its own (g.tx())
SERIAL = "serial"  # the server runs one traversal at a time: each single traversal is atomic
NONE = "none"  # neither: an operator accepted check-then-act (allow_untransactional_graph)
#: the server's answers that mean "not now" (too many requests, evaluation timeout)
TRANSIENT_STATUS = (429, 598)
ATOMICITY = (TRANSACTIONS, SERIAL, NONE)

#: optimisations the server is asked not to apply (``withoutStrategies``): they only reorder
#: or rewrite steps the store writes in the order it means, and applying them to the loop's
#: batches (a ``union`` of a dozen guarded writes, each twenty-odd steps) cost more server CPU
#: than running them: 2.9 ms a batch of 12 claims with them, 1.6 without, on TinkerGraph 3.5
#: (``bench/profile_drain.py --jfr``, where the server's samples showed half its time in
#: strategies). Each keeps its meaning: TinkerPop's optimisations never change a result.
SKIPPED_STRATEGIES = (strategies.PathRetractionStrategy, strategies.LazyBarrierStrategy,
                      strategies.FilterRankingStrategy, strategies.InlineFilterStrategy,
                      strategies.IncidentToAdjacentStrategy,
                      strategies.AdjacentToIncidentStrategy)


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
    #: TinkerGraph 3.5 answers ``P.within`` by a scan of every vertex (an equality is an index
    #: lookup, at the start of a traversal and in its middle): the store asks for each value
    within_indexed = False

    def __init__(self, url: str, traversal_source: str = "g", *, username: str | None = None,
                 password: str | None = None, ca_file: str | None = None,
                 atomicity: str = TRANSACTIONS, timeout: float = 30.0) -> None:
        check_version()
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
        self._options["transport_factory"] = deadline_transports(self._options)
        self._lock = threading.Lock()
        self._remote: DriverRemoteConnection | None = None
        self._g: Traversal | None = None
        #: the reads' traversal source: ``_g`` itself, or the same connections asked for
        #: GraphSON 3 answers (``graphson_reads``) once the server said it gives them
        self._g_read: Traversal | None = None
        #: whether the server answers GraphSON 3 (None: not asked yet; asked once in the
        #: graph's life, on a connection of its own, by the first read)
        self._graphson: bool | None = None
        self._closed = False
        self.stats = CallStats()
        self._connect()

    def _connect(self, read: bool = False) -> Traversal:
        """The traversal source of a working connection (the reads' one when ``read``), made
        anew after a failure."""
        with self._lock:
            if self._closed:
                raise StoreUnavailable(f"the connection to Gremlin Server {self.url} is closed")
            if self._g is None:
                self._remote = self._new_remote()
                self._g = self._g_read = traversal().with_remote(self._remote) \
                    .without_strategies(*SKIPPED_STRATEGIES)
            if read and self._graphson and self._g_read is self._g:
                reads = graphson_reads(self._remote)
                if reads is not None:
                    self._g_read = traversal().with_remote(reads).without_strategies(
                        *SKIPPED_STRATEGIES)
            source = self._g_read if read else self._g
            assert source is not None  # made above
            return source

    def _new_remote(self, **options: object) -> DriverRemoteConnection:
        from gremlin_python.driver.driver_remote_connection import DriverRemoteConnection

        try:
            return lean(DriverRemoteConnection(
                self.url, self._source,
                **{"message_serializer": graphbinary(), **self._options, **options}))
        except Exception as exc:  # the driver raises plain exceptions for refused connections
            raise StoreUnavailable(f"cannot reach Gremlin Server {self.url}: "
                                   f"{type(exc).__name__}") from None

    def _speaks_graphson(self) -> bool:
        """Whether the server answers GraphSON 3 (one request on a connection of its own,
        outside the lock: a silent server holds up only the caller that asked); unreachable:
        StoreUnavailable. A server configured for GraphBinary only answers in GraphBinary."""
        remote = self._new_remote(message_serializer=GraphSONReader())
        try:
            return bool(traversal().with_remote(remote).inject(1).to_list() == [1])
        except Exception as exc:
            if not isinstance(exc, OSError | TimeoutError | RuntimeError) \
                    and not type(exc).__module__.startswith("aiohttp"):
                log.info("Gremlin Server %s does not answer GraphSON 3 (%s): reads go as "
                         "GraphBinary", self.url, type(exc).__name__)
                return False  # an answer in another serialisation, or an error about it
            raise StoreUnavailable(f"cannot reach Gremlin Server {self.url}: "
                                   f"{type(exc).__name__}") from None
        finally:
            _close_later(remote)

    def _broken(self, g: Traversal, exc: BaseException) -> StoreUnavailable:
        """Drop the connection ``g`` came from (closed in the background: closing a websocket
        whose server is gone waits for its own timeout) and say so in one line."""
        with self._lock:
            if g is self._g or g is self._g_read:
                remote, self._remote, self._g, self._g_read = self._remote, None, None, None
                _close_later(remote)
        what = "no answer in time" if isinstance(exc, TimeoutError) else type(exc).__name__
        log.warning("Gremlin Server %s: %s; reconnecting at the next call", self.url, what)
        return StoreUnavailable(f"Gremlin Server {self.url} unreachable: {what}")

    def _call(self, fn: Callable[[Traversal], T], g: Traversal) -> T:
        from gremlin_python.driver.protocol import GremlinServerError

        try:
            return fn(g)
        except GremlinServerError as exc:
            # the server cannot take the request now: its own evaluation timeout (598), or
            # its executor refusing work (429 "Rate limiting": seen while it shuts down):
            # the graph out of reach for now, as a cut connection is, never a bare error
            if exc.status_code in TRANSIENT_STATUS:
                raise StoreUnavailable(f"Gremlin Server {self.url}: {exc.status_message}"
                                       ) from None
            raise
        except (OSError, TimeoutError, RuntimeError) as exc:
            raise self._broken(g, exc) from None
        except Exception as exc:
            if type(exc).__module__.startswith("aiohttp"):
                raise self._broken(g, exc) from None
            raise

    def read(self, fn: Callable[[Traversal], T]) -> T:
        """``fn(g)``; a read that finds its pooled connection dead (the server restarted, the
        link was cut since) is asked once more on a new connection; a read that timed out is
        not (it would wait as long again)."""
        with self.stats.timed("read"):
            return self._read(fn)

    def _read(self, fn: Callable[[Traversal], T]) -> T:
        if self._graphson is None:
            self._graphson = self._speaks_graphson()
        try:
            return self._call(fn, self._connect(read=True))
        except StoreUnavailable as exc:
            if "no answer in time" in str(exc) or self._closed:
                raise
            return self._call(fn, self._connect(read=True))

    def write(self, fn: Callable[[Traversal], T]) -> T:
        with self.stats.timed("write"):
            return self._write(fn)

    def _write(self, fn: Callable[[Traversal], T]) -> T:
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
            finally:  # in this thread, once the commit answered or its read timed out: a
                # close from another thread while this one reads fails, and leaves the
                # session's connection open
                _close_quietly(probe_remote)

        thread = threading.Thread(target=probe, daemon=True, name="gremlin-tx-probe")
        thread.start()
        thread.join(deadline)
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
            remote, self._remote, self._g, self._g_read = self._remote, None, None, None
        if remote is not None:
            _close_quietly(remote)


def _close_later(remote: DriverRemoteConnection) -> None:
    """Close ``remote`` in the background (closing a websocket whose server is gone waits for
    its own timeout)."""
    threading.Thread(target=_close_quietly, args=(remote,), daemon=True,
                     name="gremlin-close").start()


def _close_quietly(remote: DriverRemoteConnection) -> None:
    try:
        remote.close()
    except Exception as exc:  # a broken connection: nothing left to release
        log.debug("closing a Gremlin connection: %s", exc)
