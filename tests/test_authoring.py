"""Users' own task types: ``@task``, ``node start --tasks``, the ``latchwork.tasks`` entry
points, ``latchwork task types``; and a module that does not load stops the start in one line,
exit 2. Real node processes, ZooKeeper and RabbitMQ."""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from coord import LockFreeQueue, Session
from coord.testing import NodeProcess, free_ports, wait_until
from coord.testing.plugin import ZkNamespace
from messaging.testing.plugin import AmqpNamespace
from runner.testing.cluster import Cluster
from runner.testing.metrics import scrape

BILLING = '''
    """Billing tasks of a user's package."""
    from pathlib import Path

    from pydantic import BaseModel

    from runner.tasks import BadInput, TaskContext, stream, task


    class SyncPayload(BaseModel):
        account: str
        months: int = 1


    @task("billing.sync", payload=SyncPayload, priority=7, slots=1)
    def sync(ctx: TaskContext, payload: SyncPayload) -> None:
        """Pull one account's invoices.

        More text that the listing does not show."""
        ctx.check()
        print(f"synced {payload.account} for {payload.months} months on {ctx.member_id}")


    @stream("billing.totals", inputs=["invoices"], output="totals", initial_state=0)
    def totals(state, inputs):
        """Running total of the invoice amounts."""
        outputs = []
        for queue, index, amount in inputs:
            if amount == b"boom":
                raise RuntimeError("the ledger is offline")  # the handler's failure
            if not amount.isdigit():
                raise BadInput(f"{queue}@{index}: not an amount: {amount!r}")
            state += int(amount)
            outputs.append(str(state).encode())
        return state, outputs


    @task("billing.close", description="close the month")
    def close(ctx: TaskContext, payload: dict) -> None:
        if payload.get("fail"):
            raise RuntimeError("the ledger is locked")
'''

PLUGIN = '''
    """Registered through an entry point, as a register(registry) function."""
    from runner.tasks import TaskRegistry


    def register(registry: TaskRegistry) -> None:
        registry.register("plugin.ping", lambda ctx, payload: None, description="answers")
'''


@pytest.fixture
def userpkg(tmp_path: Path) -> Path:
    """A user's package and an installed distribution declaring an entry point, on a path
    the nodes get through PYTHONPATH."""
    site = tmp_path / "site"
    (site / "usertasks").mkdir(parents=True)
    (site / "usertasks" / "__init__.py").write_text("")
    (site / "usertasks" / "billing.py").write_text(textwrap.dedent(BILLING))
    (site / "usertasks" / "plugin.py").write_text(textwrap.dedent(PLUGIN))
    (site / "usertasks" / "empty.py").write_text('"""no tasks here"""\n')
    (site / "usertasks" / "clash.py").write_text(textwrap.dedent('''
        from runner.tasks import task

        @task("diag.sleep")
        def sleep(ctx, payload):
            pass
    '''))
    info = site / "usertasks-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: usertasks\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[latchwork.tasks]\nping = usertasks.plugin:register\n")
    return site


@pytest.fixture
def cluster(zk_namespace: ZkNamespace, amqp_vhost: AmqpNamespace, tmp_path: Path,
            spawn_node: Callable[..., NodeProcess], userpkg: Path) -> Iterator[Cluster]:
    c = Cluster(zk_namespace.hosts, amqp_vhost, tmp_path, spawn_node,
                tasks=json.dumps(["usertasks.billing"]))
    c.env["PYTHONPATH"] = os.pathsep.join([str(userpkg), c.env.get("PYTHONPATH", "")])
    yield c
    c.store.close()


