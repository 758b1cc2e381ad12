"""An in-memory transport for handlers' unit tests: the dispatchers' own policy
(:mod:`messaging.dispatch`, :mod:`messaging.paradigms`) driven without a broker or ZooKeeper
(dramatiq's ``StubBroker`` is the model: the real worker over a transport in memory).

* :class:`MemoryTree` and :class:`MemoryTransaction`: znodes in a dict, and a transaction with
  kazoo's semantics (all or nothing; the commit's results hold the failing operation's
  ``NoNodeError`` / ``NodeExistsError`` / ``BadVersionError`` and ``RolledBackError`` for the
  others), so a handler's ``ctx.transaction()`` is the same code against it;
* :class:`MemoryProcessedLog`: the processed-id record (:class:`~messaging.processed.ProcessedLog`)
  on a :class:`MemoryTree`, as :class:`~messaging.processed.ZkProcessedLog` keeps it;
* :class:`StubLatch`: a leadership a test holds or loses (:meth:`StubLatch.lose`), whose election
  node lives in the tree (a transaction fenced by it fails once it is lost);
* :class:`RecordingPublisher`: what the dispatcher publishes (answers, dead letters, retries),
  kept instead of sent;
* :func:`delivery`: a delivery of an envelope whose decision (ack, reject, requeue) is recorded.

What it cannot show is the broker and the cluster: a redelivery after a master's death, a
connection lost, another node. Those stay in the real-server tests.

Why one module: it is one transport: the processed log and the latch's election node live in
the one tree the transactions change, and a stub uses every part of it together.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pika
from kazoo.exceptions import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
)

from coord import LeaderLatch, SessionState
from messaging.delivery import Delivery, DeliveryState
from messaging.envelope import Envelope
from messaging.processed import HANDLING, PROCESSED, Claim
from messaging.publisher import Publisher


@dataclass
class _Znode:
    data: bytes
    version: int = 0


class MemoryTree:
    """Znodes in memory: ``/`` exists; a node's parent must exist (as in ZooKeeper)."""

    def __init__(self) -> None:
        self.nodes: dict[str, _Znode] = {"/": _Znode(b"")}
        self._sequence = itertools.count()
        self.lock = threading.RLock()

    def exists(self, path: str) -> bool:
        with self.lock:
            return path in self.nodes

    def get(self, path: str) -> bytes:
        with self.lock:
            if path not in self.nodes:
                raise NoNodeError(path)
            return self.nodes[path].data

    def children(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        with self.lock:
            return sorted(p[len(prefix):] for p in self.nodes
                          if p.startswith(prefix) and "/" not in p[len(prefix):])

    def ensure_path(self, path: str) -> None:
        with self.lock:
            parts = [p for p in path.split("/") if p]
            for i in range(1, len(parts) + 1):
                self.nodes.setdefault("/" + "/".join(parts[:i]), _Znode(b""))

    def create(self, path: str, value: bytes = b"", sequence: bool = False) -> str:
        with self.lock:
            if sequence:
                path = f"{path}{next(self._sequence):010d}"
            parent = path.rsplit("/", 1)[0] or "/"
            if parent not in self.nodes:
                raise NoNodeError(parent)
            if path in self.nodes:
                raise NodeExistsError(path)
            self.nodes[path] = _Znode(value)
            return path

    def set(self, path: str, value: bytes, version: int = -1) -> None:
        with self.lock:
            node = self._versioned(path, version)
            node.data, node.version = value, node.version + 1

    def delete(self, path: str, version: int = -1) -> None:
        with self.lock:
            self._versioned(path, version)
            if self.children(path):
                raise NotEmptyError(path)
            del self.nodes[path]

    def check(self, path: str, version: int = -1) -> None:
        with self.lock:
            self._versioned(path, version)

    def _versioned(self, path: str, version: int) -> _Znode:
        if path not in self.nodes:
            raise NoNodeError(path)
        node = self.nodes[path]
        if version != -1 and node.version != version:
            raise BadVersionError(path)
        return node

    def transaction(self) -> MemoryTransaction:
        return MemoryTransaction(self)


class MemoryTransaction:
    """kazoo's ``TransactionRequest`` on a :class:`MemoryTree`: operations added, then
    ``commit()`` applies all of them or none; its results are each operation's (the path
    created, or True), or, when one fails, its exception at its place and ``RolledBackError``
    at the others'."""

    def __init__(self, tree: MemoryTree) -> None:
        self.tree = tree
        self.operations: list[tuple[str, tuple[Any, ...]]] = []

    def create(self, path: str, value: bytes = b"", acl: Any = None, ephemeral: bool = False,
               sequence: bool = False) -> None:
        self.operations.append(("create", (path, value, sequence)))

    def delete(self, path: str, version: int = -1) -> None:
        self.operations.append(("delete", (path, version)))

    def set_data(self, path: str, value: bytes, version: int = -1) -> None:
        self.operations.append(("set", (path, value, version)))

    def check(self, path: str, version: int) -> None:
        self.operations.append(("check", (path, version)))

    def commit(self) -> list[Any]:
        with self.tree.lock:
            saved = {path: _Znode(node.data, node.version)
                     for path, node in self.tree.nodes.items()}
            results: list[Any] = []
            for i, (what, args) in enumerate(self.operations):
                try:
                    result = getattr(self.tree, what)(*args)
                except (NoNodeError, NodeExistsError, BadVersionError, NotEmptyError) as exc:
                    self.tree.nodes = saved
                    return [*(RolledBackError() for _ in range(i)), exc,
                            *(RolledBackError() for _ in self.operations[i + 1:])]
                results.append(result if what == "create" else True)
            return results


class MemoryProcessedLog:
    """The processed-id record on a :class:`MemoryTree`, kept as
    :class:`~messaging.processed.ZkProcessedLog` keeps it (a claim node while a copy is being
    handled, a record with the reply once it was): a second copy of an id is a duplicate."""

    def __init__(self, tree: MemoryTree) -> None:
        self.tree = tree
        tree.ensure_path(PROCESSED)
        tree.ensure_path(HANDLING)

    def contains(self, message_id: uuid.UUID) -> bool:
        return self.tree.exists(f"{PROCESSED}/{message_id}")

    def claim(self, message_id: uuid.UUID, member_id: str, command: str = "") -> Claim:
        if self.contains(message_id):
            return Claim.DONE
        try:
            self.tree.create(f"{HANDLING}/{message_id}", json.dumps(
                {"member": member_id, "command": command, "at": time.time()}).encode())
        except NodeExistsError:
            return Claim.BUSY
        return Claim.CLAIMED

    def wait_released(self, message_id: uuid.UUID, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while self.tree.exists(f"{HANDLING}/{message_id}"):
            if time.monotonic() > end:
                return False
            time.sleep(0.01)
        return True

    def release(self, message_id: uuid.UUID) -> None:
        try:
            self.tree.delete(f"{HANDLING}/{message_id}")
        except NoNodeError:
            pass

    def record(self, message_id: uuid.UUID, member_id: str,
               reply: dict[str, Any] | None = None) -> bool:
        node = f"{PROCESSED}/{message_id}"
        data = json.dumps({"member": member_id, "at": time.time(),
                           **({"reply": reply} if reply is not None else {})}).encode()
        try:
            self.tree.create(node, data)
            recorded = True
        except NodeExistsError:  # the handler's own transaction recorded it
            recorded = False
            if reply is not None:
                self.tree.set(node, data)
        self.release(message_id)
        return recorded

    def reply_of(self, message_id: uuid.UUID) -> dict[str, Any] | None:
        try:
            reply = json.loads(self.tree.get(f"{PROCESSED}/{message_id}") or b"{}").get("reply")
        except NoNodeError:
            return None
        return reply if isinstance(reply, dict) else None

    def transaction(self, message_id: uuid.UUID, member_id: str,
                    fence: str | None = None) -> MemoryTransaction:
        txn = self.tree.transaction()
        if fence is not None:
            txn.check(fence, -1)
        txn.create(f"{PROCESSED}/{message_id}", json.dumps(
            {"member": member_id, "at": time.time()}).encode())
        return txn


class _StubSession:
    state = SessionState.CONNECTED

    def expired(self, session_id: int | None = None) -> bool:
        return False


class StubLatch(LeaderLatch):
    """A leadership held in a :class:`MemoryTree` (its election node under ``/election``)
    until :meth:`lose`; :meth:`gain` wins it again with a new node (a new fence)."""

    def __init__(self, tree: MemoryTree, participant_id: str) -> None:
        self.tree = tree
        self.participant_id = participant_id
        self.session = _StubSession()  # type: ignore[assignment]
        self._listeners: list[tuple[Callable[[], object] | None,
                                    Callable[[], object] | None]] = []
        self._node: str | None = None
        tree.ensure_path("/election")

    @property
    def is_leader(self) -> bool:
        return self._node is not None

    @property
    def node(self) -> str | None:
        return self._node

    def add_listener(self, on_gain: Callable[[], object] | None = None,
                     on_loss: Callable[[], object] | None = None) -> None:
        self._listeners.append((on_gain, on_loss))

    def gain(self) -> None:
        if self._node is None:
            self._node = self.tree.create("/election/n_", sequence=True)
            for on_gain, _ in self._listeners:
                if on_gain is not None:
                    on_gain()

    def lose(self) -> None:
        """Leadership lost (the session that won it gone): the election node goes, and the
        consumer is told (its running handlers see ``ctx.cancelled``)."""
        node, self._node = self._node, None
        if node is None:
            return
        self.tree.delete(node)
        for _, on_loss in self._listeners:
            if on_loss is not None:
                on_loss()


@dataclass
class Published:
    """One publish the dispatcher made."""
    exchange: str
    routing_key: str
    body: bytes
    headers: dict[str, Any]
    correlation_id: str | None


class RecordingPublisher(Publisher):
    """Keeps what is published (``published``) instead of sending it."""

    def __init__(self) -> None:
        self.published: list[Published] = []
        self._closed = False

    def publish(self, exchange: str, routing_key: str, body: Envelope | bytes, *,
                persistent: bool = True, mandatory: bool = True,
                headers: dict[str, Any] | None = None, expiration_ms: int | None = None,
                reply_to: str | None = None, correlation_id: str | None = None,
                message_id: str | None = None, deadline: float | None = None) -> None:
        data = body.encode() if isinstance(body, Envelope) else body
        self.published.append(Published(exchange, routing_key, data, dict(headers or {}),
                                        correlation_id))

    def close(self) -> None:
        self._closed = True


@dataclass
class Decided:
    """A delivery's decision, as the consumer's connection thread would carry it out."""
    states: list[DeliveryState] = field(default_factory=list)

    def settle(self, delivery: Delivery, state: DeliveryState) -> None:
        self.states.append(state)


_tags = itertools.count(1)


def delivery(envelope: Envelope, queue: str, decided: Decided, *, reply_to: str | None,
             headers: dict[str, Any] | None = None, redelivered: bool = False) -> Delivery:
    """``envelope`` as the consumer would receive it from ``queue``; its decision goes to
    ``decided``."""
    props = pika.BasicProperties(content_type="application/json", headers=headers or {},
                                 reply_to=reply_to, correlation_id=str(envelope.id),
                                 message_id=str(envelope.id))
    return Delivery(envelope.encode(), next(_tags), redelivered, props, queue, 0,
                    decided.settle)
