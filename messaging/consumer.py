"""Consumers: a thread with its own connection, handlers in a worker pool, acks sent back.

Each consumer owns one thread and one pika connection. Deliveries are handed to a bounded worker
pool; a handler's decision travels back with ``add_callback_threadsafe``, so the connection
thread keeps answering heartbeats however long a handler runs. A lost connection is reopened
with backoff; decisions on deliveries from the lost channel are dropped (the broker requeued
them when the channel closed), so a stale delivery tag is never acked.

What happens to a message (``Outcome``):

* handled: the handler returned; the message is acked (MASTER: after its id is recorded);
* duplicate: MASTER only, the id is in the processed log; acked without running the handler;
* retried: MASTER only, the handler raised :class:`Retry` or an unexpected error: a copy goes to
  the delay queue for that retry (confirmed) and the original is acked; after
  ``RetryPolicy.max_retries`` the message is dead-lettered as ``retries-exhausted``;
* dead-lettered: undecodable, invalid, unknown command, :class:`Reject`, or out of retries: a
  copy with ``x-latchwork-reason``/``x-latchwork-detail`` headers goes to the dead-letter queue
  (confirmed), then the original is ``basic_nack(requeue=False)``-ed;
* requeued: the handler was cancelled (shutdown, lost leadership), or a MASTER delivery reached a
  node that is no longer master; the broker hands it to the next consumer.

If the broker is gone while a decision is being carried out, the decision is dropped and the
broker redelivers the message: nothing is lost, at worst handled again (hence the processed log).
"""

from __future__ import annotations

import enum
import functools
import logging
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pika

from coord import LeaderLatch
from messaging.connection import CONNECTION_ERRORS, Connector
from messaging.delivery import Delivery, DeliveryState
from messaging.envelope import MAX_BODY, Envelope, Paradigm, decode
from messaging.errors import (
    INTERNAL_ERROR,
    BrokerUnavailable,
    EnvelopeError,
    InvalidEnvelope,
    LifecycleError,
    PublishFailed,
    Reject,
    Retry,
    UnknownCommand,
)
from messaging.processed import Claim, ProcessedLog
from messaging.publisher import Publisher
from messaging.registry import HandlerContext, HandlerRegistry, Route
from messaging.topology import Topology

log = logging.getLogger("latchwork.messaging")

#: add_callback_threadsafe raises RuntimeError-ish errors once the connection is closing
_SETTLE_ERRORS: tuple[type[BaseException], ...] = (RuntimeError, *CONNECTION_ERRORS)

RETRIES_HEADER = "x-latchwork-retries"
REASON_HEADER = "x-latchwork-reason"
DETAIL_HEADER = "x-latchwork-detail"


class Outcome(enum.StrEnum):
    HANDLED = "handled"
    DUPLICATE = "duplicate"
    RETRIED = "retried"
    DEAD_LETTERED = "dead-lettered"
    REQUEUED = "requeued"


#: called with (delivery, envelope or None, outcome, detail) after each decision
OutcomeHook = Callable[[Delivery, Envelope | None, Outcome, str], None]
#: called with (delivery, envelope) before a handler runs
ReceiveHook = Callable[[Delivery, Envelope], None]


