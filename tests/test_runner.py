"""The runner end to end: node processes, the task loop, master duties, CLI reports.

Real ZooKeeper, RabbitMQ and an embedded graph file shared by the nodes; nodes run as
subprocesses (``latchwork node start``) so they can be killed -9 or stopped with SIGTERM.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from coord.testing import NodeProcess, ZooKeeperCluster, wait_until
from coord.testing.plugin import TEST_TICK_MS, ZkNamespace
from messaging.testing import broker_outage
from messaging.testing.plugin import AmqpNamespace
from runner.errors import ERROR_CODES, RequestFailed, RequestRefused
from runner.store import AttemptStatus, Ontology, OntologyClass, Task, TaskStatus
from runner.testing.cluster import CLUSTER, SESSION, Cluster


def log_of(node: NodeProcess) -> str:
    return node.log_path.read_text(errors="replace")


def locks_held(zk_client: KazooClient) -> list[str]:
    path = f"/latchwork/{CLUSTER}/locks/tasks"
    return zk_client.get_children(path) if zk_client.exists(path) else []


#: every end-to-end test here on the ``cluster`` fixture runs twice: nodes sharing the embedded
#: graph file, and nodes sharing a Gremlin Server (as on several machines)
BOTH_GRAPHS = pytest.mark.parametrize("cluster", ["gremlite", "server"], indirect=True)

@BOTH_GRAPHS
def test_tasks_run_once_retry_conflicts_stop_on_errors_and_report(cluster: Cluster) -> None:
    cluster.start_node()
    cluster.start_node()
    first = cluster.cli("task", "submit", "diag.sleep", "--payload", '{"seconds": 0.2}',
                        "--unique-key", "once").output.strip()
    again = cluster.submit("diag.sleep", {"seconds": 0.2}, unique_key="once")
    assert again == first
    conflict = cluster.submit("diag.conflict", {"conflicts": 2})
    failing = cluster.submit("diag.fail", {"message": "the ontology file is gone"})
    assert [a.status for a in cluster.store.attempts.for_task(
        cluster.wait_finished(first).id)] == [AttemptStatus.SUCCEEDED]
    cluster.wait_finished(conflict)
    assert [a.status for a in cluster.store.attempts.for_task(conflict)] == [
        AttemptStatus.FAILED, AttemptStatus.FAILED, AttemptStatus.SUCCEEDED]
    assert all("commit conflict" in (a.error or "")
               for a in cluster.store.attempts.for_task(conflict)[:2])
    assert wait_until(lambda: not cluster.task(failing).active, 30, 0.1)
    stopped = cluster.task(failing)
    assert not stopped.finished and stopped.status is TaskStatus.WAITING
    (attempt,) = cluster.store.attempts.for_task(failing)
    assert attempt.status is AttemptStatus.FAILED
    assert "RuntimeError: the ontology file is gone" in (attempt.stack_trace or "")

    report = cluster.cli("task", "show", failing)
    assert report.exit_code == 0
    for expected in ("diag.fail", "failed", "RuntimeError: the ontology file is gone",
                     "Traceback", attempt.executor):
        assert expected in report.output, expected
    as_json = json.loads(cluster.cli("task", "show", conflict, "--json").output)
    assert [a["status"] for a in as_json["attempts"]] == ["FAILED", "FAILED", "SUCCEEDED"]
    assert [a["seq"] for a in as_json["attempts"]] == [1, 2, 3]
    assert as_json["task"]["attempts"] == 3
    listing = cluster.cli("task", "list")
    assert all(t in listing.output for t in (first, conflict, failing))
    assert cluster.cli("task", "list", "--unfinished", "--json").output.strip() == "[]"

    assert cluster.cli("task", "reactivate", failing).exit_code == 0
    assert wait_until(lambda: len(cluster.store.attempts.for_task(failing)) == 2, 30, 0.1)

    status = cluster.cli("cluster", "status")
    assert status.exit_code == 0 and "2 member(s)" in status.output
    assert all(member in status.output for member in cluster.nodes)


@BOTH_GRAPHS
def test_cli_rejects_bad_input_with_usage_errors(cluster: Cluster) -> None:
    cluster.start_node()
    bad_json = cluster.cli("task", "submit", "diag.sleep", "--payload", "{not json")
    assert bad_json.exit_code == 2 and "not valid JSON" in bad_json.output
    not_object = cluster.cli("task", "submit", "diag.sleep", "--payload", "[1]")
    assert not_object.exit_code == 2 and "--payload" in not_object.output
    assert "Input should be a JSON object" in not_object.output
    unknown = cluster.cli("task", "submit", "no.such.type")
    assert unknown.exit_code == 2 and "unknown task type 'no.such.type'" in unknown.output
    invalid = cluster.cli("task", "submit", "diag.sleep", "--payload", '{"seconds": -1}')
    assert invalid.exit_code == 2 and "seconds" in invalid.output
    missing = cluster.cli("task", "show", "no-such-task")
    assert missing.exit_code == 1 and "no task no-such-task" in missing.output
    no_source = cluster.cli("ontology", "sync")
    assert no_source.exit_code == 1 and "no ontology source is configured" in no_source.output
    assert cluster.store.tasks.all() == []
    (node,) = cluster.nodes.values()
    assert "InvalidPayload" in log_of(node)  # logged, as one line
    assert "Traceback" not in log_of(node)


@BOTH_GRAPHS
def test_error_replies_carry_stable_codes(cluster: Cluster) -> None:
    """A client decides on ``error.code``, never on a class name (runner.errors)."""
    import runner.node.node  # noqa: F401  (every error class, and so every code, is declared)
    cluster.start_node()
    cases = [
        ("task.get", {"id": "no-such-task"}, "task_not_found", RequestFailed),
        ("task.submit", {"type": "no.such.type"}, "task_type_unknown", RequestRefused),
        ("task.submit", {"type": "diag.sleep", "payload": {"seconds": -1}}, "payload_invalid",
         RequestRefused),
        ("task.get", {"id": ""}, "invalid", RequestRefused),  # refused by the request model
        ("task.nothing", {}, "unknown-command", RequestRefused),
    ]
    for command, payload, code, kind in cases:
        with pytest.raises(RequestFailed) as caught:
            cluster.request(command, payload)
        assert (caught.value.code, type(caught.value)) == (code, kind), command
        assert code == "invalid" or "-" in code or code in ERROR_CODES


@BOTH_GRAPHS
def test_killed_node_mid_task_is_freed_by_the_master_and_finished_elsewhere(
        cluster: Cluster, zk_client: KazooClient) -> None:
    for _ in range(3):
        cluster.start_node()
    # long enough to be still running when the kill comes on a loaded box (3 s once was not)
    task_id = cluster.submit("diag.sleep", {"seconds": 6})
    victim = cluster.wait_running_on(task_id)
    cluster.nodes[victim].kill()
    done = cluster.wait_finished(task_id, timeout=60)
    attempts = cluster.store.attempts.for_task(task_id)
    assert [a.status for a in attempts] == [AttemptStatus.CANCELLED_BY_SYSTEM,
                                            AttemptStatus.SUCCEEDED]
    assert attempts[0].executor == victim and attempts[1].executor != victim
    # closed by the new master's reaper, or, when another node's scan takes the task first
    # (the victim was the master too: the next one reaps only once elected), by that claim
    assert f"executor {victim} left the cluster" in (attempts[0].error or "") or \
        f"its executor {victim} had lost the task" in (attempts[0].error or "")
    assert attempts[1].fence > attempts[0].fence  # the new owner's token is newer
    assert done.finished and done.owner == attempts[1].executor
    assert wait_until(lambda: locks_held(zk_client) == [], 10)
    report = cluster.cli("task", "show", task_id)
    assert "cancelled by system" in report.output


@BOTH_GRAPHS
def test_sigterm_cancels_running_tasks_and_leaves_no_running_attempt_or_lock(
        cluster: Cluster, zk_client: KazooClient) -> None:
    member = cluster.start_node()
    tasks = [cluster.submit("diag.sleep", {"seconds": 60}) for _ in range(2)]
    for task_id in tasks:
        assert cluster.wait_running_on(task_id) == member
    assert cluster.nodes[member].terminate(timeout=30) == 0
    for task_id in tasks:
        (attempt,) = cluster.store.attempts.for_task(task_id)
        assert attempt.status is AttemptStatus.CANCELLED_BY_SYSTEM
        assert attempt.ended_at is not None and "node shutting down" in (attempt.error or "")
        task = cluster.task(task_id)
        assert task.active and not task.finished and task.status is TaskStatus.WAITING
    assert cluster.store.attempts.running() == []
    assert locks_held(zk_client) == []


def test_zookeeper_stopped_cancels_the_task_and_writes_the_attempt_before_the_lock_goes(
        amqp_vhost: AmqpNamespace, tmp_path: Path,
        spawn_node: Callable[..., NodeProcess]) -> None:
    zk = ZooKeeperCluster(tmp_path / "zk", 1, TEST_TICK_MS)
    zk.start()
    try:
        c = Cluster(zk.hosts, amqp_vhost, tmp_path, spawn_node)
        member = c.start_node()
        task_id = c.submit("diag.sleep", {"seconds": 120})
        assert c.wait_running_on(task_id) == member
        zk.servers[0].stop()
        # the node's own timer declares the session lost; the attempt is written at once,
        # while ZooKeeper is still down, so before the server can expire the lock node
        assert wait_until(lambda: c.store.attempts.running() == [], 4 * SESSION, 0.05)
        (attempt,) = c.store.attempts.for_task(task_id)
        assert attempt.status is AttemptStatus.CANCELLED_BY_SYSTEM
        assert "session was lost" in (attempt.error or "")
        zk.servers[0].start()
        zk.servers[0].wait_ready()
        # back online with a new session, the node takes the task up again with a newer token
        assert wait_until(lambda: len(c.store.attempts.for_task(task_id)) == 2, 30, 0.1)
        first, second = c.store.attempts.for_task(task_id)
        assert second.status is AttemptStatus.RUNNING and second.fence > first.fence
        c.store.close()
    finally:
        zk.stop()


BRICK = Path(__import__("importlib.util").util.find_spec("brickschema")
             .submodule_search_locations[0]) / "ontologies" / "1.2"


def test_ontology_sync_on_master_election_loads_once_and_reports_bad_files(
        zk_namespace: ZkNamespace, amqp_vhost: AmqpNamespace, tmp_path: Path,
        spawn_node: Callable[..., NodeProcess]) -> None:
    source = tmp_path / "ontologies"
    source.mkdir()
    c = Cluster(zk_namespace.hosts, amqp_vhost, tmp_path, spawn_node,
                ontology_source=str(source))
    try:
        first = c.start_node()
        second = c.start_node()

        def loads() -> list[Task]:
            return c.store.tasks.all("ontology.load")

        # the first master synchronised on election: nothing in the source yet
        assert wait_until(lambda: "0 new load tasks" in log_of(c.nodes[first]), 30)
        for name in ("Brick-BOT-alignment.ttl", "Brick-REC-alignment.ttl"):
            shutil.copy(BRICK / "alignments" / name, source / name)
        (source / "broken.ttl").write_text("@prefix ex: <http://example.org/> .\nex:a ex:b \n")
        assert c.cli("ontology", "sync").exit_code == 0
        assert wait_until(lambda: len(loads()) == 3 and all(
            t.finished or not t.active for t in loads()), 60, 0.2), loads()
        by_ref = {t.payload["ref"]: t for t in loads()}
        broken = by_ref[str(source / "broken.ttl")]
        assert not broken.active and not broken.finished
        (failed,) = c.store.attempts.for_task(broken.id)
        assert "broken.ttl: cannot parse" in (failed.error or "")
        loaded = {o.iri for o in c.store.ontologies.all()}
        assert loaded == {"https://w3id.org/bot/BRICKAlignment",
                          "https://w3id.org/rec/alignments/BrickSchema"}
        listing = c.cli("ontology", "list")
        assert listing.exit_code == 0 and all(iri in listing.output for iri in loaded)
        shown = json.loads(c.cli("ontology", "show", "https://w3id.org/bot/BRICKAlignment",
                                 "--json").output)
        assert shown["iri"] == "https://w3id.org/bot/BRICKAlignment"
        assert len(shown["classes"]) > 2
        assert any(cls["parents"] for cls in shown["classes"])
        table = c.cli("ontology", "show", "https://w3id.org/bot/BRICKAlignment", "--limit", "2")
        assert table.exit_code == 0 and "more (--limit 0" in table.output
        missing = c.cli("ontology", "show", "https://example.org/none")
        assert missing.exit_code == 1 and "no ontology https://example.org/none" in missing.output
        # one workflow (issue 72): the broken load blocks the one broadcast with its error,
        # so no node reloaded its cache yet; a skip of it lets the broadcast go
        (broadcast,) = c.store.tasks.all("ontology.broadcast")
        assert broadcast.workflow is not None
        with c.client() as client:
            states = {m.type: (m.state, m.error) for m in client.workflow(
                broadcast.workflow).members}
            assert states["ontology.broadcast"][0] == "blocked"
            assert "broken.ttl: cannot parse" in (states["ontology.broadcast"][1] or "")
            assert not any("ontology cache reloaded" in log_of(n) for n in c.nodes.values())
            client.skip(broken.id)
            assert client.result(broadcast.id, wait=30) == {"ontologies": sorted(loaded)}
        assert len(c.store.attempts.for_task(broadcast.id)) == 1  # one broadcast for the sync
        for node in c.nodes.values():  # UPDATE_CACHE reached every node
            assert wait_until(lambda n=node: "ontology cache reloaded" in log_of(n), 20)
        # failover: the new master synchronises again and finds nothing new
        assert c.nodes[first].terminate(timeout=30) == 0
        assert wait_until(lambda: "0 new load tasks" in log_of(c.nodes[second]), 30)
        assert len(loads()) == 3
        # a new file is noticed by the master's watcher and loaded without anyone asking
        shutil.copy(BRICK / "Brick.ttl", source / "Brick.ttl")
        assert wait_until(lambda: "https://brickschema.org/schema/1.2/Brick" in {
            o.iri for o in c.store.ontologies.all()}, 60, 0.2)
        assert len(loads()) == 4
        assert c.store.ontologies.ancestors("https://brickschema.org/schema/Brick#AHU")
        assert len(c.store.tasks.all("ontology.broadcast")) == 2  # a workflow per sync
    finally:
        c.store.close()


@BOTH_GRAPHS
def test_a_frozen_owner_wakes_up_and_cannot_overwrite_the_new_owners_result(
        cluster: Cluster, zk_client: KazooClient) -> None:
    for _ in range(2):
        cluster.start_node()
    task_id = cluster.submit("diag.sleep", {"seconds": 6})  # still running when paused
    victim = cluster.wait_running_on(task_id)
    cluster.pause(victim)  # a long GC pause: its session expires, its lock is freed
    done = cluster.wait_finished(task_id, timeout=60)
    cluster.nodes[victim].resume()
    log = cluster.nodes[victim].log_path
    assert wait_until(lambda: "closed by the master meanwhile" in log.read_text(), 30)
    first, second = cluster.store.attempts.for_task(task_id)
    assert (first.executor, first.status) == (victim, AttemptStatus.CANCELLED_BY_SYSTEM)
    assert second.status is AttemptStatus.SUCCEEDED and second.executor != victim
    # the woken owner, told its attempt was closed, wrote nothing more on the task
    assert "leaving the task to them" in log.read_text()
    assert cluster.task(task_id) == done
    assert wait_until(lambda: locks_held(zk_client) == [], 10)


@BOTH_GRAPHS
def test_an_owner_frozen_past_its_session_does_not_record_the_success_of_its_handler(
        cluster: Cluster) -> None:
    """The chaos suite's ``resource_holders_overlapping`` once: a node frozen (SIGSTOP) while
    its handler ran, the handler's sleep over while frozen, the session expired meanwhile (and
    with it the task lock and the resource hold another node could then take). On waking, the
    worker thread can reach the store before any thread has learned the session is gone: it
    recorded SUCCEEDED. Now the lock is confirmed with ZooKeeper before a success is written:
    the attempt ends CANCELLED_BY_SYSTEM (whichever thread learns it first) and the task runs
    again."""
    member = cluster.start_node()
    task = cluster.store.tasks.create("diag.sleep", {"seconds": 0.8},
                                      resources=["ontology:frozen"])
    assert cluster.wait_running_on(task.id) == member
    cluster.pause(member)
    time.sleep(SESSION * 2.5)  # the handler's sleep ends and the session expires, both frozen
    cluster.nodes[member].resume()
    cluster.wait_finished(task.id, timeout=60)
    first, *rest = cluster.store.attempts.for_task(task.id)
    assert first.status is AttemptStatus.CANCELLED_BY_SYSTEM, first
    assert [a.status for a in rest][-1:] == [AttemptStatus.SUCCEEDED]


def test_an_owner_frozen_past_its_session_cannot_finish_the_task_the_master_took_back(
        zk_namespace: ZkNamespace, amqp_vhost: AmqpNamespace, tmp_path: Path,
        spawn_node: Callable[..., NodeProcess], zk_client: KazooClient) -> None:
    """The first-round repro: one worker per node, one node kept busy, so nobody takes T up
    while its owner is frozen. The master closed T's attempt and put T back; the owner woke,
    its handler ended, and it finished T with its old token: ``finished`` with no SUCCEEDED
    attempt, and T's lock parent left behind. Now the close moved T's fence: the woken owner
    writes nothing, and T is run again (by whichever node is free) to a SUCCEEDED attempt."""
    c = Cluster(zk_namespace.hosts, amqp_vhost, tmp_path, spawn_node, workers="1")
    try:
        for _ in range(2):
            c.start_node()
        busy = c.submit("diag.sleep", {"seconds": 120})
        busy_owner = c.wait_running_on(busy)
        task_id = c.submit("diag.sleep", {"seconds": 8})  # still running when paused
        owner = c.wait_running_on(task_id)
        assert owner != busy_owner  # the busy node has no free worker
        c.pause(owner)
        assert wait_until(lambda: c.store.attempts.for_task(task_id)[0].status
                          is AttemptStatus.CANCELLED_BY_SYSTEM, 30)
        c.nodes[owner].resume()
        assert wait_until(lambda: "leaving the task to them" in log_of(c.nodes[owner]), 30)
        done = c.wait_finished(task_id, timeout=60)
        attempts = c.store.attempts.for_task(task_id)
        assert [a.status for a in attempts] == [AttemptStatus.CANCELLED_BY_SYSTEM,
                                                AttemptStatus.SUCCEEDED]
        assert "left the cluster" in (attempts[0].error or "")
        assert done.fence == attempts[1].fence > attempts[0].fence
        # only the busy task's lock is left: T's lock parent went (released, or pruned by the
        # master once its holder's session expired)
        assert wait_until(lambda: locks_held(zk_client) == [busy], 15), locks_held(zk_client)
    finally:
        c.store.close()


@BOTH_GRAPHS
def test_deactivate_and_cancel_stop_a_running_attempt_cluster_wide(
        cluster: Cluster, zk_client: KazooClient) -> None:
    """`task deactivate` used to leave a running `diag.sleep 20` to run to SUCCEEDED. Now
    deactivate and cancel close the running attempt (CANCELLED, by the operator), fence its
    owner off and free its lock, whichever node answers the request; the owner's handler
    stops at once (a message in its mailbox), and the task stays stopped until it is
    reactivated."""
    for _ in range(2):
        cluster.start_node()
    by_verb = {}
    for verb, extra in (("deactivate", ()), ("cancel", ("--reason", "wrong input file"))):
        task_id = cluster.submit("diag.sleep", {"seconds": 20})
        owner = cluster.wait_running_on(task_id)
        log = cluster.nodes[owner].log_path
        heard = log.read_text(errors="replace").count("its handler is stopped")
        asked = time.monotonic()
        result = cluster.cli("task", verb, task_id, *extra)
        assert result.exit_code == 0, result.output
        (attempt,) = cluster.store.attempts.for_task(task_id)
        assert attempt.status is AttemptStatus.CANCELLED, attempt
        assert "cancelled by operator" in (attempt.error or "") and attempt.id in result.output
        assert not cluster.task(task_id).active
        # the owner hears it through its mailbox, within a second, and writes nothing more
        assert wait_until(lambda log=log, heard=heard: log.read_text(
            errors="replace").count("its handler is stopped") > heard, 5)
        assert time.monotonic() - asked < 5
        assert wait_until(lambda t=task_id: t not in locks_held(zk_client), 5)
        by_verb[verb] = (task_id, attempt)
    assert "wrong input file" in (by_verb["cancel"][1].error or "")
    time.sleep(1.5)  # scans happen every second: a stopped task is not taken up again
    for task_id, _ in by_verb.values():
        assert len(cluster.store.attempts.for_task(task_id)) == 1
        assert not cluster.task(task_id).finished
    again = cluster.cli("task", "reactivate", by_verb["cancel"][0])
    assert again.exit_code == 0
    assert wait_until(lambda: len(cluster.store.attempts.for_task(by_verb["cancel"][0])) == 2,
                      15)
    idle = cluster.cli("task", "cancel", by_verb["deactivate"][0])  # nothing running: fine
    assert idle.exit_code == 0 and "nothing changed" in idle.output
    report = cluster.cli("task", "show", by_verb["cancel"][0])
    assert "cancelled by operator" in report.output


@BOTH_GRAPHS
def test_a_broker_restart_costs_one_warning_per_connection_and_reloads_the_cache(
        cluster: Cluster, amqp_vhost: AmqpNamespace) -> None:
    """After a RabbitMQ restart each node used to log ~200 pika ERROR lines with tracebacks,
    and a MODEL UPDATE_CACHE broadcast sent while it was disconnected was simply missed. Now
    each of its connections logs one WARNING, no ERROR and no traceback, and a node reloads
    its ontology cache (and scans) when its MODEL connection comes back."""
    member = cluster.start_node()
    node = cluster.nodes[member]
    assert wait_until(lambda: "ontology cache reloaded" not in log_of(node), 1)
    with broker_outage(amqp_vhost.server):
        assert wait_until(lambda: "lost its connection" in log_of(node), 30)
        # an ontology loaded while the node cannot hear the broadcast that would follow
        cluster.store.ontologies.load(Ontology("https://example.org/missed", "1", "sum", (
            OntologyClass("https://example.org/missed#B", "B"),
            OntologyClass("https://example.org/missed#A", "A",
                          ("https://example.org/missed#B",)))))
    assert wait_until(lambda: "ontology cache reloaded (2 classes) after the MODEL connection"
                      in log_of(node), 60), log_of(node)[-3000:]
    task_id = cluster.submit("diag.sleep", {"seconds": 0.1})  # the node works as before
    cluster.wait_finished(task_id)
    assert node.terminate(timeout=30) == 0
    text = log_of(node)
    assert " ERROR " not in text and "Traceback" not in text, text[-5000:]
    warnings = [line for line in text.splitlines() if " WARNING " in line]
    assert len(warnings) <= 12, "\n".join(warnings)
