"""The test harness messaging ships: a real RabbitMQ broker as a local process
(:class:`RabbitMQServer`), :func:`broker_outage`, the ``msgnode`` participant, and pytest
fixtures (``pytest_plugins = ["messaging.testing.plugin"]``). Nothing here is imported by
messaging itself."""

from messaging.testing.faults import broker_outage
from messaging.testing.rabbitmq import RabbitMQServer

__all__ = ["RabbitMQServer", "broker_outage"]
