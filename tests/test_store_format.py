"""The graph's store format (issue 42): a brand-new graph is stamped with the current format,
an older or a newer one is refused in one line, and ``latchwork store migrate`` upgrades an
older one, idempotent and resumable, on the embedded graph and on the Gremlin Server.

The format-0 graph is written with plain traversals (:func:`runner.testing.formats.
write_format_0`), as the latchwork before store formats wrote it: tasks with their state,
fence and due queue but without the web console's list properties (``task_list``,
``task_owner``, ``task_h``, ``task_s``, ``task_res_<hex>``), each with one attempt."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any, cast

import pytest

from coord.testing import wait_until
from runner.errors import StoreFormatOutdated, StoreFormatTooNew
from runner.store import Store, codec, migrations, open_store, store_on
from runner.store import format as format_module
from runner.store.api import Graph
from runner.store.format import FORMAT_KEY, FORMAT_KEY_VALUE, FORMAT_LABEL, read_state
from runner.store.gremlin.rows import resource_key, task_props
from runner.store.gremlin.search import TaskFilter
from runner.store.server.graph import SERIAL
from runner.tasks.worker.ready import ReadyScan
from runner.testing.cluster import Cluster
from runner.testing.formats import write_format_0

CONSOLE_KEYS = ("task_list", "task_owner", "task_h", "task_s")


def fresh(cluster: Cluster) -> Store:
    """The cluster's graph emptied, without a format vertex: format 0 once tasks are in."""
    cluster.store.graph.write(lambda g: g.V().drop().iterate())
    return store_on(cluster.store.graph, check_format=False)


def has_console_props(store: Store, task_id: str) -> bool:
    return bool(store.graph.read(lambda g: g.V().has("task_id", task_id).has("task_h")
                                 .id_().to_list()))


def migrated(store: Store, marker: str = "task_h") -> int:
    """Tasks a step has changed: step 1 writes ``task_h``, step 2 ``task_lane``."""
    return int(store.graph.read(lambda g: g.V().has("task_id").has(marker).count().next()))


#: the steps that write a property on every task, by version (format 3 rewrites nothing;
#: format 5 rewrites the finished and stopped ones: :func:`ended`)
MARKERS = {1: "task_h", 2: "task_lane", 4: "task_shard"}


def ended(total: int) -> int:
    """How many of ``write_format_0``'s first ``total`` tasks are finished or stopped: what
    step 5 rewrites (every third finished, every fifth stopped)."""
    return sum(1 for i in range(total) if i % 3 == 0 or i % 5 == 0)


def everything(store: Store) -> list[Any]:
    rows = store.graph.read(lambda g: g.V().element_map().to_list())
    return sorted(sorted((str(k), str(v)) for k, v in r.items() if str(k) not in ("T.id",))
                   for r in rows)


def reopen(cluster: Cluster) -> Store:
    return (open_store(cluster.graph, atomicity=SERIAL) if cluster.remote
            else open_store(cluster.graph))


def said(stderr: str) -> list[str]:
    """What a command said besides its log records (a log line starts with its date)."""
    return [line for line in stderr.strip().splitlines()
            if not re.match(r"\d{4}-\d\d-\d\d \d\d:", line)]


GRAPHS = pytest.mark.parametrize("cluster", ["gremlite", "server"], indirect=True)


def test_a_brand_new_graph_is_created_at_the_current_format(tmp_path: Any) -> None:
    with open_store(str(tmp_path / "new.db")) as store:
        state = read_state(store.graph)
        assert state.version == migrations.CURRENT >= 1 and not state.empty
    with open_store(str(tmp_path / "new.db")) as again:  # opened again: the same one vertex
        assert again.graph.read(lambda g: g.V().has(FORMAT_KEY, FORMAT_KEY_VALUE)
                                .count().next()) == 1


