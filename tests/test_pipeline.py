"""The aspects pipeline end to end: node subprocesses with Spark local[2], real ZooKeeper,
RabbitMQ and a shared embedded graph; plus in-process checks of the Spark job, cancellation,
spark-submit, eligibility under cache reloads and Parquet import/export."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from coord import Session, VersionedRegister
from coord.batches import BatchCoordinator, BatchState, SeriesState
from coord.testing import NodeProcess, wait_until
from coord.testing.plugin import ZkNamespace
from messaging.testing.plugin import AmqpNamespace
from runner.config import Settings
from runner.ontology import OntologyCache
from runner.pipeline.aspects import COMPUTATIONS, AspectDefinition, AspectRegistry, Kind, compute
from runner.pipeline.bundle import build
from runner.pipeline.handlers import eligible_classes, series_id
from runner.pipeline.job import BatchWorker
from runner.pipeline.snapshot import write_snapshot
from runner.pipeline.spark import TEST_CONF
from runner.pipeline.storage import HadoopFS, SeriesPaths
from runner.store import Avatar, Ontology, OntologyClass, Store, open_store
from runner.tasks import CancelToken, TaskCancelled
from runner.testing.cluster import CLUSTER, Cluster
from runner.testing.sparkcluster import SparkStandalone

EX = "http://example.org/plant#"
ONTOLOGY = f"""@prefix owl: <http://www.w3.org/2002/07/owl#> .
@prefix rdfs: <http://www.w3.org/2000/01/rdf-schema#> .
@prefix ex: <{EX}> .
<http://example.org/plant> a owl:Ontology .
ex:Asset a owl:Class .
ex:Equipment a owl:Class ; rdfs:subClassOf ex:Asset .
ex:Pump a owl:Class ; rdfs:subClassOf ex:Equipment .
ex:Room a owl:Class ; rdfs:subClassOf ex:Asset .
"""
ASPECTS = json.dumps({"geo": {"classes": [f"{EX}Equipment"]}})
CLASSES = [f"{EX}Pump", f"{EX}Equipment", f"{EX}Room"]


def avatars_file(path: Path, n: int) -> Path:
    """``n`` avatars cycling through Pump, Equipment, Room; every 10th has no coordinates."""
    ids = [f"av-{i:05d}" for i in range(n)]
    props = [json.dumps({} if i % 10 == 9 else {"lat": 40 + i / 1000, "lon": -3 - i / 1000})
             for i in range(n)]
    pq.write_table(pa.table({"id": ids, "class_iri": [CLASSES[i % 3] for i in range(n)],
                             "properties": props}), path)
    return path


def expected_geo(n: int) -> dict[str, Any]:
    return {f"av-{i:05d}": {"type": "Point", "coordinates": [-3 - i / 1000, 40 + i / 1000]}
            for i in range(n) if i % 3 != 2 and i % 10 != 9}


def checksum(values: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(sorted(values.items()), sort_keys=True).encode()
                          ).hexdigest()


@pytest.fixture
def plant(zk_namespace: ZkNamespace, amqp_vhost: AmqpNamespace, tmp_path: Path,
          spawn_node: Callable[..., NodeProcess]) -> Iterator[Cluster]:
    onto = tmp_path / "ontologies"
    onto.mkdir()
    (onto / "plant.ttl").write_text(ONTOLOGY)
    c = Cluster(zk_namespace.hosts, amqp_vhost, tmp_path, spawn_node,
                ontology_source=str(onto), aspects=ASPECTS, data_dir=str(tmp_path / "data"),
                spark_master="local[2]", spark_conf=json.dumps(TEST_CONF),
                spark_driver_memory="512m", batch_timeout="3", batch_workers="1",
                workers="1")  # one task per node: the creator and its helper on two nodes
    yield c
    c.store.close()


def start_plant(c: Cluster, nodes: int, avatars: int, tmp_path: Path) -> list[str]:
    members = [c.start_node()]
    # the master loads the ontology, then reloads its cache; later nodes load it at start
    assert wait_until(lambda: "ontology cache reloaded" in c.nodes[members[0]].log_path
                      .read_text(), 60, 0.2)
    members += [c.start_node() for _ in range(nodes - 1)]
    result = c.cli("avatars", "import", str(avatars_file(tmp_path / "in.parquet", avatars)))
    assert result.exit_code == 0, result.output
    assert f"imported {avatars} avatars" in result.output
    return members


def aspect(c: Cluster, name: str = "geo") -> dict[str, Any]:
    result = c.cli("aspect", "show", name, "--json")
    assert result.exit_code == 0, result.output
    value: dict[str, Any] = json.loads(result.output)
    return value


def cli_subprocess(c: Cluster, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "runner.cli", *args], env=c.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def committed_ids(c: Cluster, sid: str) -> list[str]:
    """Every avatar id in the series' committed batch outputs (duplicates kept)."""
    with Session(c.env["LATCHWORK_ZK_HOSTS"], CLUSTER) as s:
        meta = BatchCoordinator(s, sid).status().meta
    batches = Path(meta["root"].removeprefix("file://")) / "batches"
    ids: list[str] = []
    for d in sorted(batches.iterdir()):
        if d.name.startswith("_"):
            continue
        ids.extend(pq.read_table(d, columns=["id"]).column("id").to_pylist())
    return ids


