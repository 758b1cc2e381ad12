"""pytest fixtures over a real RabbitMQ: ``pytest_plugins = ["messaging.testing.plugin"]``.

* ``rabbitmq`` (session): one broker node with a private epmd on free 127.0.0.1 ports, state in
  pytest's temp dir;
* ``amqp_vhost`` (per test): a fresh vhost, deleted after the test, and the URL that reaches it.

When a test fails, the broker's log tail is attached to its report. A missing
``rabbitmq-server`` package fails with the ``apt-get install`` line to run.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from coord.testing.containers import servers_backend
from messaging.testing.containers import RabbitMQContainer
from messaging.testing.rabbitmq import RabbitMQServer


@dataclass(frozen=True)
class AmqpNamespace:
    """A private RabbitMQ vhost and the URL that reaches it."""

    vhost: str
    url: str
    server: RabbitMQServer | RabbitMQContainer


@pytest.fixture(scope="session")
def rabbitmq(tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[RabbitMQServer | RabbitMQContainer]:
    """The run's broker: a local RabbitMQ node, or a container with
    ``LATCHWORK_TEST_SERVERS=containers`` (:mod:`messaging.testing.containers`)."""
    server: RabbitMQServer | RabbitMQContainer
    if servers_backend() == "containers":
        server = RabbitMQContainer()
    else:
        server = RabbitMQServer.on_free_ports(tmp_path_factory.mktemp("rabbitmq"))
    try:
        server.start()
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture
def amqp_vhost(rabbitmq: RabbitMQServer | RabbitMQContainer) -> Iterator[AmqpNamespace]:
    vhost = f"test-{uuid.uuid4().hex[:12]}"
    rabbitmq.add_vhost(vhost)
    yield AmqpNamespace(vhost, rabbitmq.url_for(vhost), rabbitmq)
    if rabbitmq.is_ready():
        rabbitmq.delete_vhost(vhost)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    rabbit = getattr(item, "funcargs", {}).get("rabbitmq")
    if report.failed and isinstance(rabbit, RabbitMQServer | RabbitMQContainer):
        report.sections.append(("rabbitmq log tail", rabbit.log_tail(40)))
