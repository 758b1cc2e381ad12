"""Incidents on real servers: raised once, across kill -9 of the master, resolved when the task
is done, and heard by a Python hook and a webhook that fails at first."""

from __future__ import annotations

import json
import os
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from coord.testing import NodeProcess, wait_until
from coord.testing.plugin import ZkNamespace
from messaging.testing.plugin import AmqpNamespace
from runner.testing.cluster import Cluster

WATCHED = '''
    """Task types the master watches, and an incident hook."""
    import json
    import os

    from runner.tasks import task


    @task("watched.slow", max_duration=1.0)
    def slow(ctx, payload):
        ctx.cancel.wait(payload["seconds"])


    @task("watched.broken")
    def broken(ctx, payload):
        raise RuntimeError("broken on purpose")


    def hook(event):
        with open(os.environ["INCIDENT_LOG"], "a") as log:
            log.write(json.dumps(event) + "\\n")
'''


class Receiver(BaseHTTPRequestHandler):
    bodies: ClassVar[list[dict[str, Any]]] = []
    failures = 1  # the first request fails

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if Receiver.failures > 0:
            Receiver.failures -= 1
            self.send_response(500)
        else:
            Receiver.bodies.append(body)
            self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def webhook() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), Receiver)
    Receiver.bodies, Receiver.failures = [], 1
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/incidents"
    server.shutdown()
    server.server_close()


def test_incidents_are_raised_once_resolved_and_heard(
        zk_namespace: ZkNamespace, amqp_vhost: AmqpNamespace, tmp_path: Path,
        spawn_node: Callable[..., NodeProcess], webhook: str) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "watched.py").write_text(textwrap.dedent(WATCHED))
    events = tmp_path / "incidents.jsonl"
    c = Cluster(zk_namespace.hosts, amqp_vhost, tmp_path, spawn_node,
                tasks=json.dumps(["watched"]), incident_hooks=json.dumps(["watched:hook"]),
                incident_webhook=webhook)
    c.env["PYTHONPATH"] = os.pathsep.join([str(site), c.env.get("PYTHONPATH", "")])
    c.env["INCIDENT_LOG"] = str(events)
    try:
        members = [c.start_node() for _ in range(3)]
        with c.client() as client:
            # long enough to be still running through the two CLI calls below (each a process
            # of its own: 6 s ended before them on a loaded box)
            slow = client.submit("watched.slow", {"seconds": 15}).id
            broken = client.submit("watched.broken", {}).id

            def open_kinds() -> set[str]:
                return {i.kind for i in client.cluster_status().incidents}

            assert wait_until(lambda: open_kinds() == {"running_too_long", "stopped"}, 30, 0.2)
            status = c.cli("cluster", "status")
            assert "2 open incident(s)" in status.output and "broken on purpose" in status.output
            top = c.cli("top", "--once")
            assert "open incidents: 2" in top.output, top.output
            master = client.cluster_status().master
            assert master in members
        raised_before = {i.key: i.raised_at for i in c.store.incidents.open()}
        c.nodes[master].kill()  # a new master takes over the open incidents
        time.sleep(4)
        with c.client() as client:
            assert client.cluster_status().master not in (None, master)
            c.wait_finished(slow, timeout=40)
            assert c.cli("task", "skip", broken).exit_code == 0
            assert wait_until(lambda: not client.cluster_status().incidents, 30, 0.2)
        every = c.store.incidents.for_task(slow) + c.store.incidents.for_task(broken)
        # raised once: the new master found the records the old one made
        assert len({i.key for i in every}) == len(every)
        for incident in every:
            if incident.key in raised_before:
                assert incident.raised_at == raised_before[incident.key]
            assert incident.resolved_at is not None

        def heard(bodies: list[dict[str, Any]]) -> Counter[tuple[str, str]]:
            return Counter((b["key"], b["event"]) for b in bodies)

        def lines() -> list[dict[str, Any]]:
            return [json.loads(line) for line in events.read_text().splitlines()] \
                if events.exists() else []

        wanted = {(i.key, e) for i in every for e in ("raised", "resolved")}
        assert wait_until(lambda: wanted <= set(heard(Receiver.bodies)), 30, 0.2)
        assert wait_until(lambda: wanted <= set(heard(lines())), 30, 0.2)
        assert Receiver.failures == 0  # the first POST failed and was tried again
        for body in Receiver.bodies:
            assert body["task"] in (slow, broken) and body["kind"] in (
                "running_too_long", "stopped")
    finally:
        c.store.close()
