"""The Python client against a real cluster (node processes, ZooKeeper, RabbitMQ), and the
README's example run as a user would run it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from coord import LifecycleError
from coord.testing import free_ports
from messaging.testing.plugin import AmqpNamespace
from messaging.testing.rabbitmq import RabbitMQServer
from runner.client import Client
from runner.errors import BrokerUnreachable, NoAnswer, RequestFailed, RequestRefused
from runner.store import codec
from runner.testing.cluster import CLUSTER, Cluster

README = Path(__file__).resolve().parent.parent / "README.md"



def test_every_call_of_the_client(cluster: Cluster) -> None:
    member = cluster.start_node()
    with cluster.client() as client:
        ref = client.submit("diag.sleep", {"seconds": 0.2}, priority=3, unique_key="k1")
        assert client.submit("diag.sleep", {"seconds": 0.2}, unique_key="k1").id == ref.id
        report = client.wait(ref.id, timeout=30)
        assert report.done and report.succeeded and report.task.priority == 3
        assert [(a.seq, a.status, a.executor) for a in report.attempts] == \
            [(1, "SUCCEEDED", member)]
        assert client.get(ref.id) == report
        assert [t.id for t in client.list()] == [ref.id]
        assert client.list(unfinished=True) == []

        failing = client.submit("diag.fail", {"message": "no such file"})
        stopped = client.wait(failing.id, timeout=30)
        assert stopped.done and not stopped.succeeded and stopped.task.stopped
        assert "no such file" in (stopped.attempts[-1].error or "")

        long = client.submit("diag.sleep", {"seconds": 60})
        deadline = time.monotonic() + 30
        while client.get(long.id).task.status != "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.1)
        cancelled = client.cancel(long.id, reason="from the client test")
        assert not cancelled.active and len(cancelled.cancelled_attempts) == 1
        after = client.wait(long.id, timeout=10)
        assert after.attempts[-1].status == "CANCELLED"
        assert "from the client test" in (after.attempts[-1].error or "")
        assert client.reactivate(long.id).active
        assert client.deactivate(long.id).active is False

        status = client.cluster_status()
        assert status.cluster == CLUSTER and status.master == member
        assert [m.id for m in status.members] == [member]


def test_errors_have_their_types_and_codes(cluster: Cluster,
                                           amqp_vhost: AmqpNamespace) -> None:
    # no node yet: nobody answers
    with Client(amqp_vhost.url, CLUSTER, timeout=1.0) as client:
        with pytest.raises(NoAnswer) as no_answer:
            client.list()
        assert no_answer.value.code == "no_answer"
    with Client(f"amqp://guest:guest@127.0.0.1:{free_ports(1)[0]}/%2F", CLUSTER,
                timeout=1.0) as client, pytest.raises(BrokerUnreachable):
        client.list()
    cluster.start_node()
    with cluster.client() as client:
        with pytest.raises(RequestRefused) as refused:
            client.submit("diag.sleep", {"sceonds": 1})
        assert refused.value.code == "payload_invalid" and "sceonds" in refused.value.detail
        with pytest.raises(RequestFailed) as missing:
            client.get("no-such-task")
        assert missing.value.code == "task_not_found"
        assert not isinstance(missing.value, RequestRefused)
        with pytest.raises(NoAnswer):
            client.wait(client.submit("diag.sleep", {"seconds": 30}).id, timeout=0.5)
        # the contract is checked here too: a wrong request is refused before it is sent
        with pytest.raises(RequestRefused) as empty:
            client.get("")
        assert (empty.value.code, empty.value.command) == ("invalid", "task.get")
        with pytest.raises(RequestRefused) as naive:
            client.submit("diag.sleep", {"seconds": 1}, run_at=datetime(2030, 1, 1))
        assert naive.value.code == "invalid" and "timezone" in naive.value.detail
    # a closed client refuses to be used instead of reconnecting behind its owner's back
    with pytest.raises(LifecycleError, match="closed"):
        client.list()


def test_the_contract_is_every_command_the_node_answers() -> None:
    """One request model per command (runner.requests), and the node has a handler for each
    and for nothing else: the client, the node and the CLI share these models."""
    from runner.node.api import NodeApi
    from runner.requests import COMMANDS

    handlers = NodeApi.handlers()
    assert set(handlers) == set(COMMANDS)
    assert all(model is COMMANDS[command] for command, (_, model) in handlers.items())
    cli_sources = "\n".join(p.read_text() for p in (README.parent / "runner" / "cli").glob("*.py"))
    assert ".request(" not in cli_sources, "the CLI sends raw command strings"


def test_every_command_names_its_reply_and_its_handler_returns_that_model() -> None:
    """The contract covers the answer too: every request names its reply type (declaring a
    command without one fails), each node handler is annotated to return exactly it (mypy
    checks the bodies against the annotations), and no reply is an untyped dict."""
    import typing

    from runner.node.api import NodeApi
    from runner.requests import Request

    def loose(kind: object) -> bool:  # a dict or list of Any, anywhere in the type
        return kind is typing.Any or kind is dict or kind is list \
            or any(loose(arg) for arg in typing.get_args(kind))

    for command, (name, model) in NodeApi.handlers().items():
        reply = model.reply_type()
        assert reply is not None, command
        returned = typing.get_type_hints(getattr(NodeApi, name))["return"]
        assert returned == reply, f"{command}: its handler returns {returned}, not {reply}"
        assert not loose(reply), f"{command} answers an untyped {reply}"
    with pytest.raises(TypeError, match="names no reply type"):
        class Unanswered(Request):  # type: ignore[type-arg]
            command = "test.unanswered"


def test_a_bulk_submit_page_goes_on_the_wire_as_it_was_measured() -> None:
    """``submit_many`` cuts pages by the JSON size of their items without unset fields; the
    request it sends must be that size too (not 500 items' worth of nulls more, past
    ``SUBMIT_PAGE_BYTES`` and towards the broker's body limit)."""
    from runner.client import _pages, build
    from runner.requests import SUBMIT_PAGE_BYTES, TaskSubmitMany, TaskTemplate

    items = [TaskTemplate(type="diag.sleep", payload={"note": "y" * 300}) for _ in range(1200)]
    pages = list(_pages(items))
    assert [len(p) for p in pages] == [500, 500, 200]
    for page in pages:
        sent = build(TaskSubmitMany, tasks=page, page="page-key-1").model_dump(mode="json")
        assert len(json.dumps(sent)) <= SUBMIT_PAGE_BYTES
        assert all(set(item) == {"type", "payload", "resources"} for item in sent["tasks"])


def test_the_readme_example_runs(cluster: Cluster) -> None:
    member = cluster.start_node()
    code = re.search(r"## Python client.*?```python\n(.*?)```", README.read_text(),
                     re.DOTALL)
    assert code is not None
    assert len(code.group(1).splitlines()) <= 25
    run = subprocess.run([sys.executable, "-c", code.group(1)], env=cluster.env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert re.search(r"^1 SUCCEEDED " + re.escape(member), run.stdout, re.MULTILINE)
    assert "refused: payload_invalid" in run.stdout and "sceonds" in run.stdout
    assert f"master: {member}" in run.stdout


def test_dead_letters_are_listed_shown_and_replayed_with_their_ids(cluster: Cluster) -> None:
    from coord.testing import wait_until
    from messaging import Connector, Envelope, Paradigm, Publisher, Topology

    node = cluster.start_node()
    topology = Topology(CLUSTER)
    publisher = Publisher(Connector(cluster.env["LATCHWORK_AMQP_URL"]))
    try:
        poison = Envelope(paradigm=Paradigm.MASTER, command="NO_SUCH_COMMAND", sender="tests")
        publisher.publish("", topology.master_queue, poison)
        with cluster.client() as client:
            assert wait_until(lambda: client.dead_letter_count() == 1, 30)
            listing = cluster.cli("dlq", "list")
            assert listing.exit_code == 0
            assert str(poison.id) in listing.output and "unknown-command" in listing.output
            shown = json.loads(cluster.cli("dlq", "show", str(poison.id), "--json").output)
            assert (shown["command"], shown["reason"], shown["queue"], shown["member"]) == (
                "NO_SUCH_COMMAND", "unknown-command", topology.master_queue, node)

            # a MASTER message that was handled, whose copy still ended in the dead-letter
            # queue: replayed with its id, the master recognises it and acks it as a duplicate
            handled = Envelope(paradigm=Paradigm.MASTER, command="SYNCHRONIZE_MODEL",
                               sender="tests", payload={"reason": "test"})
            log = cluster.nodes[node].log_path
            ran = "nothing to synchronise"  # what the handler logs on a node without a source

            def runs() -> int:
                return log.read_text().count(ran)

            assert wait_until(lambda: runs() == 1, 30)  # the new master's own request
            publisher.publish("", topology.master_queue, handled)
            assert wait_until(lambda: runs() == 2, 30)
            publisher.publish("", topology.dead_queue, handled, headers={
                "x-latchwork-reason": "handler-failed", "x-latchwork-queue":
                topology.master_queue, "x-latchwork-member": node})
            assert wait_until(lambda: client.dead_letter_count() == 2, 10)
            replay = cluster.cli("dlq", "replay", str(handled.id))
            assert replay.exit_code == 0 and topology.master_queue in replay.output
            assert wait_until(lambda: "was already processed; acked" in log.read_text(), 30)
            assert client.dead_letter_count() == 1
            assert runs() == 2  # handled once

            # the poison message replayed is rejected again, for the same reason
            client.replay(str(poison.id))
            assert wait_until(lambda: client.dead_letter_count() == 1, 10)
            assert client.dead_letter(str(poison.id)).reason == "unknown-command"
            missing = cluster.cli("dlq", "replay", "no-such-id")
            assert missing.exit_code == 1 and "no dead-lettered message no-such-id" in \
                missing.output

            # the client keeps its dead-letter connection; one the broker closed meanwhile is
            # opened again before use, not reported as an error
            kept = client._dead._connection
            assert client.dead_letter_count() == 1 and client._dead._connection is kept
            assert isinstance(cluster.amqp.server, RabbitMQServer)
            cluster.amqp.server.ctl("close_all_connections", "--vhost", cluster.amqp.vhost,
                                    "test: the broker closes every connection")
            assert wait_until(lambda: not kept.is_open or _serviced(kept), 10, 0.1)
            assert client.dead_letter_count() == 1 and client._dead._connection is not kept
    finally:
        publisher.close()


def test_a_client_idle_while_the_broker_closed_its_connection_sends_its_next_request(
        cluster: Cluster) -> None:
    """A client left idle (a script between two phases, a bench waiting for a drain) whose
    connection the broker closed meanwhile (a restart, missed heartbeats: a blocking
    connection answers them only when used) connects again before it sends: the next request
    is answered, not refused with ``BrokerUnreachable``."""
    cluster.start_node()
    with cluster.client() as client:
        assert client.list() == []
        kept = client._api._connection
        assert kept is not None and kept.is_open
        assert isinstance(cluster.amqp.server, RabbitMQServer)
        cluster.amqp.server.ctl("close_all_connections", "--vhost", cluster.amqp.vhost,
                                "test: the broker closes every connection")
        time.sleep(0.5)  # the close is on the client's socket, unread
        ref = client.submit("diag.sleep", {"seconds": 0})
        assert client._api._connection is not kept
        assert client.wait(ref.id, timeout=30).succeeded


def _serviced(connection: Any) -> bool:
    """Let a pika connection read what the broker sent (a close); False while it is open."""
    from messaging.connection import CONNECTION_ERRORS
    try:
        if connection.is_open:
            connection.process_data_events(time_limit=0)
    except CONNECTION_ERRORS:
        return True
    return not connection.is_open


def test_progress_reported_by_a_handler_shows_in_list_and_show(cluster: Cluster) -> None:
    from coord.testing import wait_until

    cluster.start_node()
    with cluster.client() as client:
        # long enough to be still running after the two CLI calls below, even on a busy box
        ref = client.submit("diag.sleep", {"seconds": 10})

        def reported() -> bool:
            (view,) = [t for t in client.list() if t.id == ref.id]
            return view.progress is not None and view.progress.done >= 2

        assert wait_until(reported, 20, 0.2)
        listing = cluster.cli("task", "list")
        assert ref.id in listing.output and "[####" in listing.output
        assert "/10" in listing.output
        shown = cluster.cli("task", "show", ref.id)
        assert "progress" in shown.output and "of 10 s" in shown.output
        final = client.wait(ref.id, timeout=30)
        assert final.attempts[-1].progress is not None
        assert (final.attempts[-1].progress.done, final.attempts[-1].progress.total) == (10, 10)


def test_top_and_follow_show_a_live_cluster(cluster: Cluster) -> None:
    """``latchwork top`` renders what is going on (checked in a captured rich Console and in
    the real command's output); ``task show --follow`` streams attempts until the end."""
    from rich.console import Console

    from coord.testing import wait_until
    from messaging import Connector, Envelope, Paradigm, Publisher, Topology
    from runner.cli.top import follow, read_frame, render

    members = [cluster.start_node() for _ in range(2)]
    publisher = Publisher(Connector(cluster.env["LATCHWORK_AMQP_URL"]))
    publisher.publish("", Topology(CLUSTER).master_queue, Envelope(
        paradigm=Paradigm.MASTER, command="NO_SUCH_COMMAND", sender="tests"))
    publisher.close()
    with cluster.client() as client:
        failed = client.submit("diag.fail", {"message": "disk full"})
        client.wait(failed.id, timeout=30)
        busy = [client.submit("diag.sleep", {"seconds": 6}) for _ in range(2)]
        queued = [client.submit("diag.sleep", {"seconds": 6}, priority=2) for _ in range(3)]
        assert wait_until(lambda: client.dead_letter_count() == 1, 20)

        def frame_text() -> str:
            console = Console(record=True, width=200)
            console.print(render(read_frame(client), wide=True))
            return console.export_text()

        def running_with_progress() -> bool:
            text = frame_text()
            return all(t.id in text for t in busy[:1]) and "[##" in text

        assert wait_until(running_with_progress, 20, 0.3)
        text = frame_text()
        status = client.cluster_status()
        for member in members:
            assert member in text
        assert f"master {status.master}" in text and "master" in text
        assert "running: " in text and "waiting: " in text
        assert "diag.sleep" in text and "disk full" in text and "failed" in text
        assert "dead-lettered messages: 1" in text
        # 2 nodes x 2 workers: 4 of the 5 sleeps run, the 5th (priority 2) waits
        assert wait_until(lambda: re.search(r"diag\.sleep\s*│\s*2\s*│\s*1\s*│", frame_text())
                          is not None, 10, 0.3)
        assert len(queued) == 3

        once = cluster.cli("top", "--once")
        assert once.exit_code == 0 and "last ended attempts" in once.output
        assert "dead-lettered messages: 1" in once.output
        # task ids: short unique prefixes (git's way), whole with --wide; never cut with "…"
        short = [t.id[:8] for t in busy if t.id[:8] in once.output]
        assert short and not any(t.id in once.output for t in busy), once.output
        assert "…" not in once.output.split("last ended attempts")[0]
        wide = cluster.cli("top", "--once", "--wide")
        assert wide.exit_code == 0 and any(t.id in wide.output for t in busy), wide.output

        # a task of its own, followed from its submit: the busy ones may have ended while the
        # two CLI calls above ran (each a process of its own, slow on a loaded box)
        followed = client.submit("diag.sleep", {"seconds": 3})
        lines: list[str] = []
        assert follow(client, followed.id, lines.append, poll=0.2) == 0
        assert lines[-1] == f"task {followed.id} succeeded"
        assert any("running" in line for line in lines)
        assert any("succeeded" in line for line in lines)
        assert follow(client, failed.id, lines.append, poll=0.2) == 1
    shown = cluster.cli("task", "show", busy[1].id, "--follow")
    assert shown.exit_code == 0 and f"task {busy[1].id} succeeded" in shown.output
    stopped = cluster.cli("task", "show", failed.id, "--follow")
    assert stopped.exit_code == 1 and f"task {failed.id} failed" in stopped.output


def test_a_bulk_submit_page_whose_answer_was_lost_is_sent_again_and_written_once(
        cluster: Cluster) -> None:
    """A page of ``Client.submit_many`` written by its node, its answer lost (a node paused
    past the client's wait, a reply that never came: NoAnswer): the client sends the page
    again under its key, and the node finds the tasks it wrote instead of writing them twice;
    the ids come back in order, each task once. A page sent again by hand with its key
    answers the same ids."""
    from runner.errors import NoAnswer
    from runner.requests import TaskSubmitMany

    cluster.start_node()
    items = [{"type": "diag.sleep", "payload": {"seconds": 0}, "priority": 7}
             for _ in range(600)]
    sent: list[str] = []
    with cluster.client(timeout=30) as client:
        original = client.send

        def answer_lost_once(request: Any) -> Any:
            reply = original(request)
            if isinstance(request, TaskSubmitMany):
                sent.append(str(request.page))
                if len(sent) == 2:  # the second page was written: its answer is lost
                    raise NoAnswer("no node answered task.submit_many within 30s")
            return reply

        client.send = answer_lost_once  # type: ignore[method-assign]
        ids = client.submit_many(items)
        assert len(sent) == 3 and sent[1] == sent[2] != sent[0]  # the second sent again
        assert len(ids) == 600 and len(set(ids)) == 600
        made = cluster.store.graph.read(lambda g: g.V().has("task_priority", 7).count().next())
        assert made == 600
        again = cluster.request("task.submit_many", {"tasks": items[500:], "page": sent[2]})
        assert again["ids"] == ids[500:]
        for task_id in (ids[0], ids[599]):
            assert client.wait(task_id, 60).succeeded
    assert cluster.store.graph.read(lambda g: g.V().has("task_priority", 7).count().next()) \
        == 600


def test_a_submit_the_broker_delivers_twice_creates_its_task_once(cluster: Cluster) -> None:
    """A ``task.submit`` request handled twice: the broker delivers it again when the node
    that took it was killed, paused or cut off before its ack, and the copy keeps its message
    id (the chaos suite saw a second task made that way, its first one run besides). Here
    sent with one id through two clients at once (two nodes may take the copies together),
    then once more after the task ended: every answer names one task, written once, run by
    one attempt."""
    import threading
    import uuid

    from runner.store import AttemptStatus

    cluster.start_node()
    cluster.start_node()
    same = uuid.uuid4()
    submit = {"type": "diag.sleep", "payload": {"seconds": 0.3}, "priority": 6}
    answers: list[Any] = []

    def send() -> None:
        with cluster.client(timeout=30) as client:
            answers.append(client._api.request("task.submit", submit, 30, message_id=same))

    senders = [threading.Thread(target=send) for _ in range(2)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(60)
    assert len(answers) == 2 and answers[0]["id"] == answers[1]["id"]
    task_id = answers[0]["id"]
    with cluster.client(timeout=30) as client:
        assert client.wait(task_id, 30).succeeded
        again = client._api.request("task.submit", submit, 30, message_id=same)
    assert again["id"] == task_id and again["finished"] and again["attempts"] == 1
    assert cluster.store.graph.read(lambda g: g.V().has("task_priority", 6).count().next()) \
        == 1
    assert [a.status for a in cluster.store.attempts.for_task(task_id)] == [
        AttemptStatus.SUCCEEDED]


def test_a_trigger_scan_that_says_behind_makes_the_nodes_read_a_late_write(
        cluster: Cluster) -> None:
    """A task written ready 20 s behind the nodes' cursors (its writer paused after it stamped
    it, as a SIGSTOP of the node writing a bulk page does: seen in the chaos suite) is beyond
    any walk's reach; the TRIGGER_SCAN its writer sends with ``behind`` (what ``submit`` and
    ``submit_many`` send) makes a node read from there and run it."""
    import dataclasses

    from runner.store.gremlin.rows import task_props
    from runner.store.gremlin.steps import add_vertex

    cluster.start_node()
    with cluster.client(timeout=30) as client:
        first = client.submit("diag.sleep", {"seconds": 0})
        assert client.wait(first.id, 30).succeeded
        time.sleep(3)  # the node's cursor passes now - 2 s
        when = codec.now() - timedelta(seconds=20)
        late = dataclasses.replace(cluster.store.tasks.new("diag.sleep", {"seconds": 0}),
                                   created_at=when, updated_at=when)
        cluster.store.graph.write(lambda g: add_vertex(g, "task", task_props(late)).iterate())
        client.broadcast("TRIGGER_SCAN", {})
        time.sleep(2.5)
        assert cluster.task(late.id).status.value == "WAITING"  # no walk reaches it
        client.broadcast("TRIGGER_SCAN", {"behind": when.isoformat()})
        assert client.wait(late.id, 20).succeeded


def test_a_task_due_past_the_horizon_tells_no_node_to_scan(cluster: Cluster) -> None:
    """A task that waits in a time bucket (due past the open queue's horizon) cannot be found
    by a scan before the master moves its bucket into the ready lanes: its submit, and a page
    of such tasks, tell no node to scan (no TRIGGER_SCAN on the MODEL exchange, read here by a
    queue of the test's own); a task due soon that the accepting node cannot start now, and a
    page with one task due now, each tell them once."""
    import pika

    from messaging.envelope import decode
    from messaging.topology import Topology

    cluster.start_node()
    connection = pika.BlockingConnection(pika.URLParameters(cluster.env["LATCHWORK_AMQP_URL"]))
    try:
        channel = connection.channel()
        exchange = Topology(CLUSTER).model_exchange
        channel.exchange_declare(exchange, exchange_type="fanout", durable=True)
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.queue_bind(queue, exchange)
        later: dict[str, Any] = {"type": "diag.sleep", "payload": {"seconds": 0}, "delay": 3600}
        with cluster.client(timeout=30) as client:
            client.submit("diag.sleep", {"seconds": 0}, delay=3600)
            client.submit_many([later] * 3)
            soon = client.submit("diag.sleep", {"seconds": 0}, delay=0.5)
            client.submit_many([later, {"type": "diag.sleep", "payload": {"seconds": 0}}])
            assert client.wait(soon.id, 30).succeeded
        scans = []  # each broadcast went before its submit was answered
        while (got := channel.basic_get(queue, auto_ack=True))[0] is not None:
            envelope = decode(got[2])
            if envelope.command == "TRIGGER_SCAN":
                scans.append(envelope.payload)
    finally:
        connection.close()
    assert [p["task"] for p in scans if "task" in p] == [soon.id]
    assert [p["tasks"] for p in scans if "tasks" in p] == [2]


def test_submit_many_creates_pages_in_one_request_each_and_refuses_a_page_by_its_item(
        cluster: Cluster, tmp_path: Path) -> None:
    """``Client.submit_many``: 1,100 tasks in three pages (500, 500, 100), their ids in order,
    every one run once; a uniqueness key honoured within a page and across; an item the client
    can check (a field that does not exist) refused before anything is sent, naming its index;
    one only a node can check (an unknown type) refuses its page, naming the item, while the
    pages before it stay created. ``latchwork task submit --file``: one task a line."""
    from runner.requests import SUBMIT_PAGE

    cluster.start_node()
    items: list[dict[str, Any]] = [{"type": "diag.sleep", "payload": {"seconds": 0}}
                                   for _ in range(1100)]
    items[10]["unique_key"] = items[1050]["unique_key"] = "once"
    with cluster.client(timeout=30) as client:
        ids = client.submit_many(items)
        assert len(ids) == 1100 and len(set(ids)) == 1099 and ids[10] == ids[1050]
        for task_id in (ids[0], ids[499], ids[500], ids[1099]):
            assert client.wait(task_id, 60).succeeded
        with pytest.raises(RequestRefused, match=r"task 3: .*sceonds"):
            client.submit_many([{"type": "diag.sleep"}] * 3
                               + [{"type": "diag.sleep", "sceonds": 1}])
        bad = [{"type": "diag.sleep", "payload": {"seconds": 0}} for _ in range(SUBMIT_PAGE + 5)]
        bad[SUBMIT_PAGE + 2]["type"] = "no.such.type"
        with pytest.raises(RequestRefused) as refused:
            client.submit_many(bad)
        assert refused.value.code == "task_type_unknown"
        assert "task 2 of the page" in refused.value.detail
        assert f"the {SUBMIT_PAGE} before were created" in refused.value.detail
        assert len(refused.value.done) == SUBMIT_PAGE
        assert client.get(refused.value.done[-1]).task.id == refused.value.done[-1]
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text('{"type": "diag.sleep", "payload": {"seconds": 0}}\n\n'
                     '{"type": "diag.sleep", "payload": {"seconds": 0}, "priority": 3}\n')
    run = cluster.cli("task", "submit", "--file", str(jsonl))
    assert run.exit_code == 0, run.output
    made = run.output.split()
    assert len(made) == 2 and cluster.request("task.get", {"id": made[1]})["task"]["priority"] == 3
    jsonl.write_text('{"type": "diag.sleep"}\nnot json\n')
    broken = cluster.cli("task", "submit", "--file", str(jsonl))
    assert broken.exit_code == 2 and "line 2: not valid JSON" in broken.output


def test_task_submit_has_one_option_per_task_field_and_checks_no_rule_itself() -> None:
    """The CLI builds the request's model from its options: every field of TaskTemplate but
    ``type`` (the argument) has its option, every option but the command's own (--file and
    the connection's) fills a field, and a refusal is the model's (the same text the node would
    give), naming the option."""
    import click as _click

    from runner.cli.tasks import SUBMIT_OPTIONS, submitted, task_submit
    from runner.requests import TaskTemplate

    options = {p.name for p in task_submit.params if isinstance(p, _click.Option)}
    own = {"from_file", "config", "as_json", "timeout"}
    assert options - own == set(SUBMIT_OPTIONS)
    assert set(SUBMIT_OPTIONS.values()) == set(TaskTemplate.model_fields) - {"type"}
    with pytest.raises(_click.BadParameter, match="give run_at or delay, not both"):
        submitted("diag.sleep", {"run_at": "2030-01-01T00:00:00+00:00", "delay": 1.0})
    with pytest.raises(_click.BadParameter) as refused:
        submitted("diag.sleep", {"time_limit": -1.0})
    assert refused.value.param_hint == "--time-limit"


def test_schedule_add_has_one_option_per_schedule_field_and_checks_no_rule_itself() -> None:
    import click as _click

    from runner.cli.schedules import SCHEDULE_OPTIONS, schedule_add, scheduled
    from runner.requests import ScheduleSpec

    options = {p.name for p in schedule_add.params if isinstance(p, _click.Option)}
    assert options - {"config", "as_json", "timeout"} == set(SCHEDULE_OPTIONS)
    assert set(SCHEDULE_OPTIONS.values()) == set(ScheduleSpec.model_fields)
    with pytest.raises(_click.BadParameter, match="one of them"):
        scheduled({"cron": "* * * * *", "every": "5s", "task_type": "diag.sleep"})
    assert scheduled({"every": "5m", "task_type": "diag.sleep"}).every == 300.0
