"""Consumers: a thread with its own connection, handlers in a worker pool, acks sent back.

Each consumer owns one thread and one pika connection. Deliveries are handed to a bounded worker
pool, where :class:`~messaging.dispatch.Dispatcher` decides what happens to each; a handler's
decision travels back with ``add_callback_threadsafe``, so the connection thread keeps answering
heartbeats however long a handler runs. A lost connection is reopened with backoff; decisions on
deliveries from the lost channel are dropped (the broker requeued them when the channel closed),
so a stale delivery tag is never acked. The three paradigms' consumers are in
:mod:`messaging.paradigms`.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pika

from messaging.connection import CONNECTION_ERRORS, Connector
from messaging.delivery import Delivery, DeliveryState
from messaging.dispatch import Dispatcher
from messaging.envelope import MAX_BODY, Paradigm
from messaging.errors import (
    BrokerUnavailable,
    LifecycleError,
)
from messaging.outcomes import OutcomeHook, ReceiveHook
from messaging.publisher import Publisher
from messaging.registry import HandlerContext, HandlerRegistry
from messaging.topology import Topology

log = logging.getLogger("latchwork.messaging")

#: add_callback_threadsafe raises RuntimeError-ish errors once the connection is closing
_SETTLE_ERRORS: tuple[type[BaseException], ...] = (RuntimeError, *CONNECTION_ERRORS)


class Consumer(Dispatcher):
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
        self._redeclare = False  # the broker cancelled our consumer: declare before consuming
        self._generation = 0
        self._inflight: dict[int, HandlerContext | None] = {}
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix=f"{self.name}-worker")
        self._thread: threading.Thread | None = None
        #: connections opened so far (1 + reconnections); for tests and operators
        self.connections_opened = 0

    # -- paradigm specifics -------------------------------------------------------------------
    def queue(self) -> str:
        raise NotImplementedError

    def declare(self, channel: Any) -> None:
        self.topology.declare(channel)

    def on_connected(self) -> None:
        """Called on the connection thread once the channel is set up (see ModelConsumer)."""

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
        channel.add_on_cancel_callback(self._cancelled_by_broker)
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

    def _cancelled_by_broker(self, frame: Any) -> None:
        """Connection thread: the broker cancelled our consumer (its queue was deleted, or its
        process went down and came back: RabbitMQ then nacks the publishes it had not
        confirmed and cancels the consumers). Left alone, this node would believe it still
        consumes while nothing reaches it (a master would never see another MASTER message):
        the queue is declared again and consumed again at once."""
        tag = getattr(frame.method, "consumer_tag", None)
        if tag is None or tag != self._tag:
            return
        log.warning("member %s: %s: the broker cancelled its consumer of %s (the queue was "
                    "deleted or restarted); declaring it and consuming again", self.member_id,
                    self.name, self.queue())
        self._tag = None
        self._consuming.clear()
        self._redeclare = True
        connection = self._connection
        if connection is not None:
            connection.add_callback_threadsafe(self._sync_consuming)

    def _sync_consuming(self) -> None:
        channel = self._channel
        if channel is None or not channel.is_open:
            return
        want = not self._stop.is_set() and self.wants_consuming()
        if want and self._tag is None:
            if self._redeclare:
                self._redeclare = False
                self.declare(channel)
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
