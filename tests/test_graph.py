"""The embedded graph's transactions (gremlite on a SQLite file), against a second SQLite
connection that holds the file's write lock the way another node process would."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coord.testing import wait_until
from runner.errors import StoreUnavailable
from runner.store.embedded.graph import EmbeddedGraph


@pytest.fixture
def graph(tmp_path: Path) -> Iterator[EmbeddedGraph]:
    g = EmbeddedGraph(tmp_path / "graph.db", busy_timeout=0.5)
    yield g
    g.close()


@pytest.fixture
def other(graph: EmbeddedGraph) -> Iterator[sqlite3.Connection]:
    """Another process's connection to the same file (autocommit; BEGIN/COMMIT by hand)."""
    con = sqlite3.connect(graph.path, isolation_level=None, timeout=5)
    yield con
    if con.in_transaction:
        con.execute("ROLLBACK")
    con.close()


def count(graph: EmbeddedGraph, label: str) -> int:
    return int(graph.read(lambda g: g.V().has_label(label).count().next()))


def test_a_write_builds_its_traversal_before_waiting_for_the_write_lock(
        graph: EmbeddedGraph, other: sqlite3.Connection) -> None:
    other.execute("BEGIN IMMEDIATE")  # another writer holds the lock
    graph.busy_timeout = 10.0  # for the writer thread's own connection: it waits, not fails
    entered = threading.Event()
    failures: list[BaseException] = []

    def write(g: Any) -> None:
        entered.set()  # fn runs at once: only its first statement waits for the lock
        g.add_v("job").property("name", "a").iterate()

    def run() -> None:
        try:
            graph.write(write)
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    writer = threading.Thread(target=run)
    writer.start()
    assert entered.wait(5), "the traversal was not built while another writer held the lock"
    writer.join(0.3)
    assert writer.is_alive(), "the write went through while another writer held the lock"
    other.execute("COMMIT")
    writer.join(10)
    assert not writer.is_alive() and not failures
    assert count(graph, "job") == 1


def test_a_lock_held_past_the_busy_timeout_raises_store_unavailable_and_leaves_no_transaction(
        graph: EmbeddedGraph, other: sqlite3.Connection) -> None:
    other.execute("BEGIN IMMEDIATE")
    with pytest.raises(StoreUnavailable, match=r"stayed locked for 0\.5s"):
        graph.write(lambda g: g.add_v("job").iterate())
    other.execute("COMMIT")
    graph.write(lambda g: g.add_v("job").iterate())  # the connection works on
    assert count(graph, "job") == 1


def test_a_write_waits_out_a_lock_held_for_seconds_and_then_writes(
        tmp_path: Path) -> None:
    """Another process holds the write lock for 5 s (a node SIGSTOPped inside its write, in
    the chaos suite): a write asks again every few milliseconds, over a thousand times, and
    writes once the lock is free, within its busy timeout. (It raised OverflowError after
    about 4 s, its pause computed as 2 ** tries: the group commit gave its ends up at once and
    the tasks ran again.)"""
    graph = EmbeddedGraph(tmp_path / "graph.db", busy_timeout=20)
    holder = sqlite3.connect(graph.path, isolation_level=None, timeout=5,
                             check_same_thread=False)
    try:
        holder.execute("BEGIN IMMEDIATE")
        threading.Timer(5.0, lambda: holder.execute("COMMIT")).start()
        graph.write(lambda g: g.add_v("job").iterate())
        assert count(graph, "job") == 1
    finally:
        graph.close()
        holder.close()


def test_a_write_that_runs_no_statement_neither_waits_nor_locks(
        graph: EmbeddedGraph, other: sqlite3.Connection) -> None:
    other.execute("BEGIN IMMEDIATE")
    assert graph.write(lambda g: 42) == 42  # with the lock held elsewhere: no wait, no error
    other.execute("COMMIT")
    graph.write(lambda g: 7)
    other.execute("BEGIN IMMEDIATE")  # and it left no lock behind
    other.execute("COMMIT")