class Consumer:
    """Base of the three paradigm consumers; ``start()`` then ``close()``."""

    paradigm: Paradigm

    def __init__(self, connector: Connector, topology: Topology, registry: HandlerRegistry,
                 member_id: str, publisher: Publisher, *, workers: int = 4,
                 prefetch: int | None = None, on_receive: Sequence[ReceiveHook] = (),
                 on_outcome: Sequence[OutcomeHook] = (), shutdown_grace: float = 10.0,
                 max_body: int = MAX_BODY) -> None:
        if registry.paradigm is not self.paradigm:
            raise ValueError(f"a {self.paradigm} consumer needs a {self.paradigm} registry")
        self.connector = connector
        self.topology = topology
        self.registry = registry
        self.member_id = member_id
        self.publisher = publisher
        self.workers = workers
        self.prefetch = prefetch or workers
        self.on_receive = list(on_receive)
        self.on_outcome = list(on_outcome)
        self.shutdown_grace = shutdown_grace
        self.max_body = max_body
        self._stop = threading.Event()
        self._closed = False
        self._consuming = threading.Event()
        self._lock = threading.Lock()
        self._connection: pika.BlockingConnection | None = None
        self._channel: Any = None
        self._tag: str | None = None
        self._generation = 0
        self._inflight: dict[int, HandlerContext | None] = {}
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix=f"{self.name}-worker")
        self._thread: threading.Thread | None = None
        #: connections opened so far (1 + reconnections); for tests and operators
        self.connections_opened = 0

    @property
    def name(self) -> str:
        return f"{self.paradigm.value.lower()}-consumer"

    # -- paradigm specifics -------------------------------------------------------------------
    def queue(self) -> str:
        raise NotImplementedError

    def declare(self, channel: Any) -> None:
        self.topology.declare(channel)

    def wants_consuming(self) -> bool:
        return True

    def on_connected(self) -> None:
        """Called on the connection thread once the channel is set up (see ModelConsumer)."""

    def before_handler(self, delivery: Delivery, envelope: Envelope) -> bool:
        """False when the consumer settled the delivery itself (handler must not run)."""
        return True

    def on_success(self, delivery: Delivery, envelope: Envelope, ctx: HandlerContext,
                   result: Any) -> None:
        delivery.ack()
        self._emit(delivery, envelope, Outcome.HANDLED, "")

    def on_failure(self, delivery: Delivery, envelope: Envelope, ctx: HandlerContext,
                   exc: BaseException) -> None:
        self.dead_letter(delivery, envelope, "handler-failed", _describe(exc))

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> Consumer:
        if self._thread is not None:
            raise LifecycleError(f"{self.name} already started")
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def request_stop(self) -> None:
        """Begin :meth:`close` without waiting (to stop several consumers at once)."""
        self._stop.set()
        self.wake()

    def close(self) -> None:
        """Stop consuming, give running handlers ``shutdown_grace`` seconds, then disconnect.

        Handlers still running after the grace period are cancelled; their messages are
        requeued by the broker when the connection closes.
        """
        if self._closed:
            return
        self._closed = True
        self.request_stop()
        if self._thread is not None:
            self._thread.join(self.shutdown_grace + 10)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Consumer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_consuming(self, timeout: float) -> bool:
        """Wait until the consumer is registered with the broker."""
        return self._consuming.wait(timeout)

    @property
    def is_consuming(self) -> bool:
        return self._consuming.is_set()

    def wake(self) -> None:
        """Re-evaluate :meth:`wants_consuming` now (thread-safe)."""
        connection = self._connection
        if connection is None:
            return
        try:
            connection.add_callback_threadsafe(self._sync_consuming)
        except CONNECTION_ERRORS:
            pass  # the loop notices the broken connection itself
        except RuntimeError:
            pass  # the connection was closed meanwhile

    def cancel_inflight(self) -> None:
        with self._lock:
            contexts = [c for c in self._inflight.values() if c is not None]
        for ctx in contexts:
            ctx.cancelled.set()

    # -- connection thread --------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                connection = self.connector.connect(deadline=30.0, stop=self._stop)
            except BrokerUnavailable as exc:
                if not self._stop.is_set():
                    log.info("member %s: %s: broker still unavailable (%s); trying again",
                             self.member_id, self.name, exc)
                continue
            self.connections_opened += 1
            try:
                self._serve(connection)
            except CONNECTION_ERRORS as exc:
                if not self._stop.is_set():
                    log.warning("member %s: %s lost its connection (%r); reconnecting",
                                self.member_id, self.name, exc)
            finally:
                with self._lock:
                    self._generation += 1
                    self._connection = None
                    self._channel = None
                    self._tag = None
                self._consuming.clear()
                try:
                    if connection.is_open:
                        connection.close()
                except CONNECTION_ERRORS:
                    pass  # already broken
            if not self._stop.is_set():
                self._stop.wait(0.2)

    def _serve(self, connection: pika.BlockingConnection) -> None:
        channel = connection.channel()
        self.declare(channel)
        channel.basic_qos(prefetch_count=self.prefetch)
        with self._lock:
            self._connection = connection
            self._channel = channel
        self._sync_consuming()
        if self.connections_opened > 1:
            log.info("member %s: %s reconnected", self.member_id, self.name)
        self.on_connected()
        while not self._stop.is_set():
            self._sync_consuming()
            connection.process_data_events(time_limit=0.2)
        self._drain(connection)

    def _drain(self, connection: pika.BlockingConnection) -> None:
        """Shutdown: stop deliveries, let running handlers finish and their acks go out."""
        self._sync_consuming()
        deadline = time.monotonic() + self.shutdown_grace
        while time.monotonic() < deadline:
            with self._lock:
                if not self._inflight:
                    break
            connection.process_data_events(time_limit=0.1)
        self.cancel_inflight()
        connection.process_data_events(time_limit=0.2)

    def _sync_consuming(self) -> None:
        channel = self._channel
        if channel is None or not channel.is_open:
            return
        want = not self._stop.is_set() and self.wants_consuming()
        if want and self._tag is None:
            self._tag = channel.basic_consume(self.queue(), self._on_message, auto_ack=False)
            self._consuming.set()
            log.info("member %s: consuming %s", self.member_id, self.queue())
        elif not want and self._tag is not None:
            tag, self._tag = self._tag, None
            self._consuming.clear()
            channel.basic_cancel(tag)  # undispatched deliveries are nacked back to the queue
            log.info("member %s: stopped consuming %s", self.member_id, self.queue())

    def _on_message(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        delivery = Delivery(body=body, delivery_tag=method.delivery_tag,
                            redelivered=bool(method.redelivered), properties=properties,
                            queue=self.queue(), generation=self._generation,
                            settler=self._settle)
        with self._lock:
            self._inflight[id(delivery)] = None
        self._pool.submit(self._handle, delivery)

    def _settle(self, delivery: Delivery, state: DeliveryState) -> None:
        """Worker thread: hand the decision to the connection thread."""
        with self._lock:
            connection = self._connection
            stale = connection is None or delivery.generation != self._generation
        if stale or connection is None:
            log.info("member %s: %s decision on delivery %d dropped: its channel is gone and "
                     "the broker requeued the message", self.member_id, state.value,
                     delivery.delivery_tag)
            return
        try:
            connection.add_callback_threadsafe(
                functools.partial(self._settle_now, delivery, state))
        except _SETTLE_ERRORS:
            log.info("member %s: %s decision on delivery %d dropped: connection closing",
                     self.member_id, state.value, delivery.delivery_tag)

    def _settle_now(self, delivery: Delivery, state: DeliveryState) -> None:
        """Connection thread: send the ack/nack unless the tag belongs to an older channel."""
        channel = self._channel
        if delivery.generation != self._generation or channel is None or not channel.is_open:
            log.info("member %s: stale delivery tag %d not %s", self.member_id,
                     delivery.delivery_tag, state.value)
            return
        if state is DeliveryState.ACKED:
            channel.basic_ack(delivery.delivery_tag)
        else:
            channel.basic_nack(delivery.delivery_tag, requeue=state is DeliveryState.REQUEUED)

    # -- worker threads -----------------------------------------------------------------------
    def _handle(self, delivery: Delivery) -> None:
        envelope: Envelope | None = None
        try:
            try:
                envelope = decode(delivery.body, content_type=delivery.properties.content_type,
                                  max_bytes=self.max_body)
                if envelope.paradigm is not self.paradigm:
                    raise InvalidEnvelope(f"a {envelope.paradigm} message on the "
                                          f"{self.paradigm} queue")
                route = self.registry.resolve(envelope.command)
                payload = route.parse(envelope.payload)
            except (EnvelopeError, UnknownCommand) as exc:
                self.dead_letter(delivery, envelope, exc.reason, str(exc))
                return
            for hook in self.on_receive:
                hook(delivery, envelope)
            if not self.before_handler(delivery, envelope):
                return
            self._invoke(delivery, envelope, route, payload)
        except Exception:
            log.exception("member %s: %s failed handling delivery %d", self.member_id,
                          self.name, delivery.delivery_tag)
            if delivery.state is DeliveryState.RECEIVED:
                delivery.requeue()
        finally:
            with self._lock:
                self._inflight.pop(id(delivery), None)

    def _invoke(self, delivery: Delivery, envelope: Envelope, route: Route, payload: Any) -> None:
        retries = int(delivery.headers.get(RETRIES_HEADER, 0) or 0)
        ctx = HandlerContext(envelope=envelope, redelivered=delivery.redelivered,
                             retries=retries, member_id=self.member_id,
                             publisher=self.publisher, processed=self._processed_log())
        with self._lock:
            self._inflight[id(delivery)] = ctx
        if self._stop.is_set():
            ctx.cancelled.set()
        try:
            result = route.handler(ctx, payload)
        except Reject as exc:
            self.dead_letter(delivery, envelope, "rejected", str(exc) or "rejected by handler")
            return
        except Exception as exc:
            if ctx.cancelled.is_set():
                delivery.requeue()
                self._emit(delivery, envelope, Outcome.REQUEUED, f"cancelled: {exc!r}")
                return
            log.warning("member %s: %s handler %s failed on message %s: %r", self.member_id,
                        self.paradigm, envelope.command, envelope.id, exc,
                        exc_info=not isinstance(exc, Retry))
            self.on_failure(delivery, envelope, ctx, exc)
            return
        self.on_success(delivery, envelope, ctx, result)

    def _processed_log(self) -> ProcessedLog | None:
        return None

    def _emit(self, delivery: Delivery, envelope: Envelope | None, outcome: Outcome,
              detail: str) -> None:
        for hook in self.on_outcome:
            try:
                hook(delivery, envelope, outcome, detail)
            except Exception:
                log.exception("outcome hook failed")

    def dead_letter(self, delivery: Delivery, envelope: Envelope | None, reason: str,
                    detail: str) -> None:
        """Copy the message to the dead-letter queue with its reason, then reject it."""
        headers = delivery.headers
        headers.update({
            REASON_HEADER: reason, DETAIL_HEADER: detail[:4000],
            "x-latchwork-queue": delivery.queue, "x-latchwork-member": self.member_id,
            "x-latchwork-dead-at": datetime.now(UTC).isoformat(),
        })
        props = delivery.properties
        try:
            self.publisher.publish("", self.topology.dead_queue, delivery.body, headers=headers,
                                   correlation_id=props.correlation_id,
                                   reply_to=props.reply_to, message_id=props.message_id,
                                   deadline=10.0)
        except (BrokerUnavailable, PublishFailed) as exc:
            log.error("member %s: could not dead-letter delivery %d (%s: %s): %s; leaving it "
                      "to the broker", self.member_id, delivery.delivery_tag, reason, detail,
                      exc)
            delivery.requeue()
            self._emit(delivery, envelope, Outcome.REQUEUED, f"dead-letter failed: {exc}")
            return
        delivery.reject()
        what = envelope.command if envelope is not None else "undecodable message"
        log.warning("member %s: dead-lettered %s from %s: %s: %s", self.member_id, what,
                    delivery.queue, reason, detail)
        self._emit(delivery, envelope, Outcome.DEAD_LETTERED, f"{reason}: {detail}")


def _describe(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)).strip()


