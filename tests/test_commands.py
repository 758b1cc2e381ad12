"""Users' own master-only commands and broadcasts (``@command``, ``@broadcast``) and streams fed
and read from the outside: declared in a user's package, loaded by ``node start --tasks``, sent
and answered through the client and the CLI. Real node processes, ZooKeeper and RabbitMQ."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from coord import LeaderLatch, Session
from coord.testing import NodeProcess, TcpProxy, free_ports, wait_until
from coord.testing.plugin import ZkNamespace
from messaging import (
    ApiClient,
    Connector,
    HandlerContext,
    HandlerRegistry,
    MasterConsumer,
    Paradigm,
    Publisher,
    RedeliveryPolicy,
    RemoteError,
    Topology,
    ZkProcessedLog,
    declare_topology,
)
from messaging.testing.plugin import AmqpNamespace
from runner.client import CommandFailed, CommandRefused, NoAnswer, RequestRefused
from runner.testing.cluster import CLUSTER, Cluster
from runner.testing.metrics import scrape

ROOT = Path(__file__).resolve().parent.parent

BILLING = '''
    """A user's package: a task, a master-only command, a broadcast and a stream."""
    import json
    import time
    from pathlib import Path

    from pydantic import BaseModel

    from coord import Session
    from runner.tasks import CommandContext, TaskContext, broadcast, command, stream, task


    class Reindex(BaseModel):
        account: str
        hold: float = 0.0
        after: float = 0.0  # work after the transaction, before the answer
        fail_after: bool = False  # fail after the transaction


    @task("billing.sync")
    def sync(ctx: TaskContext, payload: dict) -> None:
        pass


    @command("billing.reindex", payload=Reindex)
    def reindex(ctx: CommandContext, payload: Reindex) -> dict:
        """Rebuild one account's index."""
        client = ctx.services.get(Session).client
        client.ensure_path("/billing/done")
        run = client.create(f"/billing/runs/{ctx.message_id}-", ctx.member_id.encode(),
                            sequence=True, makepath=True)
        if ctx.cancelled.wait(payload.hold):
            raise RuntimeError("cancelled: no longer the master")
        ctx.check()
        txn = ctx.transaction()
        txn.create(f"/billing/done/{ctx.message_id}", ctx.member_id.encode())
        txn.commit()
        client.set(run, f"{ctx.member_id} done".encode())
        time.sleep(payload.after)
        if payload.fail_after:
            raise RuntimeError("failed after its transaction")
        return {"account": payload.account, "by": ctx.member_id,
                "redelivered": ctx.redelivered}


    @command("billing.refuse")
    def refuse(ctx: CommandContext, payload: dict) -> None:
        from messaging import Reject
        raise Reject("no such account")


    class Flush(BaseModel):
        dir: str


    def caught_up(services) -> None:
        Path(CATCH_UP).mkdir(parents=True, exist_ok=True)
        (Path(CATCH_UP) / f"{time.time()}").write_text("caught up")


    CATCH_UP = "CATCH_UP_DIR"


    @broadcast("billing.cache.flush", payload=Flush, on_reconnect=caught_up)
    def flush(ctx: CommandContext, payload: Flush) -> None:
        (Path(payload.dir) / ctx.member_id.replace(":", "_")).write_text(str(ctx.message_id))


    @stream("billing.totals", inputs=["invoices"], output="totals", initial_state=0)
    def totals(state, inputs):
        outputs = []
        for queue, index, amount in inputs:
            value = json.loads(amount)
            if not isinstance(value, int):
                from runner.tasks import BadInput
                raise BadInput(f"{queue}@{index}: not an amount: {value!r}")
            state += value
            outputs.append(json.dumps(state).encode())
        return state, outputs
'''

TWICE = '''
    from runner.tasks import command

    @command("billing.twice")
    def one(ctx, payload):
        pass

    @command("billing.twice")
    def other(ctx, payload):
        pass