def test_a_failed_write_rolls_back_every_statement_and_nested_write(
        graph: EmbeddedGraph, other: sqlite3.Connection) -> None:
    def write(g: Any) -> None:
        g.add_v("job").iterate()
        graph.write(lambda inner: inner.add_v("job").iterate())  # joins the outer transaction
        raise ValueError("handler bug")

    with pytest.raises(ValueError):
        graph.write(write)
    assert count(graph, "job") == 0
    other.execute("BEGIN IMMEDIATE")  # the write lock was given back
    other.execute("COMMIT")
    graph.write(lambda g: [graph.write(lambda inner: inner.add_v("job").iterate())
                           for _ in range(3)])
    assert count(graph, "job") == 3


def test_strings_a_read_found_are_kept_and_a_rolled_back_write_leaves_none(
        graph: EmbeddedGraph, other: sqlite3.Connection) -> None:
    """A connection keeps the strings its reads look up (gremlite reads each property name and
    string value with a query of its own). A string a write added and looked up is not kept:
    the write rolled back, its id goes to the next new string, and a read of that one gives it,
    not the string rolled back. Strings another process commits are read as they are."""
    def added_then_failed(g: Any) -> None:
        g.add_v("note").property("text", "rolled-back-string").iterate()
        assert g.V().has_label("note").values("text").next() == "rolled-back-string"
        raise ValueError("handler bug")

    with pytest.raises(ValueError):
        graph.write(added_then_failed)
    graph.write(lambda g: g.add_v("note").property("text", "the-string-written").iterate())
    for _ in range(2):  # the second read from the kept strings
        assert graph.read(lambda g: g.V().has_label("note").values("text").to_list()) == [
            "the-string-written"]
        assert graph.read(lambda g: g.V().has("text", "the-string-written").count().next()) == 1
    con = graph._connection().con
    assert "the-string-written" in con.by_value
    assert "rolled-back-string" not in con.by_value
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO strings (v) VALUES ('from-another-process')")
    other.execute("COMMIT")
    graph.write(lambda g: g.add_v("note").property("text", "from-another-process").iterate())
    assert sorted(graph.read(lambda g: g.V().has_label("note").values("text").to_list())) == [
        "from-another-process", "the-string-written"]


def test_strings_a_write_found_are_kept_once_it_committed_and_never_after_a_rollback(
        graph: EmbeddedGraph, other: sqlite3.Connection) -> None:
    """A claim and an end looked up 43 names and values inside the write lock, each a query:
    what a write finds is kept once its transaction commits. A string it added is not kept
    (mostly one task's values), and nothing a write found is kept after a rollback: it may
    have added the string itself, whose id then goes to the next new string."""
    con = graph._connection().con

    def stored(value: str) -> int:
        return int(other.execute("SELECT id FROM strings WHERE v = ?", [value]).fetchone()[0])

    graph.write(lambda g: g.add_v("note").property("text", "written-once").iterate())
    assert "written-once" not in con.by_value  # added by the write: not kept
    graph.write(lambda g: g.add_v("note").property("text", "written-once").iterate())
    assert con.by_value["written-once"] == stored("written-once")  # found, then committed
    assert con.by_value["text"] == stored("text") and con.by_value["note"] == stored("note")

    def added_found_then_failed(g: Any) -> None:
        g.add_v("note").property("text", "rolled-back-string").iterate()
        assert g.V().has("text", "rolled-back-string").count().next() == 1  # found, uncommitted
        raise ValueError("handler bug")

    with pytest.raises(ValueError):
        graph.write(added_found_then_failed)
    assert "rolled-back-string" not in con.by_value and not con.found
    other.execute("BEGIN IMMEDIATE")  # the id the rolled-back string had goes to another one
    other.execute("INSERT INTO strings (v) VALUES ('from-another-process')")
    other.execute("COMMIT")
    assert graph.write(lambda g: g.V().has("text", "from-another-process").count().next()) == 0
    graph.write(lambda g: g.add_v("note").property("text", "from-another-process").iterate())
    assert con.by_value["from-another-process"] == stored("from-another-process")

    def added_and_found(g: Any) -> None:
        g.add_v("note").property("text", "added-and-found").iterate()
        assert g.V().has("text", "added-and-found").count().next() == 1

    graph.write(added_and_found)  # found in the transaction that added it: kept once committed
    assert con.by_value["added-and-found"] == stored("added-and-found")
    assert sorted(graph.read(lambda g: g.V().has_label("note").values("text").to_list())) == [
        "added-and-found", "from-another-process", "written-once", "written-once"]


