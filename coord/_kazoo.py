"""What a :class:`~coord.session.Session` changes of its kazoo client: its options, its logger
(which reads the negotiated session timeout kazoo logs and drops the narration nobody reads),
its threading handler (poll(2) instead of an epoll instance per wait), the clock of the last
message read from the server (the deadline the session keeps is counted from it), and a call
bounded in time however long kazoo holds it (:func:`run_bounded`)."""

from __future__ import annotations

import logging
import selectors
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.handlers.utils import selector_select
from kazoo.protocol.serialization import Auth
from kazoo.security import make_digest_acl

log = logging.getLogger("coord.session")
BLATHER = 5  # kazoo's most verbose level; it logs the negotiated timeout there


class KazooLogger(logging.Logger):
    """kazoo's logger for one Session; reads the negotiated session timeout on the way.

    kazoo computes the timeout on connect but keeps only the requested value; it logs it at
    BLATHER in its "Session created" record, which this logger reads (and drops). Everything else
    goes to kazoo's usual handlers, if the level configured for ``kazoo.client`` lets it
    through, and is checked before a record is made: kazoo narrates every request at BLATHER
    or DEBUG, and building those records cost a node more CPU than its task locks' own code.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name, BLATHER)
        self.parent = logging.getLogger("kazoo.client")
        self.ms: int | None = None
        #: why kazoo's last connection attempt failed (a refused TLS handshake, a reset), for
        #: the error a start that cannot connect raises
        self.last_drop: str | None = None

    def isEnabledFor(self, level: int) -> bool:
        return self.parent is not None and self.parent.isEnabledFor(level)

    def warning(self, msg: object, *args: object, **kwargs: Any) -> None:
        if isinstance(msg, str) and msg.startswith("Connection dropped") and args:
            self.last_drop = str(args[0])
        super().warning(msg, *args, **kwargs)

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if level == BLATHER and isinstance(msg, str) and msg.startswith("Session created") \
                and len(args) >= 3:
            try:
                self.ms = int(str(args[2]))
            except (TypeError, ValueError):
                pass
            return
        if not self.isEnabledFor(level):  # kazoo narrates every request: nothing made of it
            return
        # kazoo narrates the digest credentials it sends ("Sending request: Auth(...)")
        args = tuple(arg._replace(auth="***") if isinstance(arg, Auth) else arg for arg in args)
        super().log(level, msg, *args, **kwargs)


class PollSelectors:
    """The ``selectors`` names kazoo's ``selector_select`` uses, with poll(2) as the selector."""

    EVENT_READ = selectors.EVENT_READ
    EVENT_WRITE = selectors.EVENT_WRITE
    DefaultSelector = selectors.PollSelector


class PollHandler(SequentialThreadingHandler):  # type: ignore[misc]
    """kazoo's threading handler, waiting on its socket with poll(2) instead of a new epoll
    instance per wait (create, register, wait, close: four system calls where poll needs one).
    Its connection loop waits dozens of times per task; like epoll, poll has no fd limit."""

    def select(self, *args: Any, **kwargs: Any) -> Any:
        return selector_select(*args, selectors_module=PollSelectors, **kwargs)


class ReplyClock:
    """When the server last sent a message (a reply, a ping answer, a watch event).

    kazoo reads every message from the server through its connection's ``_read_socket``; the
    clock wraps that method of one client's connection and notes the time after each message
    read whole (a socket closed by the server, an error, is no message).

    ``lapsed``: a message arrived later than ``span()`` after the one before (the process was
    paused, or starved, past the session's deadline). A message read after such a gap may have
    sat in the socket since before it, so it must not make the deadline look fresh: the gap is
    remembered until the session is replaced or :meth:`reset`."""

    def __init__(self, span: Callable[[], float]) -> None:
        self.last = time.monotonic()
        self.lapsed = False
        self._span = span

    def reset(self) -> None:
        self.last = time.monotonic()
        self.lapsed = False

    def attach(self, client: KazooClient) -> None:
        connection = client._connection
        read = connection._read_socket

        def read_and_note(*args: Any, **kwargs: Any) -> Any:
            result = read(*args, **kwargs)
            now = time.monotonic()
            if now >= self.last + self._span():
                self.lapsed = True
            self.last = now
            return result

        connection._read_socket = read_and_note


def client_options(timeout: float, logger: KazooLogger, auth: str | None, ca: str | None,
                   cert: str | None, key: str | None) -> dict[str, Any]:
    """The options of a session's kazoo client: its logger and poll handler, reconnections
    for ever, digest credentials (every znode gets an ACL for that user alone) and TLS."""
    # Reconnect forever (the deadline decides when the session is LOST), and never wait
    # longer than a tenth of the session between tries: after a ZooKeeper leader election
    # the survivors serve again within a second, and a backoff grown towards kazoo's usual
    # cap can sleep past the deadline of a short session the election itself left alive
    # (seen: tries at +0.0, +0.10, +0.25, +0.62 s, then none until a 2 s session's
    # deadline at +1.33 s, although the new leader served from about +0.7 s).
    retry = {"max_tries": -1, "max_delay": min(1.0, timeout / 10)}
    options: dict[str, Any] = {"timeout": timeout, "logger": logger,
                               "handler": PollHandler(), "connection_retry": retry}
    if auth is not None:
        user, _, password = auth.partition(":")
        options["auth_data"] = [("digest", auth)]
        options["default_acl"] = [make_digest_acl(user, password, all=True)]
    if ca is not None:
        options.update(use_ssl=True, verify_certs=True, ca=ca, certfile=cert, keyfile=key)
    return options


def run_bounded(what: str, fn: Callable[[], Any], timeout: float) -> bool:
    """``fn()`` on a daemon thread of its own, waited for ``timeout`` seconds and left behind
    if it does not finish (kazoo holds a request in a silent link for as long as it lasts);
    whether it finished. Its errors (kazoo's) are logged: ``what`` was left."""
    done = threading.Event()

    def run() -> None:
        try:
            fn()
            done.set()
        except Exception as exc:  # kazoo's errors: what is left goes as said above
            log.warning("%s: %r; left", what, exc)

    thread = threading.Thread(target=run, daemon=True, name="coord-tidy")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        log.warning("%s: no answer from ZooKeeper in time; left", what)
    return done.is_set()
