"""A queue element's bytes and the queue's own errors: an element is its value (base64) and the
token of the push that wrote it, in a small JSON envelope; one element, and one
``push_many``, stay within ZooKeeper's node size (:data:`MAX_ELEMENT_BYTES`)."""

from __future__ import annotations

import base64
import json
import re

from coord.errors import CoordError

#: ZooKeeper's default jute.maxbuffer is 1 MiB; the JSON envelope and base64 take a third more
MAX_ELEMENT_BYTES = 700_000


class QueueError(CoordError):
    """Root of the queue's own errors."""


class QueueConflict(QueueError):
    """``push_at`` found another value at its index."""

    def __init__(self, queue: str, index: int) -> None:
        super().__init__(f"queue {queue}: index {index} holds another value")
        self.index = index


class QueueElementTooLarge(QueueError, ValueError):
    """An element over :data:`MAX_ELEMENT_BYTES`: pass a reference instead."""


class QueueIndexExpired(QueueError, LookupError):
    """The index is below the queue's first kept index (pruned by retention)."""


def encode_element(value: bytes, token: str) -> bytes:
    if len(value) > MAX_ELEMENT_BYTES:
        raise QueueElementTooLarge(f"an element of {len(value)} bytes is over the limit of "
                                   f"{MAX_ELEMENT_BYTES}; store it elsewhere and push a "
                                   "reference")
    return json.dumps({"v": base64.b64encode(value).decode(), "t": token}).encode()


def decode_element(data: bytes) -> tuple[bytes, str]:
    doc = json.loads(data)
    return base64.b64decode(doc["v"]), str(doc["t"])


def push_datas(values: list[bytes], token: str) -> list[bytes]:
    """The elements of one :meth:`LockFreeQueue.push_many` (ValueError for a bad token,
    :class:`QueueElementTooLarge` for values over one push's limit)."""
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$", token):
        raise ValueError(f"invalid push token {token!r}")
    datas = [encode_element(value, f"{token}.{k}") for k, value in enumerate(values)]
    total = sum(len(data) for data in datas)
    if total > MAX_ELEMENT_BYTES:
        raise QueueElementTooLarge(f"{len(values)} values of {total} bytes in all are over "
                                   f"the limit of one push, {MAX_ELEMENT_BYTES}; push them "
                                   "in parts")
    return datas