def test_a_process_frozen_holding_the_first_open_lock_blocks_no_thread_or_node_start(
        graph: EmbeddedGraph, tmp_path: Path) -> None:
    """A fresh-clone CI run: a node frozen (SIGSTOP) while one of its threads opened its own
    connection kept the file lock over gremlite's table creation, which every new thread of
    every process took with no deadline: the next master's duties thread, opening its first
    connection, waited for ever, and the frozen owner's attempt was never closed. Now only the
    first open of a file without tables takes that lock, and waits for it up to the busy
    timeout."""
    fresh = tmp_path / "fresh.db"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, sys, time\n"
         "files = [open(p + '.init-lock', 'w') for p in sys.argv[1:]]\n"
         "[fcntl.flock(f, fcntl.LOCK_EX) for f in files]\n"
         "print('held', flush=True)\n"
         "time.sleep(60)\n", str(graph.path), str(fresh)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        os.kill(holder.pid, signal.SIGSTOP)  # frozen with both locks held
        failures: list[BaseException] = []

        def new_thread() -> None:  # a thread with no connection yet, as the duties thread was
            try:
                graph.write(lambda g: g.add_v("job").iterate())
            except BaseException as exc:  # pragma: no cover - reported below
                failures.append(exc)

        thread = threading.Thread(target=new_thread)
        thread.start()
        thread.join(10)
        assert not thread.is_alive(), "a new thread waited for the frozen process's file lock"
        assert not failures
        starting = EmbeddedGraph(graph.path, busy_timeout=0.5)  # a node starting meanwhile
        try:
            assert count(starting, "job") == 1
        finally:
            starting.close()
        # a file whose tables are not made yet does need the lock: a typed error, not a hang
        with pytest.raises(StoreUnavailable, match=r"first open of the file\) for 0\.5s"):
            EmbeddedGraph(fresh, busy_timeout=0.5)
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()


def test_a_new_vertexs_properties_go_to_gremlite_as_list_properties_and_read_as_written(
        tmp_path: Path) -> None:
    """gremlite looks up a single property's earlier values before it sets one; a vertex just
    added has none, so its properties are sent as list properties (no lookup), nested
    traversals' too. The rest of a traversal is sent as written, and what is read back is what
    the unchanged traversal writes."""
    from gremlin_python.process.graph_traversal import __
    from gremlin_python.process.traversal import Cardinality, T

    from runner.store import open_store
    from runner.store.embedded.replace import fresh_props_listed

    def made(g: Any) -> Any:
        return (g.add_v("a").property("k", 1).property("s", "x").as_("v").property("late", 2)
                .add_e("e").from_("v").to("v").property("ep", 3)
                .V().has("k", 9).fold().coalesce(__.unfold(), __.add_v("b").property("k", 9)))

    steps = fresh_props_listed(made(__).bytecode).step_instructions
    assert steps[:4] == [["addV", "a"], ["property", Cardinality.list_, "k", 1],
                         ["property", Cardinality.list_, "s", "x"], ["as", "v"]]
    assert steps[4] == ["property", "late", 2]  # not right after the addV: as written
    assert ["property", "ep", 3] in steps  # an edge's: as written
    nested = steps[-1][2].step_instructions
    assert nested == [["addV", "b"], ["property", Cardinality.list_, "k", 9]]
    assert fresh_props_listed(made(__).bytecode).step_instructions == \
        fresh_props_listed(fresh_props_listed(made(__).bytecode)).step_instructions

    # what gremlite stores from them: what it stores from the steps as written
    plain, listed = (EmbeddedGraph(tmp_path / f"{name}.db") for name in ("plain", "listed"))
    del plain._connection().submit  # gremlite's own submit: the steps as written
    try:
        for graph in (plain, listed):
            graph.write(lambda g: made(g).iterate())
            graph.write(lambda g: made(g).iterate())  # the coalesce finds "b" the second time
        stored = [graph.read(lambda g: g.V().order().by("k").element_map().to_list())
                  for graph in (plain, listed)]
    finally:
        plain.close()
        listed.close()
    values = [{k: v for k, v in vertex.items() if k != T.id} for vertex in stored[1]]
    assert values == [{T.label: "a", "k": 1, "s": "x", "late": 2}] * 2 + [{T.label: "b", "k": 9}]
    assert stored[0] == stored[1]
    store = open_store(str(tmp_path / "store.db"))
    task = store.tasks.new("diag.sleep", {"seconds": 0}, priority=3)
    claimed, attempt = store.create_claimed(task, 7, "host:1")
    assert store.tasks.get(task.id) == claimed
    assert store.attempts.for_task(task.id) == [attempt]