class MasterConsumer(Consumer):
    """Consumes the MASTER queue only while ``latch`` says this node leads.

    It starts consuming when leadership is gained and cancels its consumer as soon as it is
    lost (the latch drops leadership on SUSPENDED and LOST); running handlers see
    ``ctx.cancelled`` and, if they then fail, their message is requeued for the next master. A
    delivery that reaches a handler slot after leadership was lost is requeued, not handled.
    """

    paradigm = Paradigm.MASTER

    def __init__(self, connector: Connector, topology: Topology, registry: HandlerRegistry,
                 member_id: str, publisher: Publisher, latch: LeaderLatch,
                 processed: ProcessedLog, **kwargs: Any) -> None:
        super().__init__(connector, topology, registry, member_id, publisher, **kwargs)
        self.latch = latch
        self.processed = processed
        latch.add_listener(on_gain=self.wake, on_loss=self._leadership_lost)

    def _leadership_lost(self) -> None:
        self.wake()
        self.cancel_inflight()

    def queue(self) -> str:
        return self.topology.master_queue

    def wants_consuming(self) -> bool:
        return self.latch.is_leader

    def _processed_log(self) -> ProcessedLog | None:
        return self.processed

    def before_handler(self, delivery: Delivery, envelope: Envelope) -> bool:
        """Claim the message id before its handler runs: a copy being handled elsewhere (or in
        another worker here) is waited for, then found processed and acked as a duplicate;
        never run in parallel. Requeued when leadership goes while waiting."""
        while True:
            if not self.latch.is_leader or self._stop.is_set():
                delivery.requeue()
                self._emit(delivery, envelope, Outcome.REQUEUED, "not master")
                return False
            claim = self.processed.claim(envelope.id, self.member_id)
            if claim is Claim.CLAIMED:
                return True
            if claim is Claim.DONE:
                delivery.ack()
                log.info("member %s: MASTER message %s (%s) was already processed; acked",
                         self.member_id, envelope.id, envelope.command)
                self._emit(delivery, envelope, Outcome.DUPLICATE, "already processed")
                return False
            log.info("member %s: MASTER message %s (%s) is being handled by another copy; "
                     "waiting", self.member_id, envelope.id, envelope.command)
            self.processed.wait_released(envelope.id, 1.0)

    def _invoke(self, delivery: Delivery, envelope: Envelope, route: Route, payload: Any) -> None:
        try:
            super()._invoke(delivery, envelope, route, payload)
        finally:
            # failed, retried, cancelled: the next copy may run (a recorded id released it)
            self.processed.release(envelope.id)

    def on_success(self, delivery: Delivery, envelope: Envelope, ctx: HandlerContext,
                   result: Any) -> None:
        self.processed.record(envelope.id, self.member_id)
        super().on_success(delivery, envelope, ctx, result)

    def on_failure(self, delivery: Delivery, envelope: Envelope, ctx: HandlerContext,
                   exc: BaseException) -> None:
        retry = ctx.retries + 1
        if retry > self.topology.retry.max_retries:
            self.dead_letter(delivery, envelope, "retries-exhausted",
                             f"after {ctx.retries} retries: {_describe(exc)}")
            return
        headers = delivery.headers
        headers[RETRIES_HEADER] = retry
        headers["x-latchwork-last-error"] = repr(exc)[:1000]
        try:
            self.publisher.publish("", self.topology.retry_queue(retry), delivery.body,
                                   headers=headers, message_id=str(envelope.id), deadline=10.0)
        except (BrokerUnavailable, PublishFailed) as pub:
            log.error("member %s: could not schedule retry of %s: %s", self.member_id,
                      envelope.id, pub)
            delivery.requeue()
            self._emit(delivery, envelope, Outcome.REQUEUED, f"retry scheduling failed: {pub}")
            return
        delivery.ack()
        self._emit(delivery, envelope, Outcome.RETRIED,
                   f"retry {retry} in {self.topology.retry.delay(retry):g}s: {exc!r}")


