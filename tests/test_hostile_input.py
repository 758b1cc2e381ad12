"""Input from outside that once broke a cluster (issue 70, item 0), each against real servers:
a hand-made AMQP message the consumer looped on, numbers that killed a node's thread or broke
the listings for everyone, a listing over the message limit read as "no node answered", a dead
letter the operator's tool could not show, and a node whose own thread died running on with a
guarantee switched off. Each is refused once with a documented code, or shown, and the node
answers on."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pika
import pytest

from coord.testing import wait_until
from messaging.testing.outside import OutsideClient as Raw
from runner.errors import RequestFailed, RequestRefused
from runner.requests import TaskList
from runner.testing.cluster import CLUSTER, Cluster
from runner.testing.cluster import log_problems as quiet


def envelope(paradigm: str, command: str, payload_json: str) -> bytes:
    """A message body as an outside client writes it, with ``payload_json`` spliced in raw (so
    it can hold what json.dumps would not write: 5,000 digits, ``Infinity``)."""
    head = json.dumps({"v": 1, "id": str(uuid.uuid4()), "paradigm": paradigm,
                       "command": command, "created_at": "2026-12-07T10:00:00+00:00",
                       "sender": "outside"})
    return f'{head[:-1]}, "payload": {payload_json}}}'.encode()


def test_hand_made_messages_that_looped_consumers_are_refused_once(cluster: Cluster) -> None:
    """A 5,000-digit integer, ``Infinity``, a float past a double, JSON nested 2,000 deep, and
    an ``x-latchwork-retries`` header that is no number: each API request and MASTER command
    is answered once (``invalid``/``undecodable``), dead-lettered once, and the node logs no
    error and answers on. Before, the consumer failed on each delivery and requeued it, for
    ever."""
    member = cluster.start_node()
    raw = Raw(cluster.env["LATCHWORK_AMQP_URL"], CLUSTER)
    api, master = raw.topology.api_queue, raw.topology.master_queue
    try:
        sent = {
            "big int": raw.send(api, envelope("API", "task.submit",
                                              '{"type": "diag.sleep", "payload": {"seconds": '
                                              + "9" * 5000 + "}}")),
            "Infinity": raw.send(api, envelope("API", "task.submit",
                                               '{"type": "diag.sleep", "delay": Infinity}')),
            "1e999": raw.send(api, envelope("API", "task.submit",
                                            '{"type": "diag.sleep", "timeout": 1e999}')),
            "deep": raw.send(api, envelope("API", "task.submit", "[" * 2000 + "]" * 2000)),
            "api retries": raw.send(api, envelope("API", "cluster.status", "{}"),
                                    headers={"x-latchwork-retries": "abc"}),
            "master retries": raw.send(master, envelope("MASTER", "SYNCHRONIZE_MODEL",
                                                        '{"reason": "outside"}'),
                                       headers={"x-latchwork-retries": "abc"}),
            "master big int": raw.send(master, envelope(
                "MASTER", "SYNCHRONIZE_MODEL", '{"reason": ' + "1" * 4400 + "}")),
        }
        raw.wait(list(sent.values()), 30)
        for what, correlation in sent.items():
            answers = raw.answers.get(correlation, [])
            assert len(answers) == 1, f"{what}: {answers}"
            (answer,) = answers
            assert answer["ok"] is False and answer["error"]["code"] in (
                "invalid", "undecodable"), f"{what}: {answer}"
        details = {what: raw.answers[c][0]["error"]["detail"] for what, c in sent.items()}
        assert "5000 digits" in details["big int"]
        assert "Infinity is not a JSON number" in details["Infinity"]
        assert "x-latchwork-retries" in details["api retries"]
        assert "x-latchwork-retries" in details["master retries"]
        with cluster.client() as client:
            assert wait_until(lambda: client.dead_letter_count() == len(sent), 10)
            assert client.cluster_status().members  # the node answers on
            time.sleep(1.0)  # a requeue loop, if any, would fill the log meanwhile
            assert client.dead_letter_count() == len(sent)
    finally:
        raw.close()
    assert quiet(cluster.nodes[member].log_path.read_text()) == []


@pytest.mark.parametrize("option, value, says", [
    ("--time-limit", "1e10", "timeout"),
    ("--time-limit", "inf", "timeout"),
    ("--priority", str(2 ** 62), "priority"),
    ("--priority", str(-2 ** 62), "priority"),
    ("--delay", "inf", "delay"),
    ("--delay", "nan", "delay"),
    ("--delay", "1e12", "delay"),
    ("--run-at", "9999-12-31T23:59:59-14:00", "run_at"),
    ("--run-at", "0001-01-01T00:00:00+14:00", "run_at"),
    ("--run-at", "2200-01-01T00:00:00+00:00", "10 years"),
])
def test_numbers_out_of_their_documented_range_are_refused_at_submit(
        cluster: Cluster, option: str, value: str, says: str) -> None:
    """Each exited 0 before and then damaged the cluster (a node's time-limit thread dead,
    every listing failing, a task started at once, an internal_error): now exit 2 naming the
    field. The same request through the API is refused ``invalid`` (the node's check, not
    only the CLI's)."""
    result = cluster.cli("task", "submit", "diag.sleep", "--payload", '{"seconds": 0}',
                         option, value)
    assert result.exit_code == 2 and says in result.output, result.output
    assert "Traceback" not in result.output


def test_the_api_refuses_the_same_numbers_and_the_listings_stay_readable(
        cluster: Cluster) -> None:
    cluster.start_node()
    bad: list[dict[str, Any]] = [{"timeout": 1e10}, {"priority": 2 ** 62}, {"delay": 1e12},
                                 {"run_at": "9999-12-31T23:59:59-14:00"}]
    with cluster.client() as client:
        for fields in bad:
            with pytest.raises(RequestRefused) as refused:
                client.request("task.submit", {"type": "diag.sleep",
                                               "payload": {"seconds": 0}, **fields})
            assert refused.value.code == "invalid", fields
        edge = client.submit("diag.sleep", {"seconds": 0}, priority=1_000_000, delay=3600,
                             timeout=366 * 86400)
        assert client.get(edge.id).task.priority == 1_000_000
        assert edge.id in {t.id for t in client.list()}
        assert edge.id in {t.id for t in client.search()[0]}


def test_a_listing_over_the_message_limit_comes_in_pages(cluster: Cluster) -> None:
    """300 tasks of 2 KB each are 600 KB of listing: over the 256 KiB a reply may be. The
    node answers pages under the limit and the client and ``task list --json`` walk them;
    before, the reply was dropped unread and the CLI said no node answered."""
    cluster.start_node()
    message = "x" * 2000
    with cluster.client(timeout=30) as client:
        ids = client.submit_many([{"type": "diag.fail", "payload": {"message": message},
                                   "delay": 3600}] * 300)
        listed = client.list()
        assert [t.id for t in listed] == list(reversed(ids))  # newest first, each once
        first = client.send(TaskList())
        assert 0 < len(first.tasks) < 300 and first.next is not None
    result = cluster.cli("task", "list", "--json", timeout=120)
    assert result.exit_code == 0, result.output[-2000:]
    assert sorted(t["id"] for t in json.loads(result.output)) == sorted(ids)


def test_an_answer_over_the_limit_is_an_error_not_silence(cluster: Cluster) -> None:
    """A node allowed 1 MiB messages answers a submit of a 300 KB task to a client that reads
    256 KiB: the client raises ``reply-too-large`` at once (not a refusal: the task exists)
    instead of waiting out its timeout and saying no node answered. A node whose own limit is
    below its answer sends that error itself."""
    cluster.env["LATCHWORK_MAX_MESSAGE_BYTES"] = str(1024 * 1024)
    first = cluster.start_node()
    with cluster.client(timeout=30) as client:
        started = time.monotonic()
        with pytest.raises(RequestFailed) as failed:
            client.submit("diag.fail", {"message": "y" * 300_000}, delay=3600)
        assert failed.value.code == "reply-too-large"
        assert not isinstance(failed.value, RequestRefused)
        assert time.monotonic() - started < 20  # answered, not timed out
    (big,) = [t for t in cluster.store.tasks.all(None) if t.type == "diag.fail"]
    cluster.nodes[first].terminate()
    cluster.env["LATCHWORK_MAX_MESSAGE_BYTES"] = "2048"
    member = cluster.start_node()
    with cluster.client(timeout=30) as client:
        with pytest.raises(RequestFailed) as failed:
            client.get(big.id)
        assert failed.value.code == "reply-too-large"
    log = cluster.nodes[member].log_path.read_text()
    assert "answering reply-too-large" in log and quiet(log) == []


def test_any_dead_letter_is_shown_whatever_its_body(cluster: Cluster) -> None:
    """A dead letter whose body is 2,000 ``[`` made ``dlq list`` and ``dlq show`` fail with a
    RecursionError traceback; now both show its raw bytes, truncated."""
    member = cluster.start_node()
    raw = Raw(cluster.env["LATCHWORK_AMQP_URL"], CLUSTER)
    try:
        raw.channel.basic_publish("", raw.topology.api_queue, b"[" * 2000,
                                  pika.BasicProperties(content_type="application/json",
                                                       message_id="deep-one"))
    finally:
        raw.close()
    with cluster.client() as client:
        assert wait_until(lambda: client.dead_letter_count() == 1, 30)
    for args in (["dlq", "list"], ["dlq", "list", "--json"], ["dlq", "show", "deep-one"],
                 ["dlq", "show", "deep-one", "--json"]):
        result = cluster.cli(*args)
        assert result.exit_code == 0 and "Traceback" not in result.output, result.output
        assert "undecodable" in result.output
    shown = json.loads(cluster.cli("dlq", "show", "deep-one", "--json").output)
    assert shown["body"] == "[" * 2000  # its bytes, under the shown limit
    assert quiet(cluster.nodes[member].log_path.read_text()) == []


BREAKS_LIMITS = '''
"""Simulates the thread death a value once caused (--time-limit 1e10: OverflowError in the
time-limit watcher's wait): the watcher's loop raises as that one did, in its own module. And a
task whose own thread dies, which is the user's business, not the node's."""
import threading
import types

from runner.tasks import task
from runner.tasks.worker import limits


@task("hostile.user_thread")
def user_thread(ctx, payload):
    def dies():
        raise RuntimeError("the user's own thread dies")
    thread = threading.Thread(target=dies, name="users-thread")
    thread.start()
    thread.join()


def _run(self):
    raise OverflowError("timestamp out of range for platform time_t")


limits.LimitWatch._run = types.FunctionType(_run.__code__, vars(limits), "_run")
'''


def test_a_node_whose_own_thread_dies_stops_loudly(cluster: Cluster, tmp_path: Any) -> None:
    """The time-limit watcher dying left each node running tasks with no time limit (a 3 s
    handler with a 1 s limit SUCCEEDED). A node whose own thread dies now logs CRITICAL,
    leaves the cluster and exits 70; a thread of a user's handler dying does not stop it."""
    cluster.load_module(tmp_path / "site", "breaks_limits", BREAKS_LIMITS)
    member = cluster.start_node()
    node = cluster.nodes[member]
    with cluster.client() as client:
        users = client.submit("hostile.user_thread", {})
        assert client.wait(users.id, 30).succeeded
        assert "the user's own thread dies" in node.log_path.read_text()
        assert node.is_alive()
        client.submit("diag.sleep", {"seconds": 3}, timeout=1)
        assert wait_until(lambda: not node.is_alive(), 60)
    assert node.returncode() == 70
    log = node.log_path.read_text()
    assert "CRITICAL" in log and "thread limits-" in log and "died" in log


def test_a_payload_that_is_not_an_object_is_called_a_json_object_everywhere(
        cluster: Cluster) -> None:
    """Item 9: "Input should be a valid dictionary" was pydantic's word; the docs say "a JSON
    object", and so does every refusal now: the client's own check, the node's answer over
    AMQP, and a command's payload."""
    cluster.start_node()
    with cluster.client() as client:
        with pytest.raises(RequestRefused) as local:
            client.submit("diag.sleep", [1])  # type: ignore[arg-type]
        assert "Input should be a JSON object" in local.value.detail
        with pytest.raises(RequestRefused) as remote:
            client.request("task.submit", {"type": "diag.sleep", "payload": [1]})
        assert "Input should be a JSON object" in remote.value.detail
        with pytest.raises(RequestRefused) as typed:  # a task type's payload model
            client.request("task.submit", {"type": "diag.sleep", "payload": {"seconds": 0},
                                           "resources": {"a": 1}})
        assert "valid list" in typed.value.detail  # other types keep pydantic's words
    result = cluster.cli("command", "send", "SYNCHRONIZE_MODEL", "--payload", "[1]")
    assert result.exit_code == 2 and "a JSON object" in result.output
