"""A loopback TCP proxy whose connections a test can cut or silence: network faults on demand.

Clients connect to ``proxy.port``; bytes are relayed to ``target_port``.

* ``drop_connections()`` closes every relayed connection at once (the client sees a dropped
  socket and reconnects; its ZooKeeper session survives if it reconnects within the session
  timeout);
* ``blackhole()`` is a silent partition: nothing is relayed either way and nothing is closed,
  so neither side sees an error, only silence (new connections are accepted and then hear
  nothing). ``heal()`` resumes relaying; the bytes held meanwhile are delivered then, as TCP
  retransmission would after a real partition heals.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading

from coord.testing.processes import LOOPBACK


class TcpProxy:
    def __init__(self, target_port: int, target_host: str = LOOPBACK) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server((LOOPBACK, 0))
        self.port = int(self._listener.getsockname()[1])
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._open = threading.Event()  # cleared while black-holed
        self._open.set()
        self._thread = threading.Thread(target=self._accept, daemon=True, name="tcp-proxy")
        self.drops = 0

    def start(self) -> TcpProxy:
        self._thread.start()
        return self

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        while not self._open.wait(0.2):  # black-holed: the client hears nothing
            if self._closed.is_set():
                client.close()
                return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()
            return
        pair = (client, upstream)
        with self._lock:
            self._pairs.add(pair)
        self._relay(pair)

    def _relay(self, pair: tuple[socket.socket, socket.socket]) -> None:
        a, b = pair
        selector = selectors.DefaultSelector()
        try:
            selector.register(a, selectors.EVENT_READ, b)
            selector.register(b, selectors.EVENT_READ, a)
            while True:
                if not self._open.is_set():  # black-holed: hold every byte, close nothing
                    if self._closed.is_set():
                        return
                    self._open.wait(0.2)
                    continue
                for key, _ in selector.select(timeout=0.2):
                    if not self._open.is_set():
                        break
                    source: socket.socket = key.fileobj  # type: ignore[assignment]
                    data = source.recv(65536)
                    if not data:
                        return
                    key.data.sendall(data)
                if self._closed.is_set():
                    return
        except (OSError, ValueError):
            return
        finally:
            selector.close()
            self._close_pair(pair)

    def _close_pair(self, pair: tuple[socket.socket, socket.socket]) -> None:
        with self._lock:
            self._pairs.discard(pair)
        for sock in pair:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def drop_connections(self) -> int:
        """Cut every relayed connection; returns how many were cut."""
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            self._close_pair(pair)
        self.drops += len(pairs)
        return len(pairs)

    def blackhole(self) -> None:
        """Start a silent partition: relay nothing, close nothing."""
        self._open.clear()

    def heal(self) -> None:
        """End the partition: relay again, held bytes first."""
        self._open.set()

    @property
    def partitioned(self) -> bool:
        return not self._open.is_set()

    def close(self) -> None:
        self._closed.set()
        self._open.set()
        with contextlib.suppress(OSError):  # wakes the thread blocked in accept()
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self.drop_connections()
        self._thread.join(5)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
