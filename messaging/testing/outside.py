"""A client from outside: raw pika, publishing exactly the bytes and headers it is given and
collecting the answers by correlation id, as a client in another language would. For tests of
what a node does with messages latchwork's own client would never send."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pika

from messaging.envelope import decode
from messaging.topology import Topology


class OutsideClient:
    """A raw pika client: publishes what it is given and collects the answers by correlation
    id, as a client in another language would."""

    def __init__(self, url: str, cluster: str) -> None:
        self.connection = pika.BlockingConnection(pika.URLParameters(url))
        self.channel = self.connection.channel()
        self.topology = Topology(cluster)
        self.topology.declare(self.channel)
        self.replies = self.channel.queue_declare("", exclusive=True).method.queue
        self.answers: dict[str, list[dict[str, Any]]] = {}
        self.channel.basic_consume(self.replies, self._on_answer, auto_ack=True)

    def _on_answer(self, channel: Any, method: Any, props: Any, body: bytes) -> None:
        self.answers.setdefault(props.correlation_id, []).append(decode(body).payload)

    def send(self, queue: str, body: bytes, headers: dict[str, Any] | None = None) -> str:
        correlation = uuid.uuid4().hex
        self.channel.basic_publish("", queue, body, pika.BasicProperties(
            content_type="application/json", reply_to=self.replies,
            correlation_id=correlation, message_id=str(uuid.uuid4()), headers=headers))
        return correlation

    def wait(self, correlations: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while any(c not in self.answers for c in correlations) and time.monotonic() < deadline:
            self.connection.process_data_events(time_limit=0.2)
        self.connection.process_data_events(time_limit=0.5)  # a second answer would be here

    def close(self) -> None:
        self.connection.close()