class _StampedBetween:
    """A graph as one store reads it while another store writes ``landing`` between this one's
    first and second reads."""

    def __init__(self, graph: Any, landing: Callable[[Any], None]) -> None:
        self.graph, self.landing, self.reads = graph, landing, 0

    def read(self, fn: Any) -> Any:
        self.reads += 1
        if self.reads == 2:
            self.landing(self.graph)
        return self.graph.read(fn)

    def write(self, fn: Any) -> Any:
        return self.graph.write(fn)


def _stamp(graph: Any) -> None:
    migrations.stamp(graph, migrations.CURRENT)


def _stamp_and_a_vertex(graph: Any) -> None:  # the other node stamped, then wrote on
    migrations.stamp(graph, migrations.CURRENT)
    graph.write(lambda g: g.add_v("thing").iterate())


def _keyless(graph: Any) -> None:  # caught half-written: the vertex without key or version
    graph.write(lambda g: g.add_v(FORMAT_LABEL).iterate())


@pytest.mark.parametrize("landing", [_stamp, _stamp_and_a_vertex, _keyless])
def test_a_new_graph_stamped_by_another_node_between_two_reads_is_opened_at_the_current_format(
        tmp_path: Any, landing: Callable[[Any], None]) -> None:
    """Nodes started together open one new graph at once. A node that finds no format vertex
    while another node's stamp lands before its next read opens the graph at the current
    format: it used to find the graph "not empty" (the other's format vertex) and call it
    format 0, refusing to start (a node of three missing from the bench's cluster). A format
    vertex alone is no content; with other vertices after it, the format vertex is looked up
    again; one caught half-written (no key yet) leaves the graph empty, stamped by this node
    too."""
    with open_store(str(tmp_path / "new.db"), check_format=False) as store:
        racing = _StampedBetween(store.graph, landing)
        assert migrations.open_format(cast(Graph, racing), "new.db") == migrations.CURRENT
        assert racing.reads >= 2  # the other's write came between this node's reads
        assert read_state(store.graph).version == migrations.CURRENT