def assert_exactly_once(c: Cluster, sid: str, root: str, n: int, spark: Any) -> None:
    """No duplicate or missing avatar in the committed batch outputs or the graph, and the
    graph equal, by checksum, to one plain local Spark job over the same snapshot."""
    ids = committed_ids(c, sid)
    assert len(ids) == len(set(ids)) == len(expected_geo(n))
    got = c.store.avatars.with_aspect("geo")
    clean_rows = compute(spark.read.parquet(root + "/snapshot"),
                         AspectRegistry(json.loads(ASPECTS)).get("geo")).collect()
    clean = {r["id"]: json.loads(r["value"]) for r in clean_rows}
    assert checksum(got) == checksum(clean) == checksum(expected_geo(n))


def test_create_twice_from_two_nodes_reports_progress_then_delete(
        plant: Cluster, tmp_path: Path) -> None:
    n = 240
    gate = tmp_path / "gate"  # batches wait at their commit until it opens (see below)
    gate.write_text("closed")
    plant.env["LATCHWORK_TEST_BATCH_GATE"] = str(gate)
    start_plant(plant, 2, n, tmp_path)
    # the same aspect requested at once from two clients (answered by any node): one task
    procs = [cli_subprocess(plant, "aspect", "create", "geo", "--batch-rows", "30", "--json")
             for _ in range(2)]
    answers = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        answers.append(json.loads(out))
    assert answers[0]["generation"] == answers[1]["generation"] == 1
    task_ids = {a["task_id"] for a in answers} - {None}
    creates = plant.store.tasks.all("aspect.create")
    assert len(creates) == 1 and task_ids <= {creates[0].id}
    task_id = creates[0].id

    # state and progress while it runs, through the API and in `task show`
    def running() -> dict[str, Any] | None:
        now = aspect(plant)
        p = now["progress"] or {}
        return now if now["state"] == "CREATING" and p.get("batches_total") else None

    assert wait_until(lambda: running() is not None, 90, 0.2), aspect(plant)
    now = running() or aspect(plant)
    assert now["task"]["id"] == task_id and now["progress"]["state"] == "OPEN"
    assert now["progress"]["rows_total"] == 160  # the Pump + Equipment avatars
    assert now["progress"]["batches_total"] == 6
    shown = plant.cli("task", "show", task_id)
    assert shown.exit_code == 0 and "/6 batches" in shown.output and "rows/s" in shown.output
    gate.unlink()  # seen while it runs (held by construction, not by a pause): it may end now

    # the wait lasts as long as the job: a fresh-clone run under load took 38 s to start Spark
    # and 26 s for the first batch (72 s from the task's start to READY)
    done = plant.cli("aspect", "create", "geo", "--wait", "--timeout", "20", timeout=240)
    assert done.exit_code == 0, done.output
    assert "READY" in done.output and "6/6 batches" in done.output
    final = aspect(plant)
    assert final["state"] == "READY" and final["progress"]["batches_done"] == 6
    got = plant.store.avatars.with_aspect("geo")
    assert got == expected_geo(n)
    (create,) = plant.store.tasks.all("aspect.create")
    attempts = plant.store.attempts.for_task(create.id)
    assert create.finished and [a.status.value for a in attempts] == ["SUCCEEDED"]  # run once
    helpers = plant.store.tasks.all("aspect.batches")
    assert len(helpers) == 1 and wait_until(lambda: plant.task(helpers[0].id).finished, 30)
    # the batch loops reported through ctx.progress: rows done of the series' rows
    reports = [a.progress for t in (create, *helpers)
               for a in plant.store.attempts.for_task(t.id) if a.progress is not None]
    assert reports and all(r.total == 160 for r in reports)
    assert max(r.done for r in reports) == 160
    with Session(plant.env["LATCHWORK_ZK_HOSTS"], CLUSTER) as s:
        history = BatchCoordinator(s, series_id("geo", 1)).history()
    assert all(b.state is BatchState.FINISHED for b in history)
    # which node worked which batch is a race (under load one node may take all six): the
    # invariant is that every batch was worked by a node of the plant and finished once
    assert {b.owner for b in history} <= set(plant.nodes), history
    assert sorted(b.no for b in history) == list(range(len(history))), history
    assert len(history) == 6, history
    ids = committed_ids(plant, series_id("geo", 1))
    assert len(ids) == len(set(ids)) == len(expected_geo(n))

    again = plant.cli("aspect", "create", "geo", "--json")  # READY: nothing new
    assert json.loads(again.output)["generation"] == 1
    assert len(plant.store.tasks.all("aspect.create")) == 1

    deleted = plant.cli("aspect", "delete", "geo", "--wait", "--timeout", "20", timeout=240)
    assert deleted.exit_code == 0, deleted.output
    assert aspect(plant)["state"] == "DELETED"
    assert plant.store.avatars.with_aspect("geo") == {}

    unknown = plant.cli("aspect", "create", "nosuch")
    assert unknown.exit_code == 2 and "unknown aspect 'nosuch'" in unknown.output
    simple = plant.cli("aspect", "create", "timeseries", "--json")
    assert json.loads(simple.output)["state"] == "READY"  # simple: no task
    assert json.loads(simple.output)["task"] is None