def _replaces(path: Path) -> tuple[list[dict[str, Any]], list[list[str]], int]:
    """A run of property replaces on a new graph file (names, values of every kind, a value
    set back, a key new to one vertex, a value the graph has never held): what a read gives
    back (element maps without ids), what ``has`` finds for old and new values, and the
    highest element id (a replace in place takes none)."""
    from gremlin_python.process.traversal import Cardinality, T

    graph = EmbeddedGraph(path)
    try:
        graph.write(lambda g: [g.add_v("task").property("k", f"t{n}").property("state", "a")
                               .property("n", 1).property("flag", True).iterate()
                               for n in range(3)])
        for key, value in (("state", "b"), ("n", 2), ("flag", 1), ("state", "a"),
                           ("state", "never-seen-before"), ("f", 2.5), ("n", None),
                           ("flag", False), ("extra", "new on t1 only")):
            target = "t1" if key == "extra" else "t0"
            graph.write(lambda g, k=key, v=value, t=target: g.V().has("k", t)
                        .property(Cardinality.single, k, v).iterate())
        graph.write(lambda g: g.V().has("k", "t2").property(Cardinality.single, "state", "c")
                    .property(Cardinality.single, "n", 7).iterate())
        maps = graph.read(lambda g: g.V().has_label("task").element_map().to_list())
        found = [graph.read(lambda g, k=k, v=v: g.V().has(k, v).values("k").to_list())
                 for k, v in (("state", "a"), ("state", "b"), ("state", "c"), ("n", 2),
                              ("n", 7), ("n", 1), ("flag", False), ("flag", True),
                              ("state", "never-seen-before"), ("f", 2.5))]
        bound = graph.element_id_bound()
    finally:
        graph.close()
    rows = sorted(({k: v for k, v in m.items() if k is not T.id} for m in maps),
                  key=lambda m: str(m["k"]))
    return rows, [sorted(f) for f in found], bound


