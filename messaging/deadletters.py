"""The dead-letter queue, for operators: look at what was rejected and why, and replay it.

Every rejected message is a copy in ``<prefix>.dead`` with ``x-latchwork-reason``,
``x-latchwork-detail``, the queue it came from, the member that rejected it and when
(:mod:`messaging.dispatch`). :class:`DeadLetterQueue` reads them without taking them away
(every message read is given back with ``basic_nack(requeue=True)`` before the call returns)
and replays one: the same body, with the same message id, is published (confirmed) to the
queue it came from, and only then is the dead copy acked. Because the id is kept, a replayed
MASTER message that had in fact been handled is recognised by the processed log and acked as a
duplicate: idempotency holds.

Failure behaviour: no broker raises :class:`~messaging.errors.BrokerUnavailable`; a replay of
an id that is not in the queue raises :class:`DeadLetterNotFound`; a replay whose publish is not
confirmed leaves the dead copy in place (it is acked only after the confirm), so a message is
never lost by a replay, at worst present twice.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pika

from messaging.connection import CONNECTION_ERRORS, Connector, still_open, translated
from messaging.envelope import parse_json
from messaging.errors import EnvelopeError, MessagingError
from messaging.outcomes import DETAIL_HEADER, REASON_HEADER
from messaging.topology import Topology

QUEUE_HEADER = "x-latchwork-queue"
MEMBER_HEADER = "x-latchwork-member"
DEAD_AT_HEADER = "x-latchwork-dead-at"
REPLAYED_HEADER = "x-latchwork-replayed"


class DeadLetterNotFound(MessagingError):
    """No dead-lettered message has this id."""

    error_code = "dead_letter_not_found"


@dataclass(frozen=True)
class DeadLetter:
    message_id: str | None
    reason: str
    detail: str
    queue: str  # where it was rejected from
    member: str
    dead_at: str
    command: str | None  # when the body is an envelope
    body: bytes
    headers: dict[str, Any]
    properties: Any

    def view(self, body_limit: int = 4000) -> dict[str, Any]:
        """JSON for people and ``--json``: the body decoded when it is JSON latchwork reads
        (:func:`~messaging.envelope.parse_json`), else its first ``body_limit`` bytes as
        text (a body nested 2,000 deep too)."""
        body: Any
        try:  # whatever a body holds, it is shown: as JSON when it reads as such
            body = parse_json(self.body)
        except EnvelopeError:
            body = self.body[:body_limit].decode("utf-8", errors="replace")
        return {"message_id": self.message_id, "reason": self.reason, "detail": self.detail,
                "queue": self.queue, "member": self.member, "dead_at": self.dead_at,
                "command": self.command, "body": body}


def _letter(properties: Any, body: bytes) -> DeadLetter:
    headers = dict(properties.headers or {})

    def text(key: str) -> str:
        value = headers.get(key, "")
        return value.decode(errors="replace") if isinstance(value, bytes) else str(value)

    command = None
    try:
        raw = parse_json(body)
        if isinstance(raw, dict) and isinstance(raw.get("command"), str):
            command = raw["command"][:200]
    except EnvelopeError:
        pass
    return DeadLetter(properties.message_id, text(REASON_HEADER), text(DETAIL_HEADER),
                      text(QUEUE_HEADER), text(MEMBER_HEADER), text(DEAD_AT_HEADER), command,
                      body, headers, properties)


class DeadLetterQueue:
    """Read and replay a cluster's dead letters over one connection, opened at the first call
    and kept (a console asks for the count every few seconds: a connection per call floods the
    broker's and the console's logs). Calls are serialised (a pika connection is not
    thread-safe). A kept connection the broker closed meanwhile (an idle one past its
    heartbeats, a broker restart) is found before use and opened again; an error during a call
    drops it, so the next call starts afresh. :meth:`close` ends it."""

    def __init__(self, connector: Connector, topology: Topology) -> None:
        self.connector = connector
        self.topology = topology
        self._lock = threading.Lock()
        self._connection: Any = None
        self._open_channel: Any = None

    def _ready_channel(self) -> Any:
        """The kept channel, opened (with its connection) when there is none or it is gone."""
        if self._connection is not None and not still_open(self._connection):
            self._drop()
        if self._open_channel is not None and self._open_channel.is_open:
            return self._open_channel
        if self._connection is None or not self._connection.is_open:
            self._connection = self.connector.connect()
        channel = self._connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(self.topology.dead_queue, durable=True)
        self._open_channel = channel
        return channel

    @contextmanager
    def _channel(self) -> Iterator[Any]:
        with self._lock:
            try:
                with translated("reading the dead-letter queue"):
                    yield self._ready_channel()
            except BaseException:
                self._drop()
                raise

    def _drop(self) -> None:
        connection, self._connection, self._open_channel = self._connection, None, None
        if connection is not None and connection.is_open:
            try:
                connection.close()
            except CONNECTION_ERRORS:
                pass  # closing what is already going

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _scan(self, channel: Any, visit: Callable[[DeadLetter, int], bool], limit: int) -> None:
        """basic_get up to ``limit`` messages, calling ``visit(letter, tag)`` on each until it
        returns True; every message not settled by ``visit`` is given back."""
        unsettled: list[int] = []
        try:
            for _ in range(limit):
                method, properties, body = channel.basic_get(self.topology.dead_queue)
                if method is None:
                    break
                if visit(_letter(properties, body), method.delivery_tag):
                    break
                unsettled.append(method.delivery_tag)
        finally:
            for tag in unsettled:
                channel.basic_nack(tag, requeue=True)

    def list(self, limit: int = 100) -> list[DeadLetter]:
        """Up to ``limit`` dead letters, oldest first; the queue is left as it was."""
        found: list[DeadLetter] = []

        def keep(letter: DeadLetter, tag: int) -> bool:
            found.append(letter)
            return False

        with self._channel() as channel:
            self._scan(channel, keep, limit)
        return found

    def count(self) -> int:
        with self._channel() as channel:
            return int(channel.queue_declare(self.topology.dead_queue, durable=True,
                                             passive=True).method.message_count)

    def get(self, message_id: str, limit: int = 10_000) -> DeadLetter:
        for letter in self.list(limit):
            if letter.message_id == message_id:
                return letter
        raise DeadLetterNotFound(f"no dead-lettered message {message_id}")

    def replay(self, message_id: str, limit: int = 10_000) -> DeadLetter:
        """Publish the message with this id back to its queue (same id), then drop its dead
        copy; returns it."""
        replayed: list[DeadLetter] = []

        def visit(letter: DeadLetter, tag: int) -> bool:
            if letter.message_id != message_id:
                return False
            props = letter.properties
            headers = {k: v for k, v in letter.headers.items()
                       if k not in (REASON_HEADER, DETAIL_HEADER, MEMBER_HEADER, DEAD_AT_HEADER)}
            headers[REPLAYED_HEADER] = True
            queue = letter.queue or self.topology.master_queue
            channel.basic_publish("", queue, letter.body, pika.BasicProperties(
                content_type=props.content_type, delivery_mode=2, headers=headers,
                message_id=props.message_id, correlation_id=props.correlation_id,
                reply_to=props.reply_to), mandatory=True)
            channel.basic_ack(tag)  # only once the broker confirmed the copy
            replayed.append(letter)
            return True

        with self._channel() as channel:
            self._scan(channel, visit, limit)
        if not replayed:
            raise DeadLetterNotFound(f"no dead-lettered message {message_id}")
        return replayed[0]