def test_a_users_task_types_run_on_the_cluster(cluster: Cluster) -> None:
    """The issue's "done when": a user's package with two task types on 3 nodes, submitted
    and awaited through the client, seen in `latchwork top`, counted by every node's
    metrics."""
    ports = free_ports(3)
    members = [cluster.start_node("--metrics-port", str(port)) for port in ports]
    with cluster.client() as client:
        types = {t.name: t for t in client.task_types()}
        assert {"billing.sync", "billing.close", "plugin.ping", "diag.sleep"} <= set(types)
        sync = types["billing.sync"]
        assert (sync.priority, sync.slots) == (7, 1)
        assert sync.description == "Pull one account's invoices."
        assert sync.payload_schema is not None and sync.payload_schema["required"] == ["account"]
        assert types["billing.close"].payload_schema is None

        ok = client.submit("billing.sync", {"account": "acme", "months": 3})
        assert ok.priority == 7  # the type's default
        report = client.wait(ok.id, timeout=30)
        assert report.succeeded and report.attempts[-1].executor in members
        failed = client.wait(client.submit("billing.close", {"fail": True}).id, timeout=30)
        assert failed.task.stopped
        assert "RuntimeError: the ledger is locked" in (failed.attempts[-1].error or "")
        assert client.wait(client.submit("plugin.ping").id, timeout=30).succeeded

    listing = cluster.cli("task", "types")
    assert listing.exit_code == 0
    assert "billing.sync" in listing.output and "account*" in listing.output
    as_json = json.loads(cluster.cli("task", "types", "--json").output)
    assert {t["name"] for t in as_json} == set(types)
    unknown = cluster.cli("task", "submit", "billing.sync", "--payload", '{"acount": "x"}')
    assert unknown.exit_code == 2 and "acount" in unknown.output
    # the package's @stream, started as 2 copies and fed through the lock-free queue
    started = cluster.cli("stream", "start", "billing.totals", "--redundancy", "2")
    assert started.exit_code == 0, started.output
    with Session(cluster.env["LATCHWORK_ZK_HOSTS"], "r1", timeout=4.0) as s:
        invoices, totals = LockFreeQueue(s, "invoices"), LockFreeQueue(s, "totals")
        for amount in range(1, 31):
            invoices.push(str(amount).encode() if amount != 12 else b"12 EUR")
        assert wait_until(lambda: totals.end() == 29, 60, 0.2)
        amounts = [n for n in range(1, 31) if n != 12]
        assert [int(v) for _, v in totals.read(0, 100)] == [
            sum(amounts[:k + 1]) for k in range(len(amounts))]
        dead = [json.loads(v) for _, v in LockFreeQueue(s, "billing.totals.dead").read(0)]
        assert [(d["queue"], d["index"]) for d in dead] == [("invoices", 11)]
        # the handler itself fails: the copies are retried with a backoff, not stopped
        invoices.push(b"boom")

        def copies_failed_and_wait() -> bool:
            copies = cluster.store.tasks.all("stream.copy")
            errors = [a.error or "" for c in copies
                      for a in cluster.store.attempts.for_task(c.id)]
            return (any("HandlerFailed" in e and "invoices@30" in e for e in errors)
                    and all(c.active and not c.finished for c in copies)
                    and any(c.run_at is not None for c in copies))
        assert wait_until(copies_failed_and_wait, 60, 0.5)
        assert totals.end() == 29
    top = cluster.cli("top", "--once")
    assert top.exit_code == 0
    assert "billing.sync" in top.output and "the ledger is locked" in top.output
    counted: dict[str, float] = {}
    for port in ports:
        for key, value in scrape(port).items():
            if key.startswith("latchwork_attempts_total{") and "billing." in key:
                counted[key] = counted.get(key, 0.0) + value
    assert counted == {'latchwork_attempts_total{status="SUCCEEDED",type="billing.sync"}': 1.0,
                       'latchwork_attempts_total{status="FAILED",type="billing.close"}': 1.0}


@pytest.mark.parametrize(("module", "message"), [
    ("usertasks.nosuch", "cannot import task module usertasks.nosuch: ModuleNotFoundError"),
    ("usertasks.empty", "task module usertasks.empty declares no task"),
    ("usertasks.clash", "usertasks.clash: task type 'diag.sleep' is already registered"),
])
def test_a_task_module_that_does_not_load_stops_the_start(
        cluster: Cluster, module: str, message: str) -> None:
    run = cluster.start_without_tasks_setting("--tasks", module)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], run.stderr
    assert "Traceback" not in run.stderr
