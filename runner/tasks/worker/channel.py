"""The channel between the node and one of its handler processes (process isolation,
:mod:`runner.tasks.worker.isolated` and :mod:`runner.tasks.worker.child`): pickled messages
over a ``multiprocessing`` socket pair, and :class:`Flat`, the records a job carries as plain
values (a task and an attempt cost a tenth of their pickled dataclasses to send, and nothing
to receive until the handler reads them).
"""

from __future__ import annotations

import dataclasses
import enum
import operator
import os
import pickle
import socket
import struct
import typing
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from typing import Any, Generic, TypeVar

D = TypeVar("D")


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


class Flat(Generic[D]):
    """A frozen dataclass as a tuple of plain values and back: its fields in order, an aware
    datetime as POSIX seconds (a float keeps microseconds exactly for the next centuries), an
    enum as its value; anything else as it is (pickled with the tuple). Pickling the dataclass
    itself goes through ``copyreg`` and reduces every datetime with its zone: ~40 us a task
    and attempt in the node, ~25 us to load in the child, against ~8 and ~0 here (a child
    that never reads ``ctx.task`` never builds it)."""

    def __init__(self, cls: type[D]) -> None:
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        hints = typing.get_type_hints(cls)
        self._cls = cls
        self._get = operator.attrgetter(*(f.name for f in fields))
        self._times = tuple(n for n, f in enumerate(fields)
                            if datetime in (hints[f.name], *typing.get_args(hints[f.name])))
        self._enums = tuple((n, hints[f.name]) for n, f in enumerate(fields)
                            if isinstance(hints[f.name], type)
                            and issubclass(hints[f.name], enum.Enum))

    def pack(self, record: D) -> tuple[Any, ...]:
        values = list(self._get(record))
        for n in self._times:
            when = values[n]
            if when is not None and when.tzinfo is not None:
                values[n] = when.timestamp()
        for n, _ in self._enums:
            values[n] = values[n].value
        return tuple(values)

    def unpack(self, values: tuple[Any, ...]) -> D:
        out = list(values)
        for n in self._times:
            if isinstance(out[n], float):
                out[n] = datetime.fromtimestamp(out[n], UTC)
        for n, kind in self._enums:
            out[n] = kind(out[n])
        return self._cls(*out)
