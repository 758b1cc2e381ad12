"""Liveness by connection: learn at once that another process is gone, not after a timeout.

The kernel closes every socket of a process that ends, kill -9 included: a peer blocked reading
a TCP connection to it gets end-of-file (or a reset) within a round trip, long before a
ZooKeeper session expires or any timing could tell a dead process from a slow one. So a process
that others may need to replace opens a :class:`Beacon` (a listening socket that only accepts
and holds connections) and publishes its address; a process that would replace it keeps one
connection to that address with a :class:`Watcher`, and steps in as soon as it closes.

What it can and cannot tell:

* it only ever says *gone*, never *alive*: a process frozen (SIGSTOP, a long pause), cut off
  by a partition, or on a host that lost power keeps its connections open or sends nothing,
  so the caller's own patience still decides those;
* a connection refused (nothing listens there any more) counts as gone: the process ended
  before the watcher connected; a connect that times out or cannot reach the host says
  nothing;
* a *gone* it reports for a live process (a beacon closed while its process runs on) may
  only make the caller step in early: the callers (:mod:`coord.exactly_once`) are safe to
  step at any time, so this decides how fast they recover, never what they produce.

A watcher names itself in its connection's first line; the beacon's :attr:`Beacon.successor`
is the first watcher still connected, so that its process can name, among those that would
replace it, the one that steps in at once (the others keep their patience and do not compete).
"""

from __future__ import annotations

import ipaddress
import logging
import selectors
import socket
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("coord.liveness")

#: how long a watcher waits for a connection to be accepted before it says nothing
CONNECT_TIMEOUT = 2.0


class Beacon:
    """A listening socket on ``host`` (port chosen by the system) that accepts and holds
    every connection until its peer closes it or the beacon is closed; :attr:`address` is
    ``host:port``. Nothing is ever sent: only the close matters."""

    #: the longest watcher name a beacon keeps reading for
    MAX_NAME = 256

    def __init__(self, host: str = "127.0.0.1") -> None:
        if host in ("", "0.0.0.0", "::"):
            raise ValueError(f"beacon host {host!r}: the address is published for others to "
                             "connect to; give one they reach, not a wildcard")
        self._server = socket.create_server((host, 0))
        self._server.setblocking(False)
        self.address = f"{host}:{self._server.getsockname()[1]}"
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._server, selectors.EVENT_READ)
        self._closed = threading.Event()
        #: the connected watchers' names, oldest connection first (b"" until its line came)
        self._peers: dict[socket.socket, bytes] = {}
        self._peers_lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name=f"beacon-{self.address}",
                                        daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed.is_set():
            for key, _ in self._selector.select(0.2):
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                if sock is self._server:
                    try:
                        peer, _ = sock.accept()
                    except OSError:
                        continue
                    peer.setblocking(False)
                    self._selector.register(peer, selectors.EVENT_READ)
                    with self._peers_lock:
                        self._peers[peer] = b""
                    continue
                try:
                    data = sock.recv(self.MAX_NAME)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:  # the watcher went (or looks elsewhere now)
                    self._selector.unregister(sock)
                    with self._peers_lock:
                        self._peers.pop(sock, None)
                    sock.close()
                    continue
                with self._peers_lock:
                    name = self._peers.get(sock, b"")
                    if len(name) < self.MAX_NAME:
                        self._peers[sock] = name + data

    @property
    def watchers(self) -> list[str]:
        """The names of the watchers connected now (a whole first line), oldest first."""
        with self._peers_lock:
            names = list(self._peers.values())
        return [n[:-1].decode(errors="replace") for n in names if n.endswith(b"\n")]

    @property
    def successor(self) -> str | None:
        """The first watcher still connected (:attr:`watchers`), or None."""
        return next(iter(self.watchers), None)

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._thread.join(2)
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self._selector.close()


