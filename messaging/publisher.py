"""Confirmed publishing from any thread: one connection and confirm-mode channel per thread.

A publish that meets a broken connection reconnects with backoff and tries again until its
deadline, then raises :class:`BrokerUnavailable`. A publish the broker nacks or cannot route
(``mandatory``) raises :class:`PublishFailed` at once. Because a confirm can be lost with the
connection after the broker stored the message, a retried publish may store it twice; the
envelope id is the idempotency key consumers use to notice (see :mod:`messaging.processed`).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions as pe

from messaging.connection import CONNECTION_ERRORS, Connector
from messaging.envelope import Envelope
from messaging.errors import BrokerUnavailable, LifecycleError, PublishFailed

log = logging.getLogger("latchwork.messaging")


@dataclass
class _Link:
    connection: pika.BlockingConnection
    channel: Any


class Publisher:
    """Publishes with confirms; safe to share between threads (each gets its own connection)."""

    def __init__(self, connector: Connector, deadline: float = 30.0) -> None:
        self.connector = connector
        self.deadline = deadline
        self._local = threading.local()
        self._links: list[_Link] = []
        self._lock = threading.Lock()
        self._closed = False

    def _link(self, remaining: float) -> _Link:
        link: _Link | None = getattr(self._local, "link", None)
        if link is not None and link.connection.is_open and link.channel.is_open:
            return link
        connection = self.connector.connect(deadline=remaining)
        channel = connection.channel()
        channel.confirm_delivery()
        link = _Link(connection, channel)
        self._local.link = link
        with self._lock:
            if self._closed:
                connection.close()
                raise LifecycleError("publisher is closed")
            self._links.append(link)
        return link

    def _drop(self) -> None:
        link: _Link | None = getattr(self._local, "link", None)
        self._local.link = None
        if link is None:
            return
        with self._lock:
            if link in self._links:
                self._links.remove(link)
        try:
            if link.connection.is_open:
                link.connection.close()
        except CONNECTION_ERRORS:
            pass  # already broken: that is why we drop it

    def publish(self, exchange: str, routing_key: str, body: Envelope | bytes, *,
                persistent: bool = True, mandatory: bool = True,
                headers: dict[str, Any] | None = None, expiration_ms: int | None = None,
                reply_to: str | None = None, correlation_id: str | None = None,
                message_id: str | None = None, deadline: float | None = None) -> None:
        """Publish and wait for the broker's confirm."""
        if self._closed:
            raise LifecycleError("publisher is closed")
        if isinstance(body, Envelope):
            message_id = message_id or str(body.id)
            data = body.encode()
        else:
            data = body
        props = pika.BasicProperties(
            content_type="application/json", delivery_mode=2 if persistent else 1,
            headers=headers, expiration=None if expiration_ms is None else str(expiration_ms),
            reply_to=reply_to, correlation_id=correlation_id, message_id=message_id)
        limit = time.monotonic() + (self.deadline if deadline is None else deadline)
        last: BaseException | None = None
        for delay in self.connector.backoff.delays():
            remaining = limit - time.monotonic()
            if remaining <= 0:
                break
            try:
                link = self._link(remaining)
                link.channel.basic_publish(exchange, routing_key, data, props,
                                           mandatory=mandatory)
                return
            except pe.UnroutableError as exc:
                raise PublishFailed(f"no queue bound for {exchange!r}/{routing_key!r}") from exc
            except pe.NackError as exc:
                raise PublishFailed(f"broker nacked message to {exchange!r}/{routing_key!r}"
                                    ) from exc
            except BrokerUnavailable as exc:
                last = exc
                break
            except CONNECTION_ERRORS as exc:
                last = exc
                log.warning("publish to %r/%r failed (%r); reconnecting", exchange, routing_key,
                            exc)
                self._drop()
                time.sleep(min(delay, max(0.0, limit - time.monotonic())))
        raise BrokerUnavailable(f"could not publish to {exchange!r}/{routing_key!r} within "
                                f"the deadline: {last!r}") from last

    def close(self) -> None:
        """Close every thread's connection. Call when no thread publishes any more."""
        with self._lock:
            self._closed = True
            links, self._links = self._links, []
        for link in links:
            try:
                if link.connection.is_open:
                    link.connection.close()
            except CONNECTION_ERRORS as exc:
                log.debug("closing a publisher connection: %r", exc)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