def test_a_format_vertex_without_its_version_is_read_again_until_the_stamp_lands(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A format vertex found with its key but not its version yet (another node's stamp
    half-written on a graph without transactions) is read again until the version lands; one
    whose version never comes is a graph at format 0, as before (``store migrate`` stamps it)."""
    with open_store(str(tmp_path / "new.db"), check_format=False) as store:
        store.graph.write(lambda g: g.add_v(FORMAT_LABEL)
                          .property(FORMAT_KEY, FORMAT_KEY_VALUE)
                          .property("filler", "x").iterate())
        landing = threading.Timer(0.3, migrations.stamp, (store.graph, migrations.CURRENT))
        landing.start()
        assert read_state(store.graph).version == migrations.CURRENT
        landing.join()
        store.graph.write(lambda g: g.V().has(FORMAT_KEY, FORMAT_KEY_VALUE)
                          .properties("format_version").drop().iterate())
        monkeypatch.setattr(format_module, "STAMP_WAIT", 0.2)
        with pytest.raises(StoreFormatOutdated, match="store format 0"):
            migrations.open_format(store.graph, "new.db")


def _open_together(cluster: Cluster, stores: int) -> list[BaseException]:
    """``stores`` stores, each with its own connection, opened at one moment; what they raised."""
    ready = threading.Barrier(stores)
    failed: list[BaseException] = []

    def open_one() -> None:
        ready.wait()
        try:
            reopen(cluster).close()
        except BaseException as exc:  # reported by the test
            failed.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(stores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return failed


@GRAPHS
def test_nodes_opening_one_new_graph_together_all_open_it(cluster: Cluster) -> None:
    """Six stores (as six nodes started at once, each with its own connection) open one
    brand-new graph together, five times over: none is refused, and the graph is at the
    current format."""
    try:
        for _ in range(5):
            fresh(cluster)
            assert _open_together(cluster, 6) == []
            assert read_state(cluster.store.graph).version == migrations.CURRENT
    finally:  # the server's graph is shared with the tests after this one
        cluster.store.clear()


@GRAPHS
def test_an_older_and_a_newer_graph_are_refused_in_one_line(cluster: Cluster) -> None:
    store = fresh(cluster)
    write_format_0(store.graph, 3)
    with pytest.raises(StoreFormatOutdated, match=r"store format 0; .* writes format "
                                                  r"\d+: stop the nodes and run `latchwork "
                                                  r"store migrate`"):
        reopen(cluster)
    started = cluster.start_without_tasks_setting()
    assert started.returncode == 1, started
    (line,) = said(started.stderr)
    assert "store format 0" in line and "latchwork store migrate" in line, started.stderr
    migrations.stamp(store.graph, migrations.CURRENT + 1)  # written by a newer latchwork
    try:
        with pytest.raises(StoreFormatTooNew, match=f"format {migrations.CURRENT + 1}, newer"):
            reopen(cluster)
        started = cluster.start_without_tasks_setting()
        assert started.returncode == 1
        (line,) = said(started.stderr)
        assert f"store format {migrations.CURRENT + 1}, newer than this latchwork" in line
        refused = cluster.cli("store", "migrate")
        assert refused.exit_code == 1 and "downgrades are not supported" in refused.output
    finally:  # the server's graph is shared with the tests after this one
        cluster.store.clear()


@GRAPHS
def test_migrate_backfills_the_console_lists_and_a_dry_run_changes_nothing(
        cluster: Cluster) -> None:
    store = fresh(cluster)
    ids = write_format_0(store.graph, 250)
    before = everything(store)
    dry = cluster.cli("store", "migrate", "--dry-run")
    assert dry.exit_code == 0, dry.output
    latest = migrations.CURRENT
    assert f"would run {latest} step(s) to format {latest}" in dry.output
    assert "250" in dry.output
    assert "dry run: nothing was changed" in dry.output
    assert everything(store) == before and read_state(store.graph).version is None

    run = cluster.cli("store", "migrate", "--page-size", "40")
    assert run.exit_code == 0, run.output
    assert f"at store format 0; running {latest} step(s) to format {latest}" in run.output
    assert "the web console's list properties" in run.output.lower()
    for version in range(1, latest + 1):  # a step with no marker has nothing to rewrite
        changed = 250 if version in MARKERS else ended(250) if version == 5 else 0
        assert re.search(rf"│ {version}\s+│.*│ {changed}\s+│ 0\s+│", run.output), run.output
    with reopen(cluster) as current:
        assert read_state(current.graph).version == migrations.CURRENT
        for task_id in ids:  # what the create path writes today, and nothing else changed
            task = current.tasks.get(task_id)
            props = task_props(task)
            row = current.graph.read(lambda g, t=task_id: g.V().has("task_id", t)
                                     .element_map().to_list())[0]
            for key in (*CONSOLE_KEYS, *(resource_key(r) for r in task.resources),
                        "task_lane", "task_queue", "task_shard"):
                assert row[key] == props[key], (task_id, key)
        # the task loop's scan reads them a page at a time, the oldest first
        waiting = sorted(t for t in ids if (lambda i: i % 3 and i % 5)(int(t[4:])))
        assert sorted(t.id for t in ReadyScan(current.tasks).read(10)) == waiting[:10]
        # the console lists the old tasks now, newest first, by state
        page = current.search.page(TaskFilter(), None, 200)
        assert [t.id for t in page.tasks] == sorted(ids, reverse=True)[:200]
        counts = current.search.counts(TaskFilter(type="old.kind1"))
        # a stopped task whose last attempt FAILED is failed (format 5)
        assert counts == {"waiting": sum(1 for i in range(1, 250, 2) if i % 3 and i % 5),
                          "running": 0,
                          "succeeded": sum(1 for i in range(1, 250, 2) if i % 3 == 0),
                          "failed": sum(1 for i in range(1, 250, 2) if i % 5 == 0 and i % 3),
                          "cancelled": 0, "skipped": 0}
        stopped = next(t for t in ids if int(t[4:]) % 5 == 0 and int(t[4:]) % 3)
        assert current.tasks.get(stopped).state(codec.now()).value == "failed"
        printers = [t.id for t in current.search.page(TaskFilter(resource="printer"), None,
                                                      200).tasks]
        assert sorted(printers) == [t for t in ids if int(t[4:]) % 4 == 0]
        after = everything(current)
    again = cluster.cli("store", "migrate")
    assert again.exit_code == 0 and "the current one: nothing to migrate" in again.output
    with reopen(cluster) as current:
        assert everything(current) == after  # run again: nothing changed twice
    member = cluster.start_node()  # a node starts on the migrated graph
    assert member


@GRAPHS
def test_a_migrate_killed_half_way_finishes_when_run_again(cluster: Cluster) -> None:
    """kill -9 of the migrate process (not of the server) after some pages: the graph stays
    at format 0 (nodes still refuse it), the pages written keep their changes, and the next
    run changes exactly the rest."""
    store = fresh(cluster)
    total = 1500
    write_format_0(store.graph, total)
    migrate = subprocess.Popen([sys.executable, "-m", "runner.cli", "store", "migrate",
                                "--page-size", "20"], env=cluster.env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:  # killed some pages into one of the steps
        assert wait_until(lambda: 100 <= migrated(store) < total
                          or 100 <= migrated(store, "task_lane") < total, 120, 0.01)
        migrate.kill()
    finally:
        migrate.wait(30)
    left = {v: total - migrated(store, marker) for v, marker in MARKERS.items()}
    at = read_state(store.graph).version or 0
    assert at < migrations.CURRENT and 0 < left[at + 1] < total, (at, left)
    with pytest.raises(StoreFormatOutdated):  # nodes still refuse it
        reopen(cluster)
    rerun = cluster.cli("store", "migrate", "--page-size", "200")
    assert rerun.exit_code == 0, rerun.output
    left[5] = ended(total)  # killed in an earlier step: step 5 rewrites every ended task
    for version in range(at + 1, migrations.CURRENT + 1):  # each step changed what was left
        assert re.search(rf"│ {version}\s+│.*│ {left.get(version, 0)}\s+│ 0\s+│",
                         rerun.output), (
            left, rerun.output)
    assert all(migrated(store, marker) == total for marker in MARKERS.values())
    with reopen(cluster) as current:
        assert len(current.search.page(TaskFilter(), None, 200).tasks) == 200


def test_migrate_refuses_while_members_are_live_unless_forced(cluster: Cluster) -> None:
    member = cluster.start_node()
    refused = cluster.cli("store", "migrate")
    assert refused.exit_code == 1
    (line,) = refused.output.strip().splitlines()
    assert f"1 member(s) of cluster 'r1' are live ({member})" in line and "--force" in line
    forced = cluster.cli("store", "migrate", "--force")
    assert forced.exit_code == 0 and "nothing to migrate" in forced.output
    cluster.env["LATCHWORK_ZK_HOSTS"] = "127.0.0.1:1"  # nothing listens: liveness unknown
    unknown = cluster.cli("store", "migrate", timeout=120)
    assert unknown.exit_code == 1 and "cannot read the membership" in unknown.output


def test_a_format_change_comes_with_a_new_version_defined_once() -> None:
    """0.1.0 wrote formats 0 to 4, so ``format_by`` and the members' versions could not tell
    those releases apart. Now each release writes one format: the newest release in
    ``RELEASES`` is this code's version and writes ``CURRENT``; a step added without a new
    version (or a version bumped without its entry) fails here. The version is defined once
    (runner/__init__.py; pyproject.toml reads it)."""
    import tomllib
    from pathlib import Path

    from runner import __version__

    releases = list(migrations.RELEASES.items())
    assert releases[-1] == (__version__, migrations.CURRENT), (
        f"store format {migrations.CURRENT} needs a release of its own: add it to "
        f"runner.store.migrations.RELEASES with a new runner.__version__")
    formats = [f for _, f in releases]
    assert formats == sorted(set(formats)), "each release writes a newer format than the last"
    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml")
                            .read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
