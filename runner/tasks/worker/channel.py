"""The channel between the node and one of its handler processes (process isolation,
:mod:`runner.tasks.worker.isolated` and :mod:`runner.tasks.worker.child`): pickled messages
over a ``multiprocessing`` socket pair.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
from multiprocessing.connection import Connection
from typing import Any


class Channel:
    """One end of a handler process's socket: pickled messages, each framed by its length and
    sent in one write, read with as few reads as the kernel allows (one, for a message that
    fits the socket's buffer). ``multiprocessing``'s ``Connection`` reads a header and a body
    apart, and its ``poll`` builds a selector per call: each a system call, and each a hand-off
    of the node's GIL, per message.

    Failure behaviour: a peer gone raises ``EOFError`` from :meth:`recv` (its end closed, or
    this end shut by :meth:`shut`) and ``OSError`` (a broken pipe) from :meth:`send`."""

    HEADER = struct.Struct("!I")

    def __init__(self, conn: Connection) -> None:
        self._conn = conn  # it owns the descriptor: closed with it
        self._fd = conn.fileno()
        self._buffer = bytearray()

    def send(self, message: Any) -> None:
        data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
        view = memoryview(self.HEADER.pack(len(data)) + data)
        while view:
            view = view[os.write(self._fd, view):]

    def recv(self) -> Any:
        buffer = self._buffer
        while True:
            if len(buffer) >= 4:
                (size,) = self.HEADER.unpack_from(buffer)
                if len(buffer) >= 4 + size:
                    message = pickle.loads(buffer[4:4 + size])
                    del buffer[:4 + size]
                    return message
                need = 4 + size - len(buffer)
            else:
                need = 4 - len(buffer)
            chunk = os.read(self._fd, max(need, 65536))
            if not chunk:
                raise EOFError("the channel's other end is closed")
            buffer += chunk

    def shut(self) -> None:
        """End both directions of the socket (not only this descriptor): a thread blocked in
        :meth:`recv` on it gets ``EOFError`` at once."""
        try:
            with socket.socket(fileno=os.dup(self._fd)) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self._conn.close()
