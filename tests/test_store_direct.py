"""``runner.store.embedded.direct``: a guarded write applied to gremlite's tables by SQL leaves
what the
same write, interpreted by gremlite as a traversal, leaves (real SQLite files, gremlite's own
reads); the store's claims and ends on the embedded graph go that way, and the contract suite
(``tests/test_store_contract.py``) runs every store operation over it."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from gremlin_python.process.graph_traversal import __
from gremlin_python.process.traversal import T

from runner.store.embedded import direct
from runner.store.embedded.graph import EmbeddedGraph
from runner.store.gremlin.batch import write_plans
from runner.store.gremlin.guards import Write, finder, set_on


def _writes() -> list[Write]:
    """A batch of every shape: guards of one and of several pairs, values of every plain kind
    (a string never written, an int, a bool, None, a key new to the vertex), a vertex and its
    edge, a guard that matches nothing (the batch's others still written), a guard that sees
    an earlier write of the same batch, one that matches two vertices and a float (both
    written as their traversal), a value no vertex ever had."""
    out = []
    w = Write()
    t0 = w.guard(finder(("k", "t0"), ("v", 1), ("fence", "0")))
    w.change(set_on(t0, {"v": 2, "state": "never-seen-before", "flag": True, "n": None,
                         "extra": 5}))
    w.change(lambda t: (t.add_v("attempt").property("aid", "a0").property("status", "RUNNING")
                        .as_("new").add_e("has_attempt").from_(t0).to("new")),
             ("add", "attempt", {"aid": "a0", "status": "RUNNING"}, "has_attempt", t0))
    out.append(w)
    w = Write()
    w.change(set_on(w.guard(finder(("k", "t1"), ("v", 99))), {"state": "moved"}))
    out.append(w)
    w = Write()
    first = w.guard(finder(("k", "t0"), ("v", 2)))  # only after the first write of the batch
    second = w.guard(finder(("k", "t2")))
    w.change(set_on(second, {"state": "b", "v": 7}))
    w.change(set_on(first, {"state": "c"}))
    out.append(w)
    w = Write()
    w.change(set_on(w.guard(finder(("dup", "x"))), {"seen": True}))
    out.append(w)
    w = Write()
    w.change(set_on(w.guard(finder(("k", "t3"))), {"f": 2.5}))
    out.append(w)
    w = Write()
    w.change(set_on(w.guard(finder(("k", "nobody-ever"))), {"state": "x"}))
    out.append(w)
    return out


def _written(path: Path) -> tuple[set[int], list[Any], list[Any], list[Any]]:
    graph = EmbeddedGraph(path)
    try:
        graph.write(lambda g: [g.add_v("task").property("k", f"t{n}").property("v", 1)
                               .property("fence", "0").property("state", "a").iterate()
                               for n in range(4)])
        graph.write(lambda g: [g.add_v("other").property("dup", "x").property("n", n).iterate()
                               for n in range(2)])
        done = write_plans(graph.direct, _writes())
        maps = graph.read(lambda g: g.V().element_map().to_list())
        edges = graph.read(lambda g: g.E().project("l", "o", "i").by(__.label())
                           .by(__.out_v().values("k")).by(__.in_v().values("aid")).to_list())
        found = [graph.read(lambda g, k=k, v=v: sorted(
                     g.V().has(k, v).values("k", "n", "aid").to_list(), key=str))
                 for k, v in (("state", "a"), ("state", "c"), ("state", "b"), ("v", 2),
                              ("v", 7), ("flag", True), ("seen", True), ("f", 2.5),
                              ("state", "never-seen-before"), ("state", "moved"),
                              ("extra", 5), ("status", "RUNNING"))]
    finally:
        graph.close()
    rows = sorted((sorted((str(k), str(v)) for k, v in m.items() if k is not T.id)
                   for m in maps), key=str)
    return done, rows, sorted(map(str, edges)), found


def test_a_write_applied_by_sql_leaves_what_gremlites_traversal_leaves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[bool | None] = []
    apply = direct.apply

    def counted(con: Any, plan: Any) -> bool | None:
        answers.append(apply(con, plan))
        return answers[-1]

    monkeypatch.setattr(direct, "apply", counted)
    by_sql = _written(tmp_path / "sql.db")
    # the ambiguous guard and the float went as their traversal, the others by SQL
    assert answers == [True, False, True, None, None, False]
    monkeypatch.setattr(direct, "apply", lambda con, plan: None)  # every write a traversal
    by_traversal = _written(tmp_path / "traversal.db")
    assert by_sql == by_traversal
    done, _, edges, found = by_sql
    assert done == {0, 2, 3, 4}
    assert edges == [str({"l": "has_attempt", "o": "t0", "i": "a0"})]
    assert found[0] == ["t1", "t3"] and found[1] == ["t0"] and found[2] == ["t2"]
    assert found[6] == [0, 1] and found[9] == []  # both duplicates; the missed guard wrote none


def test_a_write_whose_guards_fail_changes_nothing_and_adds_no_string(tmp_path: Path) -> None:
    """Guards are all read before the first change: a write whose last guard fails leaves
    the vertex its first guard matched, and the strings, as they were."""
    graph = EmbeddedGraph(tmp_path / "g.db")
    try:
        graph.write(lambda g: g.add_v("task").property("k", "t0").property("v", 1).iterate())
        con = graph._connection().con
        strings = con.execute("SELECT count(*) FROM strings").fetchone()[0]
        w = Write()
        t0 = w.guard(finder(("k", "t0")))
        w.guard(finder(("k", "t0"), ("v", 2)))
        w.change(set_on(t0, {"state": "a string never written"}))
        assert write_plans(graph.direct, [w]) == set()
        assert graph.read(lambda g: g.V().has("k", "t0").values("state").to_list()) == []
        assert con.execute("SELECT count(*) FROM strings").fetchone()[0] == strings
    finally:
        graph.close()


def test_the_store_claims_and_ends_on_the_embedded_graph_by_sql(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    """A claim and an end of tasks, one and several at a time, go by SQL (no traversal of
    theirs interpreted), and read back RUNNING then SUCCEEDED with their attempts."""
    from runner.store import AttemptStatus, Conclusion, Task, TaskStatus, open_store

    store = open_store(str(tmp_path / "s.db"))
    try:
        tasks = [store.tasks.create("diag.sleep", {"n": n}) for n in range(3)]
        answers: list[bool | None] = []
        apply = direct.apply
        monkeypatch.setattr(direct, "apply",
                            lambda con, plan: answers.append(apply(con, plan)) or answers[-1])
        task, attempt = store.claim(tasks[0], 5, "m1")
        claimed = store.claim_many([(t, 6) for t in tasks[1:]], "m2")
        assert answers == [True, True, True]
        ends = [Conclusion.of(a, AttemptStatus.SUCCEEDED, t,
                              {"status": TaskStatus.WAITING, "finished": True})
                for t, a in [(task, attempt), *claimed]]  # type: ignore[misc]
        assert all(isinstance(t, Task) for t in store.conclude_many(ends))
        assert answers == [True] * 6
        for t in tasks:
            now = store.tasks.get(t.id)
            assert now.finished and now.status is TaskStatus.WAITING and now.attempts == 1
            (only,) = store.attempts.for_task(t.id)
            assert only.status is AttemptStatus.SUCCEEDED
    finally:
        store.close()


class _Traversals:
    """The embedded graph seen as a graph without SQL: its reads go as traversals."""

    within_indexed = True

    def __init__(self, graph: Any) -> None:
        self.read = graph.read


def test_reads_by_sql_find_what_gremlites_traversals_find(tmp_path: Path) -> None:
    """A page of a lane's ready tasks (every shard and a member's own, a limit below what
    waits, seconds no task has) and a lane's ready seconds, by SQL and as traversals, on one
    graph; and a row of every kind of value decoded as ``element_map`` decodes it."""
    from runner.store import due, open_store
    from runner.store.gremlin import ready

    store = open_store(str(tmp_path / "r.db"))
    try:
        graph = store.graph
        made = [store.tasks.create("t", {"n": n}, priority=n % 3) for n in range(40)]
        start = min(t.created_at for t in made)
        seconds = due.seconds_from(start - timedelta(seconds=5), 120)
        plain = _Traversals(graph)
        for lane in {due.lane_of(t.priority) for t in made}:
            for limit, shards in ((100, None), (5, None), (100, due.shards_of(0, 3))):
                by_sql = ready.ready_page(graph, lane, seconds, limit, shards)
                by_traversal = ready.ready_page(plain, lane, seconds, limit, shards)  # type: ignore[arg-type]
                # what waits in the lane (and the shards): random ids leave a member's shards
                # a lane's task now and then, so the count is computed, not assumed above 0
                waiting = [t for t in made if due.lane_of(t.priority) == lane and
                           (shards is None or due.shard_of(t.id) in shards)]
                assert len(by_sql) == len(by_traversal) == min(limit, len(waiting))
                assert shards is not None or len(by_sql) > 0
                if limit == 100:
                    assert sorted(t.id for t in by_sql) == sorted(t.id for t in by_traversal)
                    assert sorted(by_sql, key=lambda t: t.id) == \
                        sorted(by_traversal, key=lambda t: t.id)
            assert ready.ready_page(graph, lane, ["19990101000000"], 10) == []
            assert ready.lane_seconds(graph, lane) == \
                ready.lane_seconds(plain, lane)  # type: ignore[arg-type]
            assert ready.lane_seconds(graph, lane)
        graph.write(lambda g: g.add_v("x").property("k", "row").property("i", -7)
                    .property("b", False).property("z", None).property("f", 2.5)
                    .property("s", "text").iterate())
        keys = ["k", "i", "b", "z", "f", "s", "missing"]
        (vertex,) = graph.read(lambda g: g.V().has("k", "row").id_().to_list())
        (by_sql,) = graph.sql(lambda con, g: direct.rows(con, [vertex], keys))
        (mapped,) = graph.read(lambda g: g.V().has("k", "row").element_map(*keys).to_list())
        assert by_sql == {k: v for k, v in mapped.items() if isinstance(k, str)}
        assert by_sql["i"] == -7 and by_sql["b"] is False and by_sql["f"] == 2.5
    finally:
        store.close()


def test_a_task_written_claimed_by_sql_is_what_its_traversal_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``create_claimed`` and ``create_claimed_again`` (a submit that starts at once) write
    the task vertex, its RUNNING attempt and their edge by SQL: the same properties, read back
    the same, as the traversal they replace writes; a second sending of the same id writes
    nothing, either way."""
    from runner.store import AttemptStatus, TaskStatus, open_store

    store = open_store(str(tmp_path / "s.db"))
    answers: list[bool | None] = []
    apply = direct.apply

    def vertices() -> int:
        return int(store.graph.read(lambda g: g.V().count().next()))

    def raw(task_id: str) -> tuple[list[Any], list[Any], list[Any]]:
        def run(g: Any) -> Any:
            t = g.V().has("task_id", task_id)
            return (t.element_map().to_list(),
                    g.V().has("task_id", task_id).out("has_attempt").element_map().to_list(),
                    g.V().has("task_id", task_id).out_e().label().to_list())
        task_map, attempt_maps, edges = store.graph.read(run)

        def shape(m: dict[Any, Any]) -> list[tuple[str, str]]:  # each key and its value's type
            return sorted((str(k), type(v).__name__) for k, v in m.items() if k is not T.id)
        return shape(task_map[0]), [shape(m) for m in attempt_maps], edges

    try:
        by: dict[str, list[Any]] = {}
        for way, fake in (("sql", None), ("traversal", lambda con, plan: None)):
            monkeypatch.setattr(direct, "apply", fake or (
                lambda con, plan: answers.append(apply(con, plan)) or answers[-1]))
            first = store.tasks.new("diag.sleep", {"n": 1})
            second = store.tasks.new("diag.sleep", {"n": 2})
            claimed, attempt = store.create_claimed(first, 7, "m1")
            made = store.create_claimed_again(second, 8, "m2")
            assert made is not None
            count = vertices()
            assert store.create_claimed_again(second, 9, "m3") is None  # its id is taken
            assert vertices() == count
            for task, token, member in ((first, 7, "m1"), (second, 8, "m2")):
                now = store.tasks.get(task.id)
                assert now.status is TaskStatus.RUNNING and now.owner == member
                assert now.fence == token and now.attempts == 1
                (only,) = store.attempts.for_task(task.id)
                assert only.status is AttemptStatus.RUNNING and only.executor == member
                assert only.fence == token
            by[way] = [raw(first.id), raw(second.id), store.tasks.get(first.id).version]
            assert claimed.version == by[way][2] and attempt.task_id == first.id
        assert answers == [True, True, False]  # the third: the id found, nothing written
        assert by["sql"] == by["traversal"]
        assert by["sql"][0][2] == ["has_attempt"]
    finally:
        store.close()