class Watcher:
    """Keeps one connection to the address it follows; ``on_gone()`` is called (from its
    thread) when that connection closes or is refused, and :meth:`gone` says so from then on.
    Following another address drops the old connection without a word."""

    def __init__(self, on_gone: Callable[[], None], name: str = "") -> None:
        self.on_gone = on_gone
        self.name = name  # sent as the connection's first line
        self._lock = threading.Lock()
        self._address: str | None = None
        self._sock: socket.socket | None = None
        self._gone: set[str] = set()
        self._closed = False

    def follow(self, address: str) -> None:
        """Watch ``address`` (``host:port``) from now on; no-op when it already does."""
        with self._lock:
            if self._closed or address == self._address:
                return
            old, self._sock, self._address = self._sock, None, address
        if old is not None:
            _quietly_close(old)
        threading.Thread(target=self._watch, args=(address,), daemon=True,
                         name=f"watch-{address}").start()

    def drop(self) -> None:
        """Follow nobody (the connection goes without a word)."""
        with self._lock:
            sock, self._sock, self._address = self._sock, None, None
        if sock is not None:
            _quietly_close(sock)

    def gone(self, address: str | None) -> bool:
        with self._lock:
            return address in self._gone

    def _watch(self, address: str) -> None:
        host, port = _split(address)
        try:
            sock = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT)
        except ConnectionRefusedError:
            self._mark_gone(address)
            return
        except (OSError, ValueError) as exc:  # unreachable, timed out, malformed: no word
            log.debug("cannot watch %s: %s", address, exc)
            return
        sock.settimeout(None)
        try:
            sock.sendall(self.name.encode() + b"\n")
        except OSError:
            pass  # a reset: the recv below tells
        with self._lock:
            ours = self._address == address and not self._closed and self._sock is None
            if ours:  # (not dropped, and not beaten by a second follow of the same address)
                self._sock = sock
        if not ours:
            _quietly_close(sock)
            return
        try:
            while sock.recv(64):  # a beacon sends nothing: this returns at the close
                pass
        except OSError:
            pass  # a reset, or our own close of it
        with self._lock:
            ours = self._sock is sock
            if ours:
                self._sock = None
        if ours:  # not dropped by follow() or close(): the process at the other end went
            self._mark_gone(address)
        _quietly_close(sock)

    def _mark_gone(self, address: str) -> None:
        with self._lock:
            if self._closed:
                return
            self._gone.add(address)
        self.on_gone()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.drop()


def _split(address: str) -> tuple[str, str]:
    """``host:port`` (a beacon's address; an IPv6 host may come bracketed) as (host, port)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), port


def _loopback(address: str) -> bool:
    host = _split(address)[0]
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _quietly_close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)  # wakes a recv blocked on it in another thread
    except OSError:
        pass
    sock.close()


class Liveness:
    """A copy's beacon and its watch on the copy ahead, over the state documents the copies of
    :class:`~coord.exactly_once.ExactlyOnceHandler` write: each says who wrote it (``by``),
    where its beacon is (``at``) and which follower it names to step in first (``next``)."""

    def __init__(self, host: str, name: str, on_gone: Callable[[], None]) -> None:
        self.name = name
        self.beacon = Beacon(host)
        self.watcher = Watcher(on_gone, name)

    def stamp(self) -> dict[str, str | None]:
        """What this copy adds to every state it writes."""
        return {"at": self.beacon.address, "next": self.beacon.successor}

    def lead(self) -> None:
        """This copy is ahead now: it watches nobody, so that the beacon of the copy it
        followed does not name it as successor while it is not following."""
        self.watcher.drop()

    def follow(self, doc: dict[str, Any]) -> None:
        """Watch the beacon of the copy that wrote ``doc`` (unless it is this one). A loopback
        beacon of a copy on another host (its id's first field, the host name, differs) is
        out of reach, a cluster left on the loopback default: not followed, so nothing on this
        host's loopback is taken for it, and the patience decides."""
        at, by = doc.get("at"), str(doc.get("by"))
        if not at or by == self.name:
            return
        if _loopback(str(at)) and by.split(":")[0] != self.name.split(":")[0]:
            return
        self.watcher.follow(str(at))

    def ahead_gone(self, doc: dict[str, Any]) -> bool:
        """Whether the copy that wrote ``doc`` is known to be gone and this copy is the one to
        step in at once: the follower it named (the first whose watch its beacon held), or any
        when it named none. The others keep their patience and do not compete with it."""
        return doc.get("by") != self.name and doc.get("next") in (None, self.name) \
            and self.watcher.gone(doc.get("at"))

    def close(self) -> None:
        self.watcher.close()
        self.beacon.close()
