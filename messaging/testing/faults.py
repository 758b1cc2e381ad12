"""RabbitMQ faults on demand: :func:`broker_outage` stops the broker application and starts it
again while its Erlang node stays, so clients lose their connections and durable queues and
persistent messages survive."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class Broker(Protocol):
    """A local RabbitMQ node or a container: both can stop and start the application."""

    def stop_app(self) -> None: ...

    def start_app(self) -> None: ...


@contextmanager
def broker_outage(rabbitmq: Broker) -> Iterator[None]:
    """Stop the RabbitMQ application for the body of the ``with``, then start it again.

    Clients lose their connections at once; durable queues and persistent messages survive.
    """
    rabbitmq.stop_app()
    try:
        yield
    finally:
        rabbitmq.start_app()


