"""The wire as docs/messaging.md documents it for other languages (issue 70, item 3): the
examples of "The wire, for clients in other languages" are read from the page and sent with raw
pika, with the exchanges, routing keys and properties the page names; the sending code imports
nothing of latchwork (the cluster fixture only starts the servers and a node)."""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pika

from runner.testing.cluster import CLUSTER, Cluster

DOC = (Path(__file__).resolve().parent.parent / "docs" / "messaging.md").read_text()


def example(name: str) -> dict[str, Any]:
    """The JSON block after ``<!-- wire: NAME -->`` in docs/messaging.md."""
    match = re.search(rf"<!-- wire: {name} -->\n```json\n(.*?)\n```", DOC, flags=re.S)
    assert match is not None, f"docs/messaging.md has no wire example {name!r}"
    value: dict[str, Any] = json.loads(match[1])
    return value


class Outside:
    """An AMQP client that knows only the page: its own reply queue, the documented names."""

    def __init__(self, url: str) -> None:
        self.connection = pika.BlockingConnection(pika.URLParameters(url))
        self.channel = self.connection.channel()
        self.replies = self.channel.queue_declare("", exclusive=True,
                                                  auto_delete=True).method.queue
        self.answers: dict[str, dict[str, Any]] = {}
        self.channel.basic_consume(self.replies, self._answer, auto_ack=True)

    def _answer(self, channel: Any, method: Any, props: Any, body: bytes) -> None:
        self.answers[props.correlation_id] = json.loads(body)

    def send(self, exchange: str, key: str, body: dict[str, Any], *, content_type: str | None
             = "application/json", expiration: str | None = None, answer: bool = True,
             persistent: bool = True) -> str:
        correlation = uuid.uuid4().hex
        self.channel.basic_publish(exchange, key, json.dumps(body).encode(), pika.BasicProperties(
            content_type=content_type, delivery_mode=2 if persistent else 1,
            message_id=body["id"], expiration=expiration,
            reply_to=self.replies if answer else None,
            correlation_id=correlation if answer else None))
        return correlation

    def answer(self, correlation: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while correlation not in self.answers and time.monotonic() < deadline:
            self.connection.process_data_events(time_limit=0.2)
        return self.answers[correlation]


def test_the_documented_examples_work_as_written(cluster: Cluster) -> None:
    member = cluster.start_node()
    client = Outside(cluster.env["LATCHWORK_AMQP_URL"])
    prefix = f"latchwork.{CLUSTER}"
    try:
        command = example("command")
        answer = client.answer(client.send("", f"{prefix}.master", command))
        assert answer["payload"] == example("command answer")
        assert answer["paradigm"] == "MASTER" and answer["command"] == command["command"]
        assert answer["sender"] == member
        # the same id again runs once and gets the first one's answer
        again = client.answer(client.send("", f"{prefix}.master", command))
        assert again["payload"] == example("command answer")

        request = example("request")
        answered = client.answer(client.send("", f"{prefix}.api", request,
                                             expiration="10000"))["payload"]
        assert answered["ok"] is True and answered["result"]["type"] == "diag.sleep"
        assert answered["result"]["state"] in ("waiting", "running", "succeeded")
        wrong = {**request, "id": str(uuid.uuid4()),
                 "payload": {"type": "diag.sleep", "payload": {"seconds": -1}}}
        refused = client.answer(client.send("", f"{prefix}.api", wrong, expiration="10000"))
        assert refused["payload"] == example("refusal")

        # no content type: read as JSON; another one: refused invalid
        bare = client.answer(client.send("", f"{prefix}.api", {**request, "id": str(
            uuid.uuid4())}, content_type=None, expiration="10000"))
        assert bare["payload"]["ok"] is True
        text = client.answer(client.send("", f"{prefix}.api", {**request, "id": str(
            uuid.uuid4())}, content_type="text/plain", expiration="10000"))
        assert text["payload"]["ok"] is False and text["payload"]["error"]["code"] == "invalid"

        broadcast = example("broadcast")
        client.send(f"{prefix}.model", "", broadcast, answer=False, persistent=False)
    finally:
        client.connection.close()
    log = cluster.nodes[member].log_path.read_text()
    assert "ERROR" not in log and "Traceback" not in log