def test_tasks_added_by_sql_are_what_their_traversal_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``tasks.add`` and ``add_many`` (a submit that waits, a bulk page) write new task vertices
    by SQL: the same properties as their traversal writes, and the task each answers is the one
    read back; a uniqueness key or a redelivered id that a task has already answers that task
    and writes nothing, either way (a page holding a key twice included)."""
    from datetime import UTC, datetime

    from runner.store import TaskStatus, open_store

    answers: list[bool | None] = []
    apply = direct.apply
    by: dict[str, list[Any]] = {}
    for way, fake in (("sql", None), ("traversal", lambda con, plan: None)):
        monkeypatch.setattr(direct, "apply", fake or (
            lambda con, plan: answers.append(apply(con, plan)) or answers[-1]))
        store = open_store(str(tmp_path / f"{way}.db"))
        try:
            def vertices(store: Any = store) -> int:
                return int(store.graph.read(lambda g: g.V().count().next()))

            tasks = store.tasks
            later = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
            plain = tasks.add(tasks.new("diag.sleep", {"n": 1, "s": "é"}, priority=3))
            shaped = tasks.add(tasks.new("diag.sleep", {}, run_at=later, ordering_key="o",
                                         resources=("b", "a"), unique_key="k1"))
            timed = tasks.add(tasks.new("diag.sleep", timeout=2.5))
            count = vertices()
            again = tasks.add(tasks.new("diag.fail", unique_key="k1"))
            assert again.id == shaped.id and vertices() == count  # the key's task, nothing new
            page = [tasks.new("diag.sleep", {"n": n}, unique_key="k2" if n < 2 else None)
                    for n in range(3)]
            first, twin, third = tasks.add_many(page)
            assert twin.id == first.id and third.id == page[2].id  # the key twice in one page
            redelivered = tasks.add_many([page[2], tasks.new("diag.sleep")], again=True)
            assert redelivered[0].id == page[2].id
            for task in (plain, shaped, timed, first, third, *redelivered):
                assert task == tasks.get(task.id), task.id
                assert task.status is TaskStatus.WAITING
            assert vertices() == count + 3
            by[way] = [sorted((str(k), type(v).__name__) for k, v in row.items()
                              if k is not T.id)
                       for row in store.graph.read(lambda g: g.V().has_label("task")
                                                   .element_map().to_list())]
        finally:
            store.close()
    assert answers == [True, True, True, False, True, False, True, False, True], answers
    assert sorted(by["sql"]) == sorted(by["traversal"])