class ModelConsumer(Consumer):
    """This node's exclusive queue on the MODEL fanout exchange.

    The queue lives as long as the connection: broadcasts sent while the node was disconnected
    are not delivered to it (MODEL commands concern live nodes; a reconnected node should
    refresh its caches, see ``connections_opened``).
    """

    paradigm = Paradigm.MODEL

    def __init__(self, *args: Any, on_reconnect: Callable[[], object] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_reconnect = on_reconnect

    def queue(self) -> str:
        return self.topology.model_queue(self.member_id)

    def on_connected(self) -> None:
        if self.connections_opened > 1 and self.on_reconnect is not None:
            threading.Thread(target=self._reconnected, name="model-reconnected",
                             daemon=True).start()

    def _reconnected(self) -> None:
        assert self.on_reconnect is not None
        try:
            self.on_reconnect()
        except Exception:
            log.exception("member %s: refreshing after the MODEL reconnect failed",
                          self.member_id)

    def declare(self, channel: Any) -> None:
        super().declare(channel)
        channel.queue_declare(self.queue(), exclusive=True, auto_delete=True)
        channel.queue_bind(self.queue(), self.topology.model_exchange)


class ApiResponder(Consumer):
    """Answers API requests (competing consumers on one durable queue).

    The reply goes to the request's ``reply_to`` with its ``correlation_id``: ``{"ok": true,
    "result": ...}`` or ``{"ok": false, "error": {"kind", "code", "detail"}}``: ``code`` is the
    exception's ``error_code`` attribute (a stable string the client decides on),
    ``internal_error`` for an exception without one, or the reason a refused request was
    dead-lettered for (``invalid``, ``unknown-command``, ``too-large``). A request without
    ``reply_to`` is dead-lettered.
    """

    paradigm = Paradigm.API

    def queue(self) -> str:
        return self.topology.api_queue

    def before_handler(self, delivery: Delivery, envelope: Envelope) -> bool:
        if not delivery.properties.reply_to:
            self.dead_letter(delivery, envelope, "invalid", "API request without reply_to")
            return False
        return True

    def _reply(self, delivery: Delivery, envelope: Envelope, payload: dict[str, Any]) -> None:
        reply = Envelope(paradigm=Paradigm.API, command=envelope.command, sender=self.member_id,
                         payload=payload)
        self.publisher.publish("", delivery.properties.reply_to, reply, persistent=False,
                               mandatory=False, correlation_id=delivery.properties.correlation_id
                               or str(envelope.id), deadline=10.0)

    def on_success(self, delivery: Delivery, envelope: Envelope, ctx: HandlerContext,
                   result: Any) -> None:
        self._reply(delivery, envelope, {"ok": True, "result": result})
        super().on_success(delivery, envelope, ctx, result)

    def on_failure(self, delivery: Delivery, envelope: Envelope, ctx: HandlerContext,
                   exc: BaseException) -> None:
        code = getattr(exc, "error_code", None)
        self._reply(delivery, envelope, {"ok": False, "error": {
            "kind": type(exc).__name__, "detail": str(exc),
            "code": code if isinstance(code, str) else INTERNAL_ERROR}})
        delivery.ack()
        self._emit(delivery, envelope, Outcome.HANDLED, f"answered with error {exc!r}")

    def dead_letter(self, delivery: Delivery, envelope: Envelope | None, reason: str,
                    detail: str) -> None:
        """Dead-letter, and tell the waiting client why (when it said where to answer)."""
        if delivery.properties.reply_to and delivery.properties.correlation_id:
            try:
                reply = Envelope(paradigm=Paradigm.API, sender=self.member_id,
                                 command=envelope.command if envelope else "error",
                                 payload={"ok": False, "error": {"kind": reason, "code": reason,
                                                                 "detail": detail}})
                self.publisher.publish("", delivery.properties.reply_to, reply,
                                       persistent=False, mandatory=False,
                                       correlation_id=delivery.properties.correlation_id,
                                       deadline=10.0)
            except (BrokerUnavailable, PublishFailed) as exc:
                log.warning("member %s: could not tell the client about its rejected request: "
                            "%s", self.member_id, exc)
        super().dead_letter(delivery, envelope, reason, detail)
