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
from typing import Any

import pytest

from coord.testing import wait_until
from runner.errors import StoreFormatOutdated, StoreFormatTooNew
from runner.store import GraphStore, migrations, open_store
from runner.store.gremlin.rows import resource_key, task_props
from runner.store.gremlin.search import TaskFilter
from runner.store.migrations.format import FORMAT_KEY, FORMAT_KEY_VALUE, read_state
from runner.store.remote import SERIAL
from runner.tasks.worker.ready import ReadyScan
from runner.testing.cluster import Cluster
from runner.testing.formats import write_format_0

CONSOLE_KEYS = ("task_list", "task_owner", "task_h", "task_s")


def fresh(cluster: Cluster) -> GraphStore:
    """The cluster's graph emptied, without a format vertex: format 0 once tasks are in."""
    cluster.store.graph.write(lambda g: g.V().drop().iterate())
    return GraphStore(cluster.store.graph, check_format=False)


def has_console_props(store: GraphStore, task_id: str) -> bool:
    return bool(store.graph.read(lambda g: g.V().has("task_id", task_id).has("task_h")
                                 .id_().to_list()))


def migrated(store: GraphStore, marker: str = "task_h") -> int:
    """Tasks a step has changed: step 1 writes ``task_h``, step 2 ``task_lane``."""
    return int(store.graph.read(lambda g: g.V().has("task_id").has(marker).count().next()))


#: the steps that write a property on every task, by version (format 3 rewrites nothing)
MARKERS = {1: "task_h", 2: "task_lane", 4: "task_shard"}


def everything(store: GraphStore) -> list[Any]:
    rows = store.graph.read(lambda g: g.V().element_map().to_list())
    return sorted(sorted((str(k), str(v)) for k, v in r.items() if str(k) not in ("T.id",))
                   for r in rows)


def reopen(cluster: Cluster) -> GraphStore:
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
        changed = 250 if version in MARKERS else 0
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
        assert counts == {"waiting": sum(1 for i in range(1, 250, 2) if i % 3 and i % 5),
                          "running": 0,
                          "stopped": sum(1 for i in range(1, 250, 2) if i % 5 == 0 and i % 3),
                          "finished": sum(1 for i in range(1, 250, 2) if i % 3 == 0),
                          "skipped": 0}
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
