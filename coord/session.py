"""Session: one kazoo client under a cluster root, with connection state as a first-class thing.

States (:class:`SessionState`):

* CONNECTED: the session is live and the connection up;
* SUSPENDED: the connection dropped; the session may still be alive on the server. Recipes stop
  starting things (no new tasks, no master duties) until it is CONNECTED again, but SUSPENDED
  means unknown, not lost: a confirmation asked for meanwhile (:meth:`Session.confirm`, a
  lock's ``verify()``) waits, bounded by the session's deadline, for RECONNECTED or LOST;
* LOST: the session is gone: ephemeral nodes (members, latch nodes, locks) are gone with it.

kazoo reports LOST only once it reconnects and learns that the session expired (while
ZooKeeper stays unreachable, never), and notices a silent partition only after its read
timeout, two thirds of the session timeout. The server expires a session one session timeout
after the last message it received, which came before the last reply the client got. So the
Session keeps its own deadline, counted from the last bytes it read from the server: at ``last
reply + session timeout - margin`` (a fifth of the timeout by default) it reports LOST,
whatever kazoo says, always before the server can have expired the session;
:meth:`Session.expired` reads it from the clock alone (a thread that runs first after a pause
knows at once). If kazoo still believes the connection is up then, the Session opens a new
session; an old one that comes back later (a healed partition, a revived ensemble) is replaced
too, so nothing runs on a session every recipe already treated as lost.

Listeners are called one at a time on the Session's own dispatch thread, never on kazoo's, so
they may do blocking ZooKeeper I/O; one that raises is logged and the others still run.

Why one module: the state machine and the watchdog that acts on its deadline are one idea;
apart, each would need the other's locks and fields (what it changes of kazoo's client is in
:mod:`coord._kazoo`).
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.handlers.threading import KazooTimeoutError

from coord._kazoo import KazooLogger, ReplyClock, client_options, run_bounded
from coord._znodes import zk_errors
from coord.errors import ConnectionLost, LifecycleError

log = logging.getLogger(__name__)
ROOT_PREFIX = "/latchwork"


class SessionState(enum.Enum):
    CONNECTED = "CONNECTED"
    SUSPENDED = "SUSPENDED"
    LOST = "LOST"


SessionListener = Callable[[SessionState], None]


class _Lifecycle(enum.Enum):
    LATENT = "LATENT"
    STARTED = "STARTED"
    CLOSED = "CLOSED"


def cluster_root(cluster: str) -> str:
    return f"{ROOT_PREFIX}/{cluster}"


class Session:
    """A kazoo client chrooted at ``/latchwork/<cluster>`` (below any chroot already in ``hosts``).

    ``auth`` is ``"user:password"``: the client authenticates with digest and every znode it
    creates gets an ACL that gives that user all rights and nobody else anything.
    ``tls_ca`` (a PEM file) makes it connect over TLS (the servers' ``secureClientPort``),
    checking the server's certificate against that CA, and presenting ``tls_cert`` /
    ``tls_key`` when the server asks for a client certificate.

    Failure: ``start()`` raises :class:`ConnectionLost` when ZooKeeper cannot be reached within
    ``connect_timeout``; a second ``start()`` raises :class:`LifecycleError`.
    """

    def __init__(self, hosts: str, cluster: str = "default", timeout: float = 10.0,
                 auth: str | None = None, connect_timeout: float = 30.0,
                 margin: float | None = None, tls_ca: str | None = None,
                 tls_cert: str | None = None, tls_key: str | None = None) -> None:
        self.hosts = hosts
        #: how long before the server could expire it the session is declared lost (seconds;
        #: default a fifth of the negotiated timeout)
        self.margin = margin
        self.cluster = cluster
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.root = cluster_root(cluster)
        self._auth = auth
        self._tls = (tls_ca, tls_cert, tls_key)
        self._lifecycle = _Lifecycle.LATENT
        self._state = SessionState.LOST
        self._session_id: int | None = None
        self._listeners: list[SessionListener] = []
        self._events: queue.Queue[tuple[str, Any] | None] = queue.Queue()
        self._dispatcher: threading.Thread | None = None
        self._watchdog: threading.Thread | None = None
        self._replies = ReplyClock(self._span)
        self._lost_locally: int | None = None  # session id we declared LOST ourselves
        # A logger of our own for kazoo, not registered with logging (it goes with the Session);
        # its records still reach kazoo's handlers through the parent.
        self._logger = KazooLogger(f"kazoo.client.latchwork.{id(self):x}")
        self._changed = threading.Condition()
        self._client: KazooClient | None = None

    # -- configuration ---------------------------------------------------------------------

    def _client_options(self) -> dict[str, Any]:
        return client_options(self.timeout, self._logger, self._auth, *self._tls)

    def _ensure_root(self) -> None:
        """kazoo needs the chroot to exist before it connects to it."""
        bootstrap = KazooClient(hosts=self.hosts, **self._client_options())
        try:
            with zk_errors(f"cannot reach ZooKeeper at {self.hosts}"):
                try:
                    bootstrap.start(timeout=self.connect_timeout)
                except KazooTimeoutError:
                    why = self._logger.last_drop
                    if why is None:
                        raise
                    raise ConnectionLost(f"cannot reach ZooKeeper at {self.hosts}: the last "
                                         f"attempt failed: {why}") from None
                bootstrap.ensure_path(self.root)
        finally:
            bootstrap.stop()
            bootstrap.close()

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> Session:
        if self._lifecycle is not _Lifecycle.LATENT:
            raise LifecycleError(f"session is {self._lifecycle.value}; start() works once")
        self._lifecycle = _Lifecycle.STARTED
        self._ensure_root()
        self._client = KazooClient(hosts=f"{self.hosts}{self.root}", **self._client_options())
        self._replies.attach(self._client)
        self._replies.reset()
        self._client.add_listener(self._on_kazoo_state)
        self._dispatcher = threading.Thread(target=self._dispatch, daemon=True,
                                            name=f"coord-session-{self.cluster}")
        self._dispatcher.start()
        try:
            self._client.start(timeout=self.connect_timeout)
        except KazooTimeoutError as exc:
            self.close()
            raise ConnectionLost(f"cannot reach ZooKeeper at {self.hosts} within "
                                 f"{self.connect_timeout}s") from exc
        # kazoo's CONNECTED event may still be in the queue; the state is CONNECTED now.
        self._replies.reset()
        self._set_state(SessionState.CONNECTED, notify=False)
        self._session_id = self._client.client_id[0]
        self._watchdog = threading.Thread(target=self._watch_deadline, daemon=True,
                                          name=f"coord-session-deadline-{self.cluster}")
        self._watchdog.start()
        return self

    def close(self) -> None:
        """Close the session: ephemeral nodes go at once (not after the timeout)."""
        if self._lifecycle is _Lifecycle.CLOSED:
            return
        self._lifecycle = _Lifecycle.CLOSED
        if self._client is not None:
            self._client.remove_listener(self._on_kazoo_state)
            self._client.stop()
            self._client.close()
        self._events.put(None)
        if self._dispatcher is not None and self._dispatcher is not threading.current_thread():
            self._dispatcher.join(10)
        self._set_state(SessionState.LOST, notify=False)

    def __enter__(self) -> Session:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tidy(self, what: str, fn: Callable[[], Any], timeout: float | None = None) -> bool:
        """A recipe's tidying on close (deleting its own znodes): ``fn()`` if the session is
        CONNECTED, given at most ``timeout`` seconds (the session timeout when None); True when
        it finished. Otherwise False, and ``what`` was left: an ephemeral node goes with the
        session's expiry, a mailbox is pruned by the master. A close never waits for a
        ZooKeeper that does not answer: kazoo holds a request sent into a silent link until it
        drops the connection, then retries it, and holds a request queued while it is
        disconnected until it reconnects, for ever in a partition (a node stopped by SIGTERM
        then never exited). ``fn`` runs on a daemon thread of its own, left behind if it does
        not finish; it must raise nothing but kazoo's errors (logged here)."""
        if self._state is not SessionState.CONNECTED or self._lifecycle is not \
                _Lifecycle.STARTED:
            log.info("%s: ZooKeeper not connected (%s): left", what, self._state.value)
            return False
        return run_bounded(what, fn, self.timeout if timeout is None else timeout)

    # -- accessors -------------------------------------------------------------------------

    @property
    def client(self) -> KazooClient:
        if self._client is None or self._lifecycle is not _Lifecycle.STARTED:
            raise LifecycleError("session is not started")
        return self._client

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def session_id(self) -> int | None:
        """The id of the current ZooKeeper session (a new one after LOST)."""
        return self._session_id

    @property
    def deadline(self) -> float:
        """``time.monotonic()`` at which the session is declared LOST unless the server sends
        something before: the last reply plus the negotiated timeout, less the margin."""
        return self._replies.last + self._span()

    def _span(self) -> float:
        timeout = self.negotiated_timeout
        return timeout - (timeout / 5 if self.margin is None else self.margin)

    def expired(self, session_id: int | None = None) -> bool:
        """Whether nothing may be done any more on the strength of this session: it is LOST,
        its deadline has passed, or it is no longer the session ``session_id`` (when given).

        A clock read, no server call and no thread: a thread that runs first after a pause
        longer than the session (SIGSTOP, a GC pause, a starved process) knows at once, before
        the watchdog has declared the session LOST. SUSPENDED within the deadline is not
        expired: the session and its ephemeral nodes may well still be there."""
        if self._state is SessionState.LOST or self._past_deadline():
            return True
        return session_id is not None and session_id != self._session_id

    def _past_deadline(self) -> bool:
        return self._replies.lapsed or time.monotonic() >= self.deadline

    def confirm(self) -> bool:
        """Whether the session is still valid, waiting while it is SUSPENDED.

        SUSPENDED means unknown, not lost (a ZooKeeper leader election, a rolling restart):
        until the session's deadline its ephemeral nodes, and so every lock, are still there.
        So this waits, at most until that deadline, for RECONNECTED (True) or LOST (False);
        CONNECTED is True at once, LOST or a passed deadline False at once."""
        with self._changed:
            while not self.expired():
                if self._state is SessionState.CONNECTED:
                    return True
                self._changed.wait(max(0.001, self.deadline - time.monotonic()))
        return False

    @property
    def negotiated_timeout(self) -> float:
        """Seconds, as granted by the server (the requested value until the first connect)."""
        ms = self._logger.ms
        return self.timeout if ms is None else ms / 1000.0

    def add_listener(self, listener: SessionListener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: SessionListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def require_connected(self) -> None:
        """Raise :class:`ConnectionLost` unless the session is CONNECTED."""
        if self._state is not SessionState.CONNECTED:
            raise ConnectionLost(f"ZooKeeper session is {self._state.value}")

    def wait_for(self, state: SessionState, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._state is not state:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
        return True

    # -- state machine (kazoo thread -> queue -> dispatch thread) ----------------------------

    def _on_kazoo_state(self, state: str) -> None:
        # kazoo's connection thread: never block here.
        client = self._client
        session_id = client.client_id[0] if client is not None and client.client_id else None
        self._events.put(("kazoo", (state, session_id)))

    def _dispatch(self) -> None:
        while True:
            event = self._events.get()
            if event is None:
                return
            kind, payload = event
            try:
                if kind == "kazoo":
                    self._handle_kazoo(*payload)
                elif kind == "deadline":
                    self._handle_deadline(payload)
            except Exception:
                log.exception("session %s: error while handling %s", self.cluster, event)

    def _handle_kazoo(self, state: str, session_id: int | None) -> None:
        if self._lifecycle is not _Lifecycle.STARTED:
            return
        if state == KazooState.SUSPENDED:
            if self._state is SessionState.CONNECTED:
                self._set_state(SessionState.SUSPENDED)
        elif state == KazooState.LOST:
            self._set_state(SessionState.LOST)
        elif state == KazooState.CONNECTED:
            if self._lost_locally is not None and session_id == self._lost_locally:
                # The session we declared lost came back: close it (its ephemeral nodes go)
                # and start a fresh one. kazoo then reports LOST and CONNECTED again.
                log.warning("session 0x%x came back after it was declared lost; replacing it",
                            session_id)
                self._replace_session()
                return
            if self._replies.lapsed and session_id == self._session_id:
                # back on the same session, but only after a gap past its deadline (the
                # process was paused): every recipe must treat it as lost, so it is
                self._handle_deadline(session_id)
                return
            self._lost_locally = None
            self._session_id = session_id
            self._replies.reset()
            self._set_state(SessionState.CONNECTED)

    def _watch_deadline(self) -> None:
        """Watchdog thread: asks the dispatch thread to declare the session LOST once its
        deadline passed (checked every twentieth of the timeout, at most every 100 ms)."""
        while self._lifecycle is _Lifecycle.STARTED:
            time.sleep(min(0.1, self.negotiated_timeout / 20))
            if self._state is not SessionState.LOST and self._past_deadline():
                self._events.put(("deadline", self._session_id))
                with self._changed:  # once per declaration: wait until it is handled
                    self._changed.wait_for(
                        lambda: self._state is SessionState.LOST
                        or not self._past_deadline()
                        or self._lifecycle is not _Lifecycle.STARTED, timeout=1.0)

    def _handle_deadline(self, session_id: int | None) -> None:
        if self._lifecycle is not _Lifecycle.STARTED or self._state is SessionState.LOST \
                or session_id != self._session_id or not self._past_deadline():
            return
        silent = time.monotonic() - self._replies.last
        log.warning("session 0x%x: %s (session timeout %.1fs): declaring it LOST before the "
                    "server can expire it", session_id or 0,
                    "a gap past its deadline between two messages from ZooKeeper (a pause?)"
                    if self._replies.lapsed else f"nothing from ZooKeeper for {silent:.1f}s",
                    self.negotiated_timeout)
        self._lost_locally = session_id
        self._set_state(SessionState.LOST)
        if self.client.state == KazooState.CONNECTED:
            # kazoo has not noticed yet (or the process was starved): make the session go
            self._replace_session()

    def _replace_session(self) -> None:
        """Close the current ZooKeeper session and let kazoo open a new one, without blocking
        the dispatch thread (a stop waits for the close, which a partition delays)."""
        client = self.client

        def replace() -> None:
            try:
                client.stop()
                if self._lifecycle is _Lifecycle.STARTED:
                    client.start_async()
            except Exception:
                log.exception("session %s: replacing the session failed", self.cluster)

        threading.Thread(target=replace, daemon=True,
                         name=f"coord-session-replace-{self.cluster}").start()

    def _set_state(self, state: SessionState, notify: bool = True) -> None:
        with self._changed:
            if self._state is state:
                return
            self._state = state
            self._changed.notify_all()
        if not notify:
            return
        log.info("session %s (0x%x): %s", self.cluster, self._session_id or 0, state.value)
        for listener in list(self._listeners):
            try:
                listener(state)
            except Exception:
                log.exception("session listener %r failed on %s", listener, state.value)
