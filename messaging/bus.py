"""The messaging facade a node uses, and the API client anyone can use.

``MessageBus`` holds the three handler registries, a shared :class:`Publisher`, and (after
``start``) the MASTER, MODEL and API consumers. ``ApiClient`` sends requests and waits for the
reply of whichever node answers.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import pika

from coord import LeaderLatch
from messaging.connection import CONNECTION_ERRORS, Connector, still_open, translated
from messaging.consumer import Consumer
from messaging.envelope import MAX_BODY, Envelope, Paradigm, decode
from messaging.errors import (
    EnvelopeError,
    LifecycleError,
    MessageTooLarge,
    PublishFailed,
    RemoteError,
    RequestTimeout,
)
from messaging.outcomes import OutcomeHook, ReceiveHook, reply_too_large
from messaging.paradigms import ApiResponder, MasterConsumer, ModelConsumer
from messaging.processed import ProcessedLog
from messaging.publisher import Publisher
from messaging.registry import HandlerRegistry
from messaging.topology import Topology

log = logging.getLogger("latchwork.messaging")


def declare_topology(connector: Connector, topology: Topology) -> None:
    """Declare the cluster's shared exchanges and queues (idempotent)."""
    connection = connector.connect()
    try:
        with translated("declaring the messaging topology"):
            topology.declare(connection.channel())
    finally:
        if connection.is_open:
            connection.close()


class MessageBus:
    """A node's messaging: registries, publishing, and the consumers it runs."""

    def __init__(self, connector: Connector, topology: Topology, member_id: str, *,
                 workers: int = 4, on_receive: list[ReceiveHook] | None = None,
                 on_outcome: list[OutcomeHook] | None = None,
                 max_body: int = MAX_BODY) -> None:
        self.connector = connector
        self.max_body = max_body
        self.topology = topology
        self.member_id = member_id
        self.workers = workers
        self.master = HandlerRegistry(Paradigm.MASTER)
        self.model = HandlerRegistry(Paradigm.MODEL)
        self.api = HandlerRegistry(Paradigm.API)
        self.publisher = Publisher(connector)
        self.on_receive = on_receive or []
        self.on_outcome = on_outcome or []
        self.consumers: list[Consumer] = []
        self._started = False

    def start(self, latch: LeaderLatch, processed: ProcessedLog,
              on_model_reconnect: Callable[[], object] | None = None) -> MessageBus:
        """Declare the topology and start the MASTER (latch-driven), MODEL and API consumers.

        ``on_model_reconnect`` runs (on a thread of its own) each time the MODEL consumer's
        connection comes back after a loss: broadcasts sent meanwhile never reached this node
        (its queue went with the connection), so whatever they would have refreshed should be
        refreshed then."""
        if self._started:
            raise LifecycleError("message bus already started")
        self._started = True
        declare_topology(self.connector, self.topology)
        common: dict[str, Any] = {"workers": self.workers, "on_receive": self.on_receive,
                                  "on_outcome": self.on_outcome, "max_body": self.max_body}
        self.consumers = [
            MasterConsumer(self.connector, self.topology, self.master, self.member_id,
                           self.publisher, latch, processed, **common),
            ModelConsumer(self.connector, self.topology, self.model, self.member_id,
                          self.publisher, on_reconnect=on_model_reconnect, **common),
            ApiResponder(self.connector, self.topology, self.api, self.member_id,
                         self.publisher, **common),
        ]
        for consumer in self.consumers:
            consumer.start()
        return self

    def close(self) -> None:
        for consumer in self.consumers:
            consumer.request_stop()  # all at once; each then drains its own handlers
        for consumer in self.consumers:
            consumer.close()
        self.publisher.close()

    def __enter__(self) -> MessageBus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_master(self, command: str, payload: dict[str, Any] | None = None) -> Envelope:
        """Queue a MASTER command (persistent, confirmed); returns the envelope sent."""
        return send_master(self.publisher, self.topology, self.member_id, command, payload)

    def broadcast(self, command: str, payload: dict[str, Any] | None = None) -> Envelope:
        """Send a MODEL command to every live node (confirmed by the broker)."""
        envelope = Envelope(paradigm=Paradigm.MODEL, command=command, sender=self.member_id,
                            payload=payload or {})
        self.publisher.publish(self.topology.model_exchange, "", envelope, persistent=False,
                               mandatory=False)
        return envelope


def send_master(publisher: Publisher, topology: Topology, sender: str, command: str,
                payload: dict[str, Any] | None = None) -> Envelope:
    envelope = Envelope(paradigm=Paradigm.MASTER, command=command, sender=sender,
                        payload=payload or {})
    publisher.publish("", topology.master_queue, envelope, persistent=True, mandatory=True)
    return envelope