def child_pids(pid: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return children


# PySpark's collect() leaves its local result socket to the garbage collector
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_node_killed_mid_batch_its_batch_is_retried_and_the_result_is_exact(
        plant: Cluster, tmp_path: Path, spark: Any) -> None:
    """A node killed -9 while it holds a batch: the batch times out and another node does it;
    the result is exact. The kill lands inside the batch by construction: the nodes run with
    a gate (``LATCHWORK_TEST_BATCH_GATE``) at which a computed batch waits before its commit,
    after writing a marker naming its node; the first node to write one is killed there, then
    the gate opens for the others. (It guessed before: a 1.5 s pause before each commit, and a
    busy box finished the batch before the kill.)"""
    n = 300
    gate = tmp_path / "gate"
    gate.write_text("closed")
    plant.env["LATCHWORK_TEST_BATCH_GATE"] = str(gate)
    start_plant(plant, 2, n, tmp_path)
    result = plant.cli("aspect", "create", "geo", "--batch-rows", "20")
    assert result.exit_code == 0, result.output
    sid = series_id("geo", 1)
    zk = plant.env["LATCHWORK_ZK_HOSTS"]
    with Session(zk, CLUSTER) as s:
        coordinator = BatchCoordinator(s, sid)

        def held() -> list[Path]:
            return sorted(tmp_path.glob("gate.*"), key=lambda p: p.stat().st_mtime)

        assert wait_until(lambda: bool(held()), 180, 0.1)
        marker = held()[0]
        member, held_no = marker.read_text(), int(marker.name.rsplit(".", 1)[1])
        node = plant.nodes[member]
        assert int(marker.name.split(".")[1]) == node.pid
        jvms = child_pids(node.pid)
        assert jvms, "the node has no Spark driver JVM child"
        lost = [b.no for b in coordinator.status().batches
                if b.state is BatchState.IN_PROGRESS and b.owner == member]
        assert held_no in lost  # held at its commit: in progress, by construction
        node.kill()
        gate.unlink()  # the others' batches go on
        assert wait_until(lambda: not any(Path(f"/proc/{p}").exists() for p in jvms), 20, 0.2), \
            "the killed node's Spark JVM outlived it"

        assert wait_until(lambda: aspect(plant)["state"] == "READY", 180, 0.5), aspect(plant)
        status = coordinator.status()
    assert status.state is SeriesState.COMPLETED
    retried = [b for b in status.batches if b.no in lost]
    assert retried, lost
    assert all(b.attempt >= 2 and any("timed out" in e for e in b.errors) for b in retried), \
        retried
    assert all(b.owner != member for b in retried)
    # each task that worked batches recorded its last finished one as its checkpoint
    creator = aspect(plant)["task"]["id"]
    helpers = plant.store.tasks.all(type="aspect.batches")
    marks = [plant.store.checkpoints.read(t) for t in [creator, *(h.id for h in helpers)]]
    finished = {b.no for b in status.finished}
    assert any(m is not None for m in marks), marks
    for mark in filter(None, marks):
        assert mark.state["series"] == sid and mark.state["batch"] in finished, mark

    assert_exactly_once(plant, sid, status.meta["root"], n, spark)


# PySpark's collect() leaves its local result socket to the garbage collector
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
# its own waits (drivers busy up to 180 s, the kills, READY up to 240 s) exceed the suite's
# 180 s: alone it ran 168 s, and beside the suite's other worker it was cut at 180 once
@pytest.mark.timeout(420)
def test_on_a_standalone_cluster_kill_9_of_a_worker_costs_only_its_batches(
        zk_namespace: ZkNamespace, amqp_vhost: AmqpNamespace, tmp_path: Path,
        spawn_node: Callable[..., NodeProcess], spark_standalone: SparkStandalone,
        spark: Any) -> None:
    """Two latchwork nodes drive the pipeline on a real Spark standalone cluster (a Master and
    two Workers); a Worker and its executors are killed -9 while batches run. The graph ends
    equal to a local run of the same snapshot; no batch output is committed twice; only the
    batches in progress at the kill may have been retried (Spark's own task retry on the other
    Worker's executors, or the batch coordinator's)."""
    n = 600
    onto = tmp_path / "ontologies"
    onto.mkdir()
    (onto / "plant.ttl").write_text(ONTOLOGY)
    conf = {**TEST_CONF, "spark.cores.max": "2", "spark.executor.cores": "1",
            "spark.executor.memory": "512m"}
    c = Cluster(zk_namespace.hosts, amqp_vhost, tmp_path, spawn_node,
                ontology_source=str(onto), aspects=ASPECTS, data_dir=str(tmp_path / "data"),
                spark_master=spark_standalone.url, spark_conf=json.dumps(conf),
                spark_driver_memory="512m", spark_driver_host="127.0.0.1",
                spark_driver_bind_address="127.0.0.1", batch_timeout="10",
                batch_workers="1", workers="1")  # the creator and its helper: two drivers
    try:
        start_plant(c, 2, n, tmp_path)
        result = c.cli("aspect", "create", "geo", "--batch-rows", "20")
        assert result.exit_code == 0, result.output
        sid = series_id("geo", 1)
        with Session(c.env["LATCHWORK_ZK_HOSTS"], CLUSTER) as s:
            coordinator = BatchCoordinator(s, sid)

            def drivers_busy() -> bool:  # both nodes' apps have executors, a batch is running
                apps = spark_standalone.status().get("activeapps", [])
                return (len(apps) == 2 and all(a.get("cores", 0) >= 2 for a in apps)
                        and coordinator.exists() and bool(coordinator.status().finished)
                        and any(b.state is BatchState.IN_PROGRESS
                                for b in coordinator.status().batches))

            assert wait_until(drivers_busy, 180, 0.2), spark_standalone.status()
            # kill -9 the Worker whose executor runs a batch's task now (its executor's own
            # log says); a kill that came just after the task ended is tried again on a new
            # Worker, so the fault lands mid-task
            def busy_worker(timeout: float = 60.0) -> int:
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline:
                    for i in (0, 1):
                        if spark_standalone.running_tasks(i):
                            return i
                    time.sleep(0.02)
                raise AssertionError("no task seen running on an executor")

            landed, running = False, set()
            for _ in range(4):
                victim = busy_worker()
                running |= {b.no for b in coordinator.status().batches
                            if b.state is BatchState.IN_PROGRESS}
                spark_standalone.kill_worker(victim)
                assert wait_until(lambda: spark_standalone.alive_workers() == 1, 60, 0.2)
                if spark_standalone.running_tasks(victim):  # its last task never ended
                    landed = True
                    break
                spark_standalone.start_worker(victim)
                spark_standalone.wait_workers(2)
            assert landed, "every kill came between two tasks"
            assert wait_until(lambda: aspect(c)["state"] == "READY", 240, 0.5), aspect(c)
            status = coordinator.status()
        assert status.state is SeriesState.COMPLETED
        # the loss reached the drivers: their executors on the dead Worker were lost (Spark
        # reruns a task lost with its executor elsewhere without counting it as a failure)
        logs = "".join(node.log_path.read_text(errors="replace") for node in c.nodes.values())
        assert "Lost executor" in logs, logs[-3000:]
        # only what was running at the kill (or started just as it happened) was retried
        retried = {b.no for b in status.batches if b.attempt > 1}
        started_after = {b.no for b in status.batches if b.no > max(running) + 2}
        assert not (retried & started_after), (retried, running, status.batches)
        assert_exactly_once(c, sid, status.meta["root"], n, spark)
    finally:
        c.store.close()


def test_the_snapshot_is_exported_in_pages_and_resumed_after_kill_9(
        zk_namespace: ZkNamespace, tmp_path: Path, spawn_node: Callable[..., NodeProcess],
        spark: Any) -> None:
    """The export writes a page, records it in ZooKeeper, writes the next: killed -9 in the
    middle, a new export resumes at the first unrecorded page, leaves the recorded pages as
    they were, and the snapshot holds every eligible avatar once, at positions 0..n-1, which
    Spark reads and a batch's position range selects."""
    n = 2400
    graph = str(tmp_path / "g.db")
    with open_store(graph) as store:
        store.avatars.upsert([Avatar(f"av-{i:05d}", CLASSES[i % 3], {"lat": i, "lon": -i})
                              for i in range(n)])
    root = SeriesPaths.of(str(tmp_path / "data"), "snap-1").root
    argv = ["-m", "runner.testing.snapshotter", zk_namespace.hosts, "c1", graph, root,
            "snap-1", f"{EX}Pump", "100", "0.3"]
    first = spawn_node(argv, name="exporter")
    first.wait_for_line("PAGE 300", 60)
    first.kill()  # while it sleeps after its third page or writes the fourth
    with Session(zk_namespace.hosts, "c1") as s:
        recorded, _ = VersionedRegister(s, "snapshots/snap-1").get()
    assert recorded["pages"] >= 3 and not recorded["done"], recorded
    pages_dir = tmp_path / "data" / "series" / "snap-1" / "_snapshot-pages"
    kept = {p.name: p.stat().st_mtime_ns for p in pages_dir.glob("page-*.parquet")
            if int(p.name[5:11]) < recorded["pages"]}
    assert len(kept) == recorded["pages"]
    second = spawn_node([*argv[:-1], "0"], name="exporter")
    done = second.wait_for_line("DONE", 120)
    assert done == f"DONE {n // 3}"
    assert f"resuming at page {recorded['pages']}" in second.stderr_tail(200)
    snapshot = tmp_path / "data" / "series" / "snap-1" / "snapshot"
    assert {p.name: p.stat().st_mtime_ns for p in snapshot.glob("page-*.parquet")
            if p.name in kept} == kept  # the recorded pages were not written again
    assert not list(snapshot.glob("_*")) and not pages_dir.exists()
    table = pq.read_table(snapshot)
    assert sorted(table.column("pos").to_pylist()) == list(range(n // 3))
    ids = table.column("id").to_pylist()
    assert len(set(ids)) == len(ids) == n // 3
    assert set(ids) == {f"av-{i:05d}" for i in range(0, n, 3)}
    # Spark reads it, and a batch's range reads its rows only
    from pyspark.sql import functions as F
    frame = spark.read.parquet(root + "/snapshot")
    assert frame.count() == n // 3
    assert frame.where((F.col("pos") >= 250) & (F.col("pos") < 300)).count() == 50
    with Session(zk_namespace.hosts, "c1") as s:
        final, _ = VersionedRegister(s, "snapshots/snap-1").get()
    assert final["done"] and final["rows"] == n // 3


def _store_with(path: Path, edges: list[tuple[str, str]]) -> Store:
    store = open_store(str(path))
    classes = {c for e in edges for c in e}
    store.ontologies.load(Ontology(
        iri="http://example.org/plant", version="1", checksum=str(len(edges)),
        classes=tuple(OntologyClass(iri=c, label=c.rsplit("#", 1)[1],
                                    parents=tuple(p for ch, p in edges if ch == c))
                      for c in sorted(classes))))
    return store


def test_eligible_classes_are_one_consistent_view_while_the_cache_reloads(
        tmp_path: Path) -> None:
    before = [(f"{EX}Equipment", f"{EX}Asset"), (f"{EX}Pump", f"{EX}Equipment")]
    after = [*before, (f"{EX}Fan", f"{EX}Equipment"), (f"{EX}JetFan", f"{EX}Fan"),
             (f"{EX}DeepPump", f"{EX}Pump")]
    stores = [_store_with(tmp_path / "a.db", before), _store_with(tmp_path / "b.db", after)]
    cache = OntologyCache()
    cache.reload(stores[0])
    definition = AspectDefinition(name="geo", kind=Kind.HEAVY, compute="geojson-point",
                                  classes=(f"{EX}Equipment",))
    views = {frozenset(eligible_classes(definition, cache))}
    cache.reload(stores[1])
    views.add(frozenset(eligible_classes(definition, cache)))
    assert len(views) == 2 and {len(v) for v in views} == {2, 5}
    stop = threading.Event()

    def synchronise() -> None:
        i = 0
        while not stop.is_set():
            cache.reload(stores[i % 2])
            i += 1

    sync = threading.Thread(target=synchronise)
    sync.start()
    try:
        seen: list[frozenset[str]] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (len(seen) < 300 or len(set(seen)) < 2):
            seen.append(frozenset(eligible_classes(definition, cache)))
    finally:
        stop.set()
        sync.join()
        for s in stores:
            s.close()
    assert set(seen) <= views, "a mixed set of eligible classes"
    assert len(set(seen)) == 2, "the reloads never interleaved with the reads"


def _snapshot_series(spark: Any, session: Session, store: Store, tmp_path: Path,
                     sid: str, n: int, batch_rows: int, timeout: float = 30.0
                     ) -> tuple[BatchCoordinator, SeriesPaths]:
    store.avatars.upsert([Avatar(id=f"av-{i:05d}", class_iri=CLASSES[i % 3],
                                 properties={"lat": 40 + i / 1000, "lon": -3 - i / 1000})
                          for i in range(n)])
    paths = SeriesPaths.of(str(tmp_path / "data"), sid)
    rows = write_snapshot(store, [f"{EX}Pump", f"{EX}Equipment"], paths)
    coordinator = BatchCoordinator(session, sid, timeout=timeout)
    coordinator.create(end=rows, meta={"aspect": "geo", "root": paths.root,
                                       "batch_rows": batch_rows, "timeout": timeout,
                                       "pause": 0})
    return coordinator, paths


#: the rows of the first batch the cancel tests' series cut (their snapshots hold more)
_BATCH_ROWS = 20


def _slow_rows(marks: Path) -> Any:
    """A value that takes a second a row, each row leaving a file in ``marks`` as it starts: a
    batch's rows, one after another in one task, run for many seconds unless its job is
    cancelled, and the files count the rows computed. (A Python UDF: a cancelled job's Python
    worker is killed, where a built-in loop runs its row to the end.)"""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType
    marks.mkdir(exist_ok=True)
    where = str(marks)

    def slow(avatar: str) -> str:
        import os
        import time
        import uuid
        open(os.path.join(where, uuid.uuid4().hex), "w").close()
        time.sleep(1.0)
        return '"slow"'

    return F.udf(slow, StringType())(F.col("id"))


def _in_a_thread(worker: BatchWorker) -> tuple[threading.Thread, list[BaseException]]:
    """``worker.run()`` started in a thread of its own; what it raised, once it ended."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


@contextlib.contextmanager
def _slow_worker(spark: Any, zk_namespace: ZkNamespace, tmp_path: Path, sid: str, group: str,
                 computation: Callable[[Any], Any], cancel: CancelToken, timeout: float = 30.0
                 ) -> Iterator[tuple[BatchWorker, Session]]:
    """A worker (not started) of a new series ``sid`` of 40 snapshot rows in batches of
    ``_BATCH_ROWS``, its aspect computed by ``computation``, and the session of its coordinator
    (series ``timeout`` seconds); the computation registered until the block ends."""
    COMPUTATIONS[f"test-{sid}"] = computation
    try:
        slow = AspectDefinition(name="slow", kind=Kind.HEAVY, compute=f"test-{sid}",
                                classes=(f"{EX}Equipment",))
        store = open_store(str(tmp_path / "g.db"))
        with Session(zk_namespace.hosts, "c1") as session:
            coordinator, paths = _snapshot_series(spark, session, store, tmp_path, sid, 40,
                                                  _BATCH_ROWS, timeout=timeout)
            yield BatchWorker(spark, store, coordinator, slow, paths, "w1", cancel,
                              group=group, batch_rows=_BATCH_ROWS), session
        store.close()
    finally:
        del COMPUTATIONS[f"test-{sid}"]


def test_cancelling_the_task_cancels_its_spark_job_group(
        spark: Any, zk_namespace: ZkNamespace, tmp_path: Path) -> None:
    marks = tmp_path / "rows"
    cancel = CancelToken()
    with _slow_worker(spark, zk_namespace, tmp_path, "slow-1", "latchwork-task-t1",
                      lambda df: _slow_rows(marks), cancel) as (worker, _):
        thread, errors = _in_a_thread(worker)
        assert wait_until(lambda: spark.sparkContext.statusTracker()
                          .getActiveJobsIds() != [], 30, 0.1)
        time.sleep(1.0)
        asked = time.monotonic()
        cancel.cancel("operator deactivated the task")
        thread.join(60)
        assert not thread.is_alive()
        assert time.monotonic() - asked < 30
        assert len(errors) == 1 and isinstance(errors[0], TaskCancelled)
        assert spark.sparkContext.statusTracker().getActiveJobsIds() == []
        assert len(list(marks.iterdir())) < _BATCH_ROWS, "the batch was computed"
        (batch, *_) = worker.coordinator.history()
        assert batch.state is BatchState.ABORTED and batch.failures == 0  # not its fault
        assert "cancelled" in batch.errors[-1]


def test_a_cancel_between_two_spark_jobs_cancels_the_job_started_after_it(
        spark: Any, zk_namespace: ZkNamespace, tmp_path: Path) -> None:
    """The cancel lands while no job of the group runs (after the snapshot's read, before the
    batch's write starts): the write's job, started after it, is cancelled too."""
    cancel = CancelToken()
    between: list[list[int]] = []
    marks = tmp_path / "rows"

    def slow_after_a_cancel(df: Any) -> Any:  # built on the driver between the two jobs
        between.append(list(spark.sparkContext.statusTracker().getActiveJobsIds()))
        cancel.cancel("operator deactivated the task")
        return _slow_rows(marks)

    with _slow_worker(spark, zk_namespace, tmp_path, "between-1", "latchwork-task-t2",
                      slow_after_a_cancel, cancel) as (worker, _):
        thread, errors = _in_a_thread(worker)
        thread.join(60)
        assert not thread.is_alive(), "the job started after the cancel ran on"
        assert between == [[]], "the cancel did not fall between two jobs"
        assert len(errors) == 1 and isinstance(errors[0], TaskCancelled)
        assert spark.sparkContext.statusTracker().getActiveJobsIds() == []
        assert len(list(marks.iterdir())) < _BATCH_ROWS, "the batch was computed"
        (batch, *_) = worker.coordinator.history()
        assert batch.state is BatchState.ABORTED and "cancelled" in batch.errors[-1]


def test_a_batch_lost_while_its_spark_job_runs_cancels_that_job_and_the_worker_goes_on(
        spark: Any, zk_namespace: ZkNamespace, tmp_path: Path) -> None:
    """The batch's lease is lost while its Spark job computes (here another worker took the
    batch over as timed out, by a clock 100 s ahead, and the series' other batch besides): the
    lease's next renewal finds it (BatchLost), the job group is cancelled before the batch is
    computed, nothing of it is committed, and the worker goes on with the series (it waits:
    nothing is left to start) until its task is cancelled."""
    marks = tmp_path / "rows"
    cancel = CancelToken()
    with _slow_worker(spark, zk_namespace, tmp_path, "lost-1", "latchwork-task-t3",
                      lambda df: _slow_rows(marks), cancel, timeout=3.0) as (worker, _), \
            Session(zk_namespace.hosts, "c1") as theirs:
        thread, errors = _in_a_thread(worker)
        assert wait_until(lambda: marks.exists() and any(marks.iterdir()), 30, 0.1)
        thief = BatchCoordinator(theirs, "lost-1", timeout=3.0,
                                 clock=lambda: time.time() + 100)
        taken = thief.start_batch("w2", _BATCH_ROWS)
        assert taken is not None and taken.no == 0 and taken.attempt == 2
        rest = thief.start_batch("w2", _BATCH_ROWS)
        assert rest is not None and rest.no == 1
        assert wait_until(lambda: spark.sparkContext.statusTracker()
                          .getActiveJobsIds() == [], 15, 0.1), "the lost batch's job ran on"
        assert len(list(marks.iterdir())) < _BATCH_ROWS, "the lost batch was computed"
        assert thread.is_alive() and errors == []  # the worker goes on with its series
        assert not HadoopFS(spark).exists(worker.paths.batch(0))
        cancel.cancel("operator deactivated the task")
        thread.join(30)
        assert not thread.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], TaskCancelled)
        batch = worker.coordinator.status().batches[0]
        assert batch.state is BatchState.IN_PROGRESS and batch.owner == "w2"


def test_a_committed_batch_is_not_recomputed_and_reapplying_it_changes_nothing(
        spark: Any, zk_namespace: ZkNamespace, tmp_path: Path) -> None:
    import shutil
    store = open_store(str(tmp_path / "g.db"))
    definition = AspectRegistry(json.loads(ASPECTS)).get("geo")
    with Session(zk_namespace.hosts, "c1") as session:
        coordinator, paths = _snapshot_series(spark, session, store, tmp_path, "rerun-1", 30, 30)
        worker = BatchWorker(spark, store, coordinator, definition, paths, "w1", CancelToken(),
                             group="g", batch_rows=30)
        batch = coordinator.start_batch("w1", 30)
        assert batch is not None
        assert worker.process(batch) == 20  # Pump + Equipment avatars of 30
        first = store.avatars.with_aspect("geo")
        shutil.rmtree(paths.snapshot.removeprefix("file://"))  # a recompute would now fail
        assert worker.process(batch) == 20  # the committed output is applied again
        assert store.avatars.with_aspect("geo") == first
        outputs = [p for p in Path(paths.batches.removeprefix("file://")).iterdir()]
        assert [p.name for p in outputs] == ["000000"]  # one commit, no leftovers
    store.close()


def test_the_job_module_runs_under_spark_submit_with_py_files(
        spark: Any, zk_namespace: ZkNamespace, tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "g.db"))
    with Session(zk_namespace.hosts, "c1") as session:
        _snapshot_series(spark, session, store, tmp_path, "submit-1", 60,
                         25)
    store.close()
    root = Path(__file__).resolve().parents[1]
    bundle = build(tmp_path / "latchwork.zip")
    assert "runner/pipeline/job.py" in zipfile.ZipFile(bundle).namelist()
    submit = Path(sys.executable).parent / "spark-submit"
    env = {**os.environ, "LATCHWORK_ZK_HOSTS": zk_namespace.hosts, "LATCHWORK_CLUSTER": "c1",
           "LATCHWORK_GRAPH": str(tmp_path / "g.db"), "PYSPARK_PYTHON": sys.executable,
           "LATCHWORK_ASPECTS": ASPECTS}
    proc = subprocess.run(
        [str(submit), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
         "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
         "--py-files", str(bundle), str(root / "runner/pipeline/job.py"),
         "--series", "submit-1", "--member", "submitted"],
        env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    assert report["state"] == "COMPLETED" and report["batches_done"] == 2
    assert report["rows_done"] == 40
    with Session(zk_namespace.hosts, "c1") as session:
        assert {b.owner for b in BatchCoordinator(session, "submit-1").history()} == {
            "submitted"}
    store = open_store(str(tmp_path / "g.db"))
    try:
        assert len(store.avatars.with_aspect("geo")) == 40
    finally:
        store.close()


def test_avatars_import_validates_first_and_export_round_trips(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from runner.cli import cli
    env = {"LATCHWORK_GRAPH": str(tmp_path / "g.db")}
    good = avatars_file(tmp_path / "good.parquet", 30)
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c"], "class_iri": [f"{EX}Pump"] * 3,
                             "properties": ['{"lat": 1}', "{not json", "{}"]}), bad)
    runner = CliRunner()
    refused = runner.invoke(cli, ["avatars", "import", str(bad)], env=env)
    assert refused.exit_code == 2 and "row 1 (b): properties is not JSON" in refused.output
    nocol = tmp_path / "nocol.parquet"
    pq.write_table(pa.table({"name": ["a"]}), nocol)
    refused = runner.invoke(cli, ["avatars", "import", str(nocol)], env=env)
    assert refused.exit_code == 2 and "missing column(s) class_iri, id" in refused.output
    store = open_store(env["LATCHWORK_GRAPH"])
    try:
        assert store.avatars.count() == 0  # nothing written from the bad files
        assert runner.invoke(cli, ["avatars", "import", str(good)], env=env).exit_code == 0
        store.avatars.upsert_aspect("geo", {"av-00000": {"type": "Point"}})
    finally:
        store.close()
    out = tmp_path / "out" / "all.parquet"
    exported = runner.invoke(cli, ["avatars", "export", str(out), "--class", f"{EX}Pump"],
                             env=env)
    assert exported.exit_code == 0 and "exported 10 avatars" in exported.output
    table = pq.read_table(out).to_pylist()
    assert [r["id"] for r in table] == [f"av-{i:05d}" for i in range(0, 30, 3)]
    assert json.loads(table[0]["aspects"]) == {"geo": {"type": "Point"}}
    assert json.loads(table[1]["properties"]) == {"lat": 40.003, "lon": -3.003}


def test_aspect_definitions_from_configuration_are_validated() -> None:
    from runner.errors import InvalidAspect
    registry = AspectRegistry({"geo": {"classes": [f"{EX}Equipment"]},
                               "tags": {"kind": "simple", "classes": [f"{EX}Asset"]}})
    assert registry.get("geo").classes == (f"{EX}Equipment",)
    assert registry.get("geo").compute == "geojson-point"
    assert registry.get("tags").kind is Kind.SIMPLE
    with pytest.raises(InvalidAspect, match="needs compute"):
        AspectRegistry({"heavy1": {"kind": "heavy", "classes": ["x"]}})
    with pytest.raises(InvalidAspect):
        AspectRegistry({"Bad Name": {"kind": "simple", "classes": ["x"]}})
    assert Settings(aspects={"geo": {"classes": ["x"]}}).aspects["geo"]["classes"] == ["x"]