def test_a_property_replaced_in_place_reads_back_as_gremlites_own_replace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``runner.store.embedded.replace``: the same replaces through the lean one and through
    gremlite's
    own leave the same values, found by the same lookups (an old value by none); the lean one
    takes no element id per replace."""
    from gremlite import results

    lean = _replaces(tmp_path / "lean.db")
    assert results.Result._latchwork_lean
    monkeypatch.setattr(results.Result, "set_property", results.Result._latchwork_own)
    own = _replaces(tmp_path / "own.db")
    assert lean[:2] == own[:2]
    assert lean[1][0] == ["t1"] and lean[1][1] == [] and lean[1][8] == ["t0"]
    assert lean[2] < own[2]  # gremlite's own took an element id per replace


def _unions(path: Path) -> list[Any]:
    """What unions of every shape answer on a small graph: over one traverser (the store's
    batches) and over several, nested, cut short by a limit, with a branch that matches nothing,
    and a batch of guarded changes as the store writes them (a branch that fails its guard
    changes nothing)."""
    from gremlin_python.process.graph_traversal import __

    graph = EmbeddedGraph(path)
    try:
        graph.write(lambda g: [g.add_v("task").property("k", f"t{n}").property("n", n).iterate()
                               for n in range(4)])
        asked = [
            lambda g: g.V().has("k", "t0").union(__.values("n"), __.V().has("k", "t1")
                                                .values("k")).to_list(),
            lambda g: g.V().has_label("task").union(__.values("k"), __.constant("x")).to_list(),
            lambda g: g.V().has("k", "t2").union(__.union(__.values("n"), __.constant(9)),
                                                 __.V().has("k", "nobody")).to_list(),
            lambda g: g.V().has_label("task").union(__.values("k"), __.values("n"))
            .limit(3).to_list(),
        ]
        answers = [sorted(map(str, graph.read(ask))) for ask in asked]
        batch = [__.V().has("k", f"t{n}").has("n", n if n != 2 else 99).property("done", True)
                 .constant(n) for n in range(4)]
        written = graph.write(lambda g: sorted(g.V().has("k", "t0").union(*batch).to_list()))
        done = graph.read(lambda g: sorted(g.V().has("done", True).values("k").to_list()))
    finally:
        graph.close()
    return [*answers, written, done]


def test_union_branches_compiled_before_the_write_lock_answer_as_gremlites_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``runner.store.embedded.branches``: a union compiles its branches before the write's
    transaction begins (none of them compiled inside it), and every shape of union answers
    what gremlite's own way answers."""
    from gremlin_python.process.graph_traversal import __
    from gremlite import steps

    graph = EmbeddedGraph(tmp_path / "lock.db")
    try:
        graph.write(lambda g: [g.add_v("task").property("k", f"t{n}").iterate() for n in range(3)])
        con = graph._connection().con
        seeded: list[bool] = []
        chain = steps.bytecode_to_producer_chain

        def compile_(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("seed_producer") is not None:
                seeded.append(con.in_transaction)
            return chain(*args, **kwargs)

        monkeypatch.setattr(steps, "bytecode_to_producer_chain", compile_)
        branches = [__.V().has("k", f"t{n}").property("seen", True).constant(n) for n in range(3)]
        assert sorted(graph.write(lambda g: g.V().has("k", "t0").union(*branches)
                                  .to_list())) == [0, 1, 2]
        assert seeded == [False, False, False]
    finally:
        graph.close()
    monkeypatch.undo()
    early = _unions(tmp_path / "early.db")
    assert early[4] == [0, 1, 3] and early[5] == ["t0", "t1", "t3"]
    monkeypatch.setattr(steps.Union, "build", steps.Union._latchwork_own[0])
    monkeypatch.setattr(steps.Union, "follow_all_traversals", steps.Union._latchwork_own[1])
    assert _unions(tmp_path / "own.db") == early


def test_the_wal_is_checkpointed_beside_the_writers_and_stays_bounded(
        graph: EmbeddedGraph) -> None:
    """The writers' own checkpoint threshold is the safety net only (``wal_autocheckpoint``
    raised to ``WAL_AUTOCHECKPOINT`` pages): the graph's checkpointer thread copies the log
    into the database file after the commits (the file alone, read without its log, holds
    every vertex written), and restarts the log once it passes ``RESTART_AT`` bytes, so about
    three times that much written leaves a log file far below what the writers' threshold
    would let grow. Closed with the graph."""
    from runner.store.embedded.wal import RESTART_AT, WAL_AUTOCHECKPOINT

    blob = "x" * 60_000
    graph.write(lambda g: g.add_v("blob").property("data", blob).iterate())
    con = graph._connection().con
    assert con.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == WAL_AUTOCHECKPOINT
    rounds = 3 * RESTART_AT // len(blob)
    for n in range(rounds):  # each its own commit, a few ms apart, as a node's writes are
        graph.write(lambda g, n=n: g.add_v("blob").property("data", f"{n}{blob}").iterate())
        time.sleep(0.003)

    def in_the_file_alone() -> int:
        """The database file read without its log (immutable): torn while a checkpoint
        writes it, so read again until it reads whole."""
        ro = sqlite3.connect(f"file:{graph.path}?immutable=1", uri=True)
        try:
            return int(ro.execute("SELECT count(*) FROM strings WHERE v LIKE '%xxxx'")
                       .fetchone()[0])
        except sqlite3.DatabaseError:
            return -1
        finally:
            ro.close()

    assert wait_until(lambda: in_the_file_alone() == rounds + 1, 20)
    assert graph.checkpointer.checkpoints > 0 and graph.checkpointer.restarts > 0
    log_file = graph.path.parent / f"{graph.path.name}-wal"
    assert log_file.stat().st_size < 2 * RESTART_AT  # the writers' threshold: ~40 MB
    assert count(graph, "blob") == rounds + 1
    graph.close()
    assert not graph.checkpointer.alive()