class ApiClient:
    """Request/reply through whichever node answers. Use from one thread.

    ``request`` publishes a persistent, confirmed request that expires from the queue after the
    timeout (so a late node never acts on a request its client gave up on), then waits for the
    reply with the same correlation id. No reply in time raises :class:`RequestTimeout`; an
    error reply raises :class:`RemoteError`; no broker raises ``BrokerUnavailable`` (the next
    request connects again). After :meth:`close`, a request raises :class:`LifecycleError`
    instead of opening a new connection behind the caller's back.
    """

    def __init__(self, connector: Connector, topology: Topology, sender: str = "client") -> None:
        self.connector = connector
        self.topology = topology
        self.sender = sender
        self._connection: pika.BlockingConnection | None = None
        self._channel: Any = None
        self._reply_queue = ""
        self._replies: dict[str, Envelope] = {}
        self._closed = False

    def _open(self) -> None:
        """The connection and its channel, opened again when the broker closed them while the
        client was idle (a restart, missed heartbeats: a blocking connection answers them only
        when it is used) before anything is sent on them."""
        if self._connection is not None:
            if still_open(self._connection):
                return
            self._drop()
        self._connection = self.connector.connect()
        with translated("opening the API client channel"):
            channel = self._connection.channel()
            self.topology.declare(channel)
            channel.confirm_delivery()
            result = channel.queue_declare("", exclusive=True, auto_delete=True)
            self._reply_queue = result.method.queue
            channel.basic_consume(self._reply_queue, self._on_reply, auto_ack=True)
        self._channel = channel

    def _on_reply(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        try:
            envelope = decode(body)
        except EnvelopeError as exc:
            log.warning("an undecodable API reply (%s): %s", properties.correlation_id, exc)
            if not properties.correlation_id:
                return
            # the request it answers ends with why, never as "no node answered"
            error = reply_too_large("the request", len(body), MAX_BODY) \
                if isinstance(exc, MessageTooLarge) else {"ok": False, "error": {
                    "kind": "UndecodableReply", "code": "undecodable-reply",
                    "refused": False, "detail": f"the answer could not be read: {exc}"}}
            envelope = Envelope(paradigm=Paradigm.API, command="error", sender="client",
                                payload=error)
        if properties.correlation_id:
            self._replies[properties.correlation_id] = envelope

    def request(self, command: str, payload: dict[str, Any] | None = None,
                timeout: float = 10.0, message_id: uuid.UUID | None = None) -> Any:
        """Send an API request and wait ``timeout`` seconds for its answer. ``message_id``:
        its id, new when None; a copy the broker delivers again keeps it (a node's
        ``task.submit`` makes its task's id from it, so a copy handled twice creates one)."""
        envelope = Envelope(paradigm=Paradigm.API, command=command, sender=self.sender,
                            payload=payload or {}, id=message_id or uuid.uuid4())
        return self._send(envelope, "", self.topology.api_queue, wait=timeout,
                          expiration_ms=max(1, int(timeout * 1000)),
                          hint=f"is any latchwork node running for cluster "
                               f"{self.topology.cluster!r}?")

    def command(self, command: str, payload: dict[str, Any] | None = None, *,
                message_id: uuid.UUID | None = None, wait: float | None = None) -> Any:
        """Queue a MASTER command (persistent, confirmed: returns once the broker has it).
        ``message_id``: its idempotency key (a copy sent again with it is handled once and
        answered with the first one's answer). ``wait``: seconds to wait for the master's
        answer (its result; :class:`RemoteError` for a failure or a refusal,
        :class:`RequestTimeout` when none came). The command stays queued when the wait ends:
        a master will still run it."""
        envelope = Envelope(paradigm=Paradigm.MASTER, command=command, sender=self.sender,
                            payload=payload or {}, id=message_id or uuid.uuid4())
        return self._send(envelope, "", self.topology.master_queue, wait=wait,
                          hint="is there a master (a latchwork node) that declares it?")

    def broadcast(self, command: str, payload: dict[str, Any] | None = None) -> Envelope:
        """Send a MODEL command to every node connected now (confirmed by the broker)."""
        envelope = Envelope(paradigm=Paradigm.MODEL, command=command, sender=self.sender,
                            payload=payload or {})
        self._send(envelope, self.topology.model_exchange, "", wait=None, persistent=False,
                   mandatory=False)
        return envelope

    def _send(self, envelope: Envelope, exchange: str, routing_key: str, *,
              wait: float | None, expiration_ms: int | None = None, persistent: bool = True,
              mandatory: bool = True, hint: str = "") -> Any:
        if self._closed:
            raise LifecycleError(f"API client is closed; cannot send {envelope.command}")
        # one call, one correlation id: two calls sending the same message id each get the
        # answer
        correlation = uuid.uuid4().hex if wait is not None else None
        try:
            self._open()
            assert self._connection is not None
            with translated(f"sending {envelope.paradigm} {envelope.command}"):
                self._channel.basic_publish(
                    exchange, routing_key, envelope.encode(),
                    pika.BasicProperties(
                        content_type="application/json", delivery_mode=2 if persistent else 1,
                        reply_to=self._reply_queue if wait is not None else None,
                        correlation_id=correlation, message_id=str(envelope.id),
                        expiration=str(expiration_ms) if expiration_ms else None),
                    mandatory=mandatory)
                if correlation is None:
                    return None
                assert wait is not None
                deadline = time.monotonic() + wait
                while correlation not in self._replies:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        who = "no node answered API request" \
                            if envelope.paradigm is Paradigm.API \
                            else f"no answer to {envelope.paradigm} command"
                        raise RequestTimeout(f"{who} {envelope.command} ({envelope.id}) within "
                                             f"{wait:g}s; {hint}")
                    self._connection.process_data_events(time_limit=min(remaining, 0.2))
        except CONNECTION_ERRORS:
            self._drop()  # the next request connects again
            raise
        except (pika.exceptions.NackError, pika.exceptions.UnroutableError) as exc:
            # the broker did not take it (a nack during a restart or an alarm, no queue): not
            # sent, typed like the publisher's
            raise PublishFailed(f"sending {envelope.paradigm} {envelope.command}: the broker "
                                f"did not take it ({exc!r}); send it again") from exc
        reply = self._replies.pop(correlation).payload
        if reply.get("ok"):
            return reply.get("result")
        error = reply.get("error") or {}
        raise RemoteError(str(error.get("kind", "error")), str(error.get("detail", "")),
                          str(error["code"]) if error.get("code") else None,
                          refused=error.get("refused") is True)

    def close(self) -> None:
        """Close the connection; the client cannot be used again (a second close is a no-op)."""
        self._closed = True
        self._drop()

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                if connection.is_open:
                    connection.close()
            except CONNECTION_ERRORS:
                pass  # already broken

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