'''

BUILTIN = '''
    from runner.tasks import broadcast

    @broadcast("TRIGGER_SCAN")
    def mine(ctx, payload):
        pass
'''


@pytest.fixture
def userpkg(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    (site / "usercmds").mkdir(parents=True)
    (site / "usercmds" / "__init__.py").write_text("")
    text = textwrap.dedent(BILLING).replace("CATCH_UP_DIR", str(tmp_path / "caught-up"))
    (site / "usercmds" / "billing.py").write_text(text)
    (site / "usercmds" / "twice.py").write_text(textwrap.dedent(TWICE))
    (site / "usercmds" / "builtin.py").write_text(textwrap.dedent(BUILTIN))
    return site


@pytest.fixture
def cluster(zk_namespace: ZkNamespace, amqp_vhost: AmqpNamespace, tmp_path: Path,
            spawn_node: Callable[..., NodeProcess], userpkg: Path) -> Iterator[Cluster]:
    # requests may carry 2 MB, so that a pushed element over the queue's limit reaches it
    c = Cluster(zk_namespace.hosts, amqp_vhost, tmp_path, spawn_node,
                tasks=json.dumps(["usercmds.billing"]), max_message_bytes="2000000")
    c.env["PYTHONPATH"] = os.pathsep.join([str(userpkg), c.env.get("PYTHONPATH", "")])
    yield c
    c.store.close()


def runs_of(session: Session, message_id: str) -> list[str]:
    """The runs of the reindex handler for one message: "<member>" (started) or
    "<member> done"."""
    client = session.client
    if client.exists("/billing/runs") is None:
        return []
    return sorted(client.get(f"/billing/runs/{child}")[0].decode()
                  for child in client.get_children("/billing/runs")
                  if child.startswith(message_id))


def test_a_users_command_broadcast_and_stream_on_three_nodes(
        cluster: Cluster, zk_namespace: ZkNamespace, tmp_path: Path) -> None:
    """The issue's "done when": a user's package declares a task, a command, a broadcast and a
    stream; 3 nodes run them; the stream is fed and read through the client; a command sent
    with ``wait`` is answered by the next master while the master that started it is killed
    -9 mid-handler; a command sent twice with one id runs once and both senders get its
    answer; the broadcast reaches every live node; per-command metrics count it."""
    ports = free_ports(3)
    members = [cluster.start_node("--metrics-port", str(port)) for port in ports]
    port_of = dict(zip(members, ports, strict=True))
    listed = cluster.cli("command", "list", "--json")
    assert listed.exit_code == 0, listed.output
    declared = {c["name"]: c for c in json.loads(listed.output)}
    reindex = declared["billing.reindex"]
    assert (reindex["kind"], reindex["builtin"]) == ("command", False)
    assert reindex["description"] == "Rebuild one account's index."
    assert reindex["payload_schema"]["required"] == ["account"]
    assert sorted(reindex["members"]) == sorted(members)
    flush = declared["billing.cache.flush"]
    assert (flush["kind"], flush["on_reconnect"]) == ("broadcast", True)
    assert declared["SYNCHRONIZE_MODEL"]["builtin"] and declared["TRIGGER_SCAN"]["builtin"]
    text = cluster.cli("command", "list").output
    assert "billing.reindex" in text and \
        "payload {account: string, hold: number, after: number, fail_after: boolean}" in text

    with cluster.client(timeout=10) as client, \
            Session(zk_namespace.hosts, CLUSTER, timeout=4.0) as zk:
        # the stream, fed and read from the outside
        assert client.stream_start("billing.totals", redundancy=2).copies
        first = client.stream_push("invoices", [1, 2, 3], token="batch-1")
        assert client.stream_push("invoices", [1, 2, 3], token="batch-1") == first  # once
        assert first == [0, 1, 2]
        assert client.stream_push("invoices", ["four", 4]) == [3, 4]

        def outputs() -> list[Any]:
            return [e.value for e in client.stream_read("totals", 0, 100).elements]
        assert wait_until(lambda: outputs() == [1, 3, 6, 10], 60, 0.2), outputs()
        read = client.stream_read("invoices", 1, 2)
        assert ([e.value for e in read.elements], read.next) == ([2, 3], 3)
        dead = client.stream_read("billing.totals.dead").elements
        assert [(d.value["queue"], d.value["index"]) for d in dead] == [("invoices", 3)]
        with pytest.raises(RequestRefused) as big:
            client.stream_push("invoices", ["x" * 800_000])
        assert big.value.code == "stream_element_too_large"
        cli_read = cluster.cli("stream", "read", "totals", "--from", "2")
        assert cli_read.exit_code == 0 and cli_read.output.split("\n")[:2] == ["2\t6", "3\t10"]
        pushed = cluster.cli("stream", "push", "invoices", "--value", "5", "--value", "6")
        assert pushed.exit_code == 0 and "pushed 2 to invoices at 5..6" in pushed.output
        assert wait_until(lambda: outputs()[-1:] == [21], 60, 0.2), outputs()

        # a command whose master is killed -9 mid-handler: the next master answers
        master = client.cluster_status().master
        assert master in members
        message_id = str(uuid.uuid4())
        answers: list[Any] = []
        sender = threading.Thread(target=lambda: answers.append(cluster_command(
            cluster, "billing.reindex", {"account": "acme", "hold": 4.0}, message_id, 90)))
        sender.start()
        assert wait_until(lambda: [c.command for c in client.cluster_status().commands]
                          == ["billing.reindex"], 30, 0.1)
        (inflight,) = client.cluster_status().commands
        assert (inflight.id, inflight.member) == (message_id, master)
        top = cluster.cli("top", "--once")
        assert "billing.reindex" in top.output, top.output
        cluster.nodes[master].kill()
        sender.join(120)
        (answer,) = answers
        assert answer["account"] == "acme" and answer["redelivered"] is True
        assert answer["by"] != master and answer["by"] in members
        assert runs_of(zk, message_id) == sorted([master, f"{answer['by']} done"])
        assert zk.client.get(f"/billing/done/{message_id}")[0].decode() == answer["by"]

        # the same id sent twice back to back, both waiting: one run, one answer for both
        twice = str(uuid.uuid4())
        both: list[Any] = []
        senders = [threading.Thread(target=lambda: both.append(cluster_command(
            cluster, "billing.reindex", {"account": "beta", "hold": 0.5}, twice, 60)))
            for _ in range(2)]
        for thread in senders:
            thread.start()
        for thread in senders:
            thread.join(90)
        assert len(both) == 2 and both[0] == both[1], both
        assert [r.endswith("done") for r in runs_of(zk, twice)] == [True]

        # the broadcast reaches every live node
        flushed = tmp_path / "flushed"
        flushed.mkdir()
        client.broadcast("billing.cache.flush", {"dir": str(flushed)})
        alive = [m for m in members if m != master]
        assert wait_until(lambda: len(list(flushed.iterdir())) == 2, 30, 0.1)
        assert sorted(p.name for p in flushed.iterdir()) == sorted(
            m.replace(":", "_") for m in alive)

        handled = 0.0
        ran = 0.0
        for member in alive:
            for key, value in scrape(port_of[member]).items():
                if key == ('latchwork_commands_total{command="billing.reindex",'
                           'outcome="handled"}'):
                    handled += value
                if key == ('latchwork_command_seconds_count{command="billing.reindex",'
                           'result="ok"}'):
                    ran += value
        assert (handled, ran) == (2.0, 2.0)  # the killed master's run was never handled


def test_a_copy_sent_again_gets_the_first_runs_answer_never_a_made_up_one(
        cluster: Cluster, zk_namespace: ZkNamespace) -> None:
    """Issue 40: the handler commits its transaction (which writes the processed record) and
    works 1.5 s more before it returns its answer. The copy sent with the same id finds the
    record while the first run still holds its claim: it waits for the answer (one run) and
    both senders get the same answer, never ``null``."""
    cluster.start_node()
    with Session(zk_namespace.hosts, CLUSTER, timeout=4.0) as zk:
        for account in ("one", "two"):
            message_id = str(uuid.uuid4())
            both: list[Any] = []
            payload = {"account": account, "after": 1.5}
            senders = [threading.Thread(target=lambda answers=both, p=payload, m=message_id:
                                        answers.append(cluster_command(
                                            cluster, "billing.reindex", p, m, 30)))
                       for _ in range(2)]
            for thread in senders:
                thread.start()
                time.sleep(0.2)  # the second is sent while the first is handled
            for thread in senders:
                thread.join(60)
            assert len(both) == 2, both
            assert both[0] == both[1] and both[0]["account"] == account, both
            assert [r.endswith("done") for r in runs_of(zk, message_id)] == [True]
        # the first run committed and failed: its retry finds the effect done and no answer
        message_id = str(uuid.uuid4())
        with pytest.raises(CommandFailed) as lost:
            cluster_command(cluster, "billing.reindex", {"account": "x", "fail_after": True},
                            message_id, 30)
        assert lost.value.code == "answer-lost" and "ran once" in lost.value.detail
        assert [r.endswith("done") for r in runs_of(zk, message_id)] == [True]


def cluster_command(cluster: Cluster, name: str, payload: dict[str, Any], message_id: str,
                    wait: float) -> Any:
    with cluster.client(timeout=10) as client:
        return client.command(name, payload, id=message_id, wait=wait)


def test_refusals_reach_a_waiting_sender_at_once_and_are_dead_lettered(
        cluster: Cluster) -> None:
    """An unknown command, a payload that does not validate, a handler that rejects: each is
    dead-lettered with its reason, and a sender waiting (one second at most here) gets the
    refusal with its code, not a time-out. The CLI exits 2 for them."""
    cluster.start_node()
    with cluster.client() as client:
        cases = [("billing.nosuch", {}, "unknown-command"),
                 ("billing.reindex", {"acount": "x"}, "invalid"),
                 ("billing.refuse", {}, "rejected")]
        for name, payload, code in cases:
            with pytest.raises(CommandRefused) as refused:
                client.command(name, payload, wait=1.0)
            assert refused.value.code == code, refused.value
        reasons = {d.command: d.reason for d in client.dead_letters()}
        assert reasons == {"billing.nosuch": "unknown-command", "billing.reindex": "invalid",
                           "billing.refuse": "rejected"}
        with pytest.raises(RequestRefused, match="command 'no such name'"):
            client.command("no such name", {})
        # without a wait the command is queued and the call returns at once
        assert client.command("billing.reindex", {"account": "gamma"}) is None
        with pytest.raises(NoAnswer, match=r"no answer to MASTER command billing\.reindex"):
            client.command("billing.reindex", {"account": "slow", "hold": 5}, wait=0.5)
    unknown = cluster.cli("command", "send", "billing.nosuch", "--wait", "5")
    assert unknown.exit_code == 2 and "no MASTER handler for command 'billing.nosuch'" \
        in unknown.output
    bad = cluster.cli("command", "send", "billing.reindex", "--payload", "[1]")
    assert bad.exit_code == 2 and "must be a JSON object" in bad.output
    ok = cluster.cli("command", "send", "billing.reindex", "--payload", '{"account": "d"}',
                     "--wait", "30", "--json")
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["account"] == "d"


@pytest.mark.parametrize(("module", "message"), [
    ("usercmds.twice", "usercmds.twice: command 'billing.twice' is already declared"),
    ("usercmds.builtin", "usercmds.builtin: broadcast 'TRIGGER_SCAN' is a built-in command"),
])
def test_a_command_declared_twice_or_taking_a_builtin_name_stops_the_start(
        cluster: Cluster, module: str, message: str) -> None:
    run = cluster.start_without_tasks_setting("--tasks", module)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], run.stderr


def test_a_broadcast_missed_while_disconnected_runs_its_catch_up(
        cluster: Cluster, amqp_vhost: AmqpNamespace, tmp_path: Path) -> None:
    """A node whose broker connection is down when a broadcast is sent never gets it (its
    MODEL queue went with the connection); when the connection is back it runs the
    broadcast's declared catch-up (``on_reconnect``)."""
    port = amqp_vhost.server.node_port
    with TcpProxy(port) as proxy:
        url = cluster.env["LATCHWORK_AMQP_URL"]
        cluster.env["LATCHWORK_AMQP_URL"] = url.replace(f":{port}/", f":{proxy.port}/")
        cluster.start_node()
        cluster.env["LATCHWORK_AMQP_URL"] = url
        flushed, caught_up = tmp_path / "flushed", tmp_path / "caught-up"
        flushed.mkdir()
        with cluster.client() as client:
            # once the node's MODEL queue is bound (it consumes a moment after it joined)
            assert wait_until(lambda: bool(client.broadcast(
                "billing.cache.flush", {"dir": str(flushed)})) and any(flushed.iterdir()),
                30, 0.5), cluster.nodes
            proxy.blackhole()
            proxy.drop_connections()  # the broker sees the node's connections close
            time.sleep(1.0)
            missed = client.broadcast("billing.cache.flush", {"dir": str(flushed)})
            time.sleep(1.0)
            assert not caught_up.exists()
            proxy.heal()
            assert wait_until(lambda: caught_up.exists() and any(caught_up.iterdir()), 60, 0.2)
        assert missed not in [p.read_text() for p in flushed.iterdir()]


FAST = Topology(CLUSTER, retry=RedeliveryPolicy(max_retries=2, first_delay=0.1, factor=1.0))


def test_a_master_whose_session_is_lost_mid_handler_is_cancelled_before_another_starts(
        zk_namespace: ZkNamespace, amqp_vhost: AmqpNamespace) -> None:
    """The master's ZooKeeper link goes silent in the middle of a command: its handler's token
    fires (the latch drops leadership on SUSPENDED) before the next master, which waits for
    the old session to expire, starts the same command; ``ctx.check()`` then refuses the
    effect on the old master, and the command is handled once, by the new one. A sender
    waiting gets the new master's answer."""
    url = amqp_vhost.url
    declare_topology(Connector(url), FAST)
    events: list[tuple[str, str, float]] = []
    registry = HandlerRegistry(Paradigm.MASTER)

    def handler(ctx: HandlerContext, payload: dict[str, Any]) -> str:
        events.append((ctx.member_id, "start", time.monotonic()))
        if ctx.member_id == "member-a":
            assert ctx.cancelled.wait(30)
            events.append((ctx.member_id, "cancelled", time.monotonic()))
        ctx.check()  # member-a: raises HandlerCancelled
        events.append((ctx.member_id, "effect", time.monotonic()))
        return ctx.member_id

    registry.register("work", handler)
    servers, _, chroot = zk_namespace.hosts.partition("/")
    zk_port = int(servers.split(",")[0].rsplit(":", 1)[1])
    with TcpProxy(zk_port) as proxy, \
            Session(f"127.0.0.1:{proxy.port}/{chroot}", CLUSTER, timeout=2.0) as session_a, \
            Session(zk_namespace.hosts, CLUSTER, timeout=2.0) as session_b:
        latch_a = LeaderLatch(session_a, "member-a").start()
        assert latch_a.await_leadership(10)
        latch_b = LeaderLatch(session_b, "member-b").start()
        publishers = [Publisher(Connector(url)) for _ in range(2)]
        consumers = [MasterConsumer(Connector(url), FAST, registry, member, publisher, latch,
                                    ZkProcessedLog(session))
                     for member, publisher, latch, session in (
                         ("member-a", publishers[0], latch_a, session_a),
                         ("member-b", publishers[1], latch_b, session_b))]
        for consumer in consumers:
            consumer.start()
        try:
            answer: list[Any] = []
            with ApiClient(Connector(url), FAST) as sender:
                thread = threading.Thread(target=lambda: answer.append(
                    sender.command("work", {}, wait=60)))
                thread.start()
                assert wait_until(lambda: len(events) == 1, 30, 0.05)
                proxy.blackhole()
                thread.join(90)
            assert answer == ["member-b"]
        finally:
            proxy.heal()
            for consumer in consumers:
                consumer.close()
            for publisher in publishers:
                publisher.close()
            latch_b.close()
            latch_a.close()
    steps = [(member, step) for member, step, _ in events]
    assert steps == [("member-a", "start"), ("member-a", "cancelled"), ("member-b", "start"),
                     ("member-b", "effect")]
    assert events[1][2] < events[2][2]


def test_a_command_failing_past_its_retries_reaches_the_sender_as_a_failure(
        zk_namespace: ZkNamespace, amqp_vhost: AmqpNamespace) -> None:
    """A handler that keeps failing: retried (the sender keeps waiting across the retries),
    then dead-lettered ``retries-exhausted``, and the waiting sender gets the handler's
    message as a failure (not a refusal)."""
    url = amqp_vhost.url
    declare_topology(Connector(url), FAST)
    registry = HandlerRegistry(Paradigm.MASTER)
    tries: list[int] = []

    def failing(ctx: HandlerContext, payload: dict[str, Any]) -> None:
        tries.append(ctx.retries)
        raise RuntimeError("the ledger is offline")

    registry.register("failing", failing)
    with Session(zk_namespace.hosts, CLUSTER, timeout=4.0) as session:
        latch = LeaderLatch(session, "member-a").start()
        assert latch.await_leadership(10)
        with Publisher(Connector(url)) as publisher:
            consumer = MasterConsumer(Connector(url), FAST, registry, "member-a", publisher,
                                      latch, ZkProcessedLog(session))
            consumer.start()
            try:
                with ApiClient(Connector(url), FAST) as sender, \
                        pytest.raises(RemoteError) as failed:
                    sender.command("failing", {}, wait=30)
            finally:
                consumer.close()
                latch.close()
    assert tries == [0, 1, 2]
    assert (failed.value.code, failed.value.refused) == ("retries-exhausted", False)
    assert "the ledger is offline" in failed.value.detail
    assert issubclass(CommandFailed, Exception)  # what Client.command raises for it


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"## Your own master commands.*?```python\n(.*?)```", text, re.S)
    assert match, "README has no 'Your own master commands' example"
    return match.group(1)


def test_the_readme_example_runs(cluster: Cluster, tmp_path: Path) -> None:
    """README "Your own master commands": its module, loaded by a node, answers the command
    the README sends, once, and its broadcast runs."""
    code = readme_example()
    module, _, script = code.partition("# --- the sender")
    assert 12 <= len(module.strip().splitlines()) <= 26
    site = tmp_path / "readme"
    site.mkdir()
    (site / "mypkg_commands.py").write_text(module)
    cluster.env["PYTHONPATH"] = os.pathsep.join([str(site), cluster.env["PYTHONPATH"]])
    cluster.env["LATCHWORK_TASKS"] = json.dumps(["mypkg_commands"])
    cluster.start_node()
    (tmp_path / "send.py").write_text(script)
    run = subprocess.run([sys.executable, str(tmp_path / "send.py")], env=cluster.env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout.strip().splitlines()[-1])
    assert answer["account"] == "acme" and answer["reindexed"] is True
