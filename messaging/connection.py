"""Connections to RabbitMQ: parameters, connect with backoff, error translation.

pika's BlockingConnection is not thread-safe, so latchwork keeps one connection per thread: each
consumer owns a thread and its connection; publishers keep one per calling thread. The only
cross-thread call is ``connection.add_callback_threadsafe``.
"""

from __future__ import annotations

import logging
import random
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions as pe

from messaging.errors import BrokerRefused, BrokerUnavailable

log = logging.getLogger("latchwork.messaging")

#: pika errors that mean "the connection or channel is gone; reconnect and try again"
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    pe.AMQPConnectionError, pe.ConnectionClosed, pe.ChannelClosed, pe.ChannelWrongStateError,
    pe.StreamLostError, pe.ConnectionWrongStateError, ConnectionError, OSError,
)


def still_open(connection: Any) -> bool:
    """Whether a blocking connection kept while idle is still open: it answers the broker's
    heartbeats only when used, so it is used once (``process_data_events`` with no wait),
    which raises, or leaves it closed, when the broker closed it meanwhile (a restart, missed
    heartbeats)."""
    try:
        if connection.is_open:
            connection.process_data_events(time_limit=0)
    except CONNECTION_ERRORS:
        pass
    return bool(connection.is_open)


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter (AWS style)."""

    first: float = 0.1
    factor: float = 2.0
    cap: float = 5.0

    def delays(self) -> Iterator[float]:
        attempt = 0
        while True:
            yield random.uniform(0, min(self.cap, self.first * self.factor ** attempt))
            attempt += 1


@dataclass(frozen=True)
class Connector:
    """How to reach the broker. ``heartbeat`` (seconds) overrides the broker's proposal."""

    url: str
    heartbeat: int = 30
    connect_deadline: float = 30.0
    backoff: Backoff = Backoff()
    name: str = "latchwork"
    #: amqps://: the CA the broker's certificate is checked against (None: the system's), and
    #: the client certificate and key the broker may ask for (PEM files)
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    def parameters(self) -> pika.URLParameters:
        params = pika.URLParameters(self.url)
        params.heartbeat = self.heartbeat
        params.connection_attempts = 1
        params.socket_timeout = 5.0
        params.blocked_connection_timeout = 60.0
        params.client_properties = {"connection_name": self.name}
        if self.url.startswith("amqps://"):
            context = ssl.create_default_context(cafile=self.tls_ca)
            if self.tls_cert is not None:
                context.load_cert_chain(self.tls_cert, self.tls_key)
            params.ssl_options = pika.SSLOptions(context, params.host)
        return params

    def __repr__(self) -> str:  # the URL holds the password
        return f"Connector({_redact(self.url)!r}, name={self.name!r})"

    def connect(self, deadline: float | None = None,
                stop: threading.Event | None = None) -> pika.BlockingConnection:
        """Connect, retrying with backoff until ``deadline`` seconds have passed.

        Raises :class:`BrokerUnavailable` with the last error when the deadline passes (or at
        once when ``stop`` is set).
        """
        limit = time.monotonic() + (self.connect_deadline if deadline is None else deadline)
        last: BaseException | None = None
        for delay in self.backoff.delays():
            if stop is not None and stop.is_set():
                break
            try:
                return pika.BlockingConnection(self.parameters())
            except (pe.ProbableAuthenticationError, pe.ProbableAccessDeniedError,
                    pe.AuthenticationError) as exc:  # not transient: said at once
                user = _redact(self.url).split("://", 1)[-1].split(":", 1)[0]
                raise BrokerRefused(f"RabbitMQ at {_redact(self.url)} refused the login of "
                                    f"user {user!r} ({type(exc).__name__}): check the user, "
                                    "its password and its permissions on the vhost") from None
            except CONNECTION_ERRORS as exc:
                last = exc
            if time.monotonic() + delay >= limit:
                break
            if stop is not None:
                stop.wait(delay)
            else:
                time.sleep(delay)
        raise BrokerUnavailable(f"cannot connect to RabbitMQ at {_redact(self.url)}: "
                                f"{last!r}") from last


def _redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Turn pika's connection errors into :class:`BrokerUnavailable`."""
    try:
        yield
    except CONNECTION_ERRORS as exc:
        raise BrokerUnavailable(f"{what}: {exc!r}") from exc
