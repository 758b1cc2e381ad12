"""A live node's Prometheus metrics move with its work, and its JSON log names the member, the
task and the attempt; user input errors are one line. Real node process and servers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coord.testing import free_ports, wait_until
from runner.errors import RequestRefused
from runner.tasks import chain, step
from runner.testing.cluster import Cluster
from runner.testing.metrics import scrape


def test_metrics_and_json_logs_of_a_live_node(cluster: Cluster, tmp_path: Path) -> None:
    port = free_ports(1)[0]
    log_file = tmp_path / "node.jsonl"
    member = cluster.start_node("--metrics-port", str(port), "--log-format", "json",
                                "--log-file", str(log_file))
    assert wait_until(lambda: scrape(port).get("latchwork_is_master") == 1.0, 30)
    before = scrape(port)
    assert before["latchwork_session_connected"] == 1.0
    with cluster.client() as client:
        done = [client.submit("diag.sleep", {"seconds": 0.1}).id for _ in range(3)]
        failed = client.submit("diag.fail", {"message": "boom"}).id
        # due later: not taken by the node at once, so the other nodes are told (a MODEL
        # TRIGGER_SCAN; a task the accepting node takes at once needs no broadcast)
        later = client.submit("diag.sleep", {"seconds": 0}, delay=0.5).id
        for task_id in [*done, failed, later]:
            client.wait(task_id, timeout=30)
        with pytest.raises(RequestRefused):
            client.submit("diag.sleep", {"sceonds": 1})
    after = scrape(port)
    sleep_ok = 'latchwork_attempts_total{status="SUCCEEDED",type="diag.sleep"}'
    assert after[sleep_ok] == 4.0
    assert after['latchwork_attempts_started_total{type="diag.sleep"}'] == 4.0
    assert after['latchwork_attempts_total{status="FAILED",type="diag.fail"}'] == 1.0
    assert after['latchwork_attempt_seconds_count{status="SUCCEEDED",type="diag.sleep"}'] == 4.0
    assert after['latchwork_task_claims_total{result="started"}'] >= 5
    assert after["latchwork_scan_seconds_count"] > before.get("latchwork_scan_seconds_count", 0)
    handled = 'latchwork_messages_total{outcome="handled",paradigm="API"}'
    assert after[handled] >= before.get(handled, 0) + 11  # 5 submits, waits, the refusal
    model = 'latchwork_messages_total{outcome="handled",paradigm="MODEL"}'
    assert after[model] >= before.get(model, 0) + 1  # the delayed task's TRIGGER_SCAN
    assert after['latchwork_broker_connections_total{consumer="api-consumer"}'] >= 1
    # the master exports the workflows by state: one submitted, then marked succeeded
    with cluster.client() as client:
        flow = client.submit_workflow(chain(step("diag.sleep", {"seconds": 0}),
                                            step("diag.sleep", {"seconds": 0})), key="metrics")
        client.result(flow.members[-1], wait=30)
    assert wait_until(lambda: scrape(port).get('latchwork_workflows{state="succeeded"}')
                      == 1.0, 30)
    assert scrape(port)['latchwork_workflows{state="running"}'] == 0.0

    records = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert records and all(r["member"] == member for r in records if r["member"])
    in_attempts = {r["task"] for r in records if r["attempt"]}
    assert set(done) | {failed} <= in_attempts
    refusal = [r for r in records if "InvalidPayload" in r["message"]]
    assert refusal and all("exc" not in r and r["level"] == "WARNING" for r in refusal)
    # the events operators watch carry a stable name, whatever the message's wording
    events = [r for r in records if r.get("event")]
    assert {"master.gained", "attempt.started", "attempt.ended"} <= {r["event"] for r in events}
    ended = {r["task"]: r["status"] for r in events if r["event"] == "attempt.ended"}
    assert all(ended[t] == "SUCCEEDED" for t in done) and ended[failed] == "FAILED"
    assert all(r["type"] for r in events if r["event"].startswith("attempt."))


def test_an_event_name_is_one_of_the_declared_ones() -> None:
    from runner.logs import EVENTS, event
    assert event("lock.freed", owner="m1") == {"event": "lock.freed",
                                              "event_fields": {"owner": "m1"}}
    assert "session.suspended" in EVENTS
    with pytest.raises(ValueError, match="unknown log event"):
        event("lock.lost")

