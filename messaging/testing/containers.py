"""RabbitMQ in a container (testcontainers), for ``LATCHWORK_TEST_SERVERS=containers``.

Shaped like :class:`~messaging.testing.rabbitmq.RabbitMQServer` where the fixtures and faults
use it (``url``, ``url_for``, ``add_vhost``, ``delete_vhost``, ``is_ready``, ``ctl``,
``stop_app``/``start_app``, ``node_port``, ``log_tail``). The official ``rabbitmq:3.12``
image; its AMQP port is published on 127.0.0.1 only. The broker sees the test's connections
come from Docker's bridge, not from loopback, where it refuses the ``guest`` user: the
container gets a ``latchwork`` user instead. ``rabbitmqctl`` runs inside the container. Not
run on this project's CI machines (no Docker engine answers there): see docs/testing.md.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

from coord.testing.containers import log_tail, publish, require_docker
from coord.testing.processes import LOOPBACK, DevServerError, ServerNotReady
from messaging.testing.rabbitmq import BrokerControl, amqp_handshake

USER = "latchwork"


class RabbitMQContainer(BrokerControl):
    user = USER

    def __init__(self, image: str = "rabbitmq:3.12",
                 consumer_timeout_ms: int = 30 * 60 * 1000) -> None:
        self.image = image
        self.consumer_timeout_ms = consumer_timeout_ms
        self.node_port = 0
        self._container: Any = None

    @property
    def url(self) -> str:
        return self.url_for("/")

    def url_for(self, vhost: str) -> str:
        return f"amqp://{USER}:{USER}@{LOOPBACK}:{self.node_port}/{quote(vhost, safe='')}"

    def start(self) -> None:
        require_docker()
        from testcontainers.core.container import DockerContainer

        container = (DockerContainer(self.image)
                     .with_env("RABBITMQ_DEFAULT_USER", USER)
                     .with_env("RABBITMQ_DEFAULT_PASS", USER)
                     .with_env("RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
                               f"-rabbit consumer_timeout {self.consumer_timeout_ms}"))
        self.node_port = publish(container, 5672)
        self._container = container.start()

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.is_ready():
                return
            time.sleep(0.2)
        raise ServerNotReady(f"the RabbitMQ container is not answering AMQP after "
                             f"{timeout:.0f}s; log tail:\n{self.log_tail(30)}")

    def is_ready(self) -> bool:
        return self._container is not None and amqp_handshake(self.node_port)

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        code, output = self._container.exec(["rabbitmqctl", *args])
        text = output.decode(errors="replace") if isinstance(output, bytes) else str(output)
        if code != 0:
            raise DevServerError(f"rabbitmqctl {' '.join(args)} failed: {text.strip()}")
        return text

    def stop(self) -> None:
        if self._container is not None:
            self._container.stop()
            self._container = None

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self._container, lines)
