"""The floors the runner is measured against (bench/bench_runner.py): raw probes of the servers
it uses, written with the drivers alone (kazoo, gremlinpython, gremlite), no latchwork code.

* :func:`zk_multi`: a task lock's ZooKeeper work for ``batch`` tasks per transaction: create
  each task's lock parent and an ephemeral sequential node under it (and a stamp's set_data, as
  the runner does to read the tokens), then delete both, ``batch`` tasks per ``multi()``, a few
  transactions in flight at once; tasks/s and ZooKeeper CPU per task.
* :func:`graph_writes`: a task's two store writes for ``batch`` tasks per traversal: the claims
  (each task's version and fence guarded, moved to RUNNING, an attempt vertex and its edge
  added) and the ends (the attempt RUNNING guarded and ended, the task finished), each batch one
  ``union`` traversal standing on its first task's vertex, as the runner writes them; on the
  embedded file inside ``BEGIN IMMEDIATE`` ... ``COMMIT``, on a Gremlin Server one request;
  tasks/s and this process's CPU per task (and the server's, given its pid). ``lean``: on the
  embedded file, with the store's replace of a property in place
  (:mod:`runner.store.embedded.replace`,
  which every node uses) instead of gremlite's own: the engine as latchwork runs it, the same
  traversals.
* :func:`sql_writes`: the same claims and ends on the embedded file, not as traversals but as
  the SQL statements they come to on gremlite's tables (a guard's lookup, a property's update
  in place, an attempt vertex, its properties and edge), written by hand here: SQLite's floor
  for the writes, which the embedded graph's nodes apply that way too (:mod:`runner.store.
  direct`), so it is the floor their drain is measured against.
"""

from __future__ import annotations

import json
import resource
import sqlite3
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gremlin_python.process.anonymous_traversal import traversal
from gremlin_python.process.graph_traversal import __
from gremlin_python.process.traversal import Cardinality
from kazoo.client import KazooClient

from bench import _profile


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def zk_multi(hosts: str, zk_pid: int, batch: int, tasks: int = 6000,
             in_flight: int = 4) -> dict[str, float]:
    """Lock and release ``tasks`` task locks, ``batch`` per transaction (see the module)."""
    client = KazooClient(hosts=hosts)
    client.start()
    try:
        client.ensure_path("/floor/locks")
        stamp = f"/floor/stamp-{uuid.uuid4().hex}"
        client.create(stamp, b"", ephemeral=True)
        cpu = _profile.cpu_seconds(zk_pid, descendants=False)
        began = time.perf_counter()
        pending: list[Any] = []
        for first in range(0, tasks, batch):
            tx = client.transaction()
            names = [f"/floor/locks/{uuid.uuid4().hex}" for _ in range(min(batch, tasks - first))]
            for name in names:
                tx.create(name, b"")
                tx.create(f"{name}/lock-", b"member", ephemeral=True, sequence=True)
            tx.set_data(stamp, b"")
            pending.append((names, tx.commit_async()))
            if len(pending) >= in_flight:
                _release(client, *pending.pop(0))
        for names, answer in pending:
            _release(client, names, answer)
        took = time.perf_counter() - began
        used = _profile.cpu_seconds(zk_pid, descendants=False) - cpu
    finally:
        client.stop()
        client.close()
    return {"tasks_per_s": tasks / took, "zk_cpu_ms_per_task": used * 1000 / tasks}


def _release(client: KazooClient, names: list[str], answer: Any) -> None:
    results = answer.get()
    tx = client.transaction()
    for name, node in zip(names, results[1::2], strict=False):
        tx.delete(node)
        tx.delete(name)
    tx.commit()


def _claims(tasks: list[str], token: int) -> list[Any]:
    branches = []
    for n, task_id in enumerate(tasks):
        state = json.dumps({"status": "RUNNING", "owner": "floor", "attempts": 1})
        branches.append(
            __.V().has("task_id", task_id).has("task_version", 0)
            .has("task_fence", "0" * 20).as_("t")
            .property(Cardinality.single, "task_state", state)
            .property(Cardinality.single, "task_version", 1)
            .property(Cardinality.single, "task_fence", f"{token:020d}")
            .property(Cardinality.single, "task_queue", "running")
            .add_v("attempt").property("attempt_id", f"{task_id}-a")
            .property("attempt_status", "RUNNING")
            .property("attempt_start", json.dumps({"task": task_id, "seq": 1}))
            .as_("a").add_e("has_attempt").from_("t").to("a").constant(n))
    return branches


def _ends(tasks: list[str], token: int) -> list[Any]:
    branches = []
    for n, task_id in enumerate(tasks):
        state = json.dumps({"status": "WAITING", "finished": True, "attempts": 1})
        branches.append(
            __.V().has("attempt_id", f"{task_id}-a").has("attempt_status", "RUNNING").as_("a")
            .V().has("task_id", task_id).has("task_version", 1)
            .has("task_fence", f"{token:020d}").as_("t")
            .select("a").property(Cardinality.single, "attempt_status", "SUCCEEDED")
            .property(Cardinality.single, "attempt_end", json.dumps({"duration_ms": 1}))
            .select("t").property(Cardinality.single, "task_state", state)
            .property(Cardinality.single, "task_version", 2)
            .property(Cardinality.single, "task_queue", "closed").constant(n))
    return branches


def _make_tasks(g: Any, count: int, write: Callable[[Callable[[], Any]], Any]) -> list[str]:
    ids = [str(uuid.uuid4()) for _ in range(count)]
    for first in range(0, count, 40):
        chunk = ids[first:first + 40]

        def make(chunk: list[str] = chunk) -> None:
            for task_id in chunk:
                g.add_v("task").property("task_id", task_id).property("task_version", 0) \
                    .property("task_fence", "0" * 20).property("task_queue", "open").iterate()
        write(make)
    return ids


class _Sql:
    """The statements a claim and an end come to on gremlite's tables (see the module): the
    property names' ids kept, every value's string looked up (and added) by a query."""

    MIN_INT = -2**62

    def __init__(self, con: sqlite3.Connection) -> None:
        self.con = con
        self.names: dict[str, int] = {}

    def string(self, value: str) -> int:
        row = self.con.execute("SELECT id FROM strings WHERE v = ?", [value]).fetchone()
        if row is not None:
            return int(row[0])
        return int(self.con.execute("INSERT INTO strings (v) VALUES (?) RETURNING id",
                                    [value]).fetchone()[0])

    def name(self, key: str) -> int:
        if key not in self.names:
            self.names[key] = self.string(key)
        return self.names[key]

    def code(self, value: Any) -> int:
        return value + self.MIN_INT if isinstance(value, int) else self.string(value)

    def element(self) -> int:
        return int(self.con.execute("INSERT INTO graphelts VALUES (NULL) RETURNING id")
                   .fetchone()[0])

    def find(self, *pairs: tuple[str, Any]) -> int | None:
        codes = [c for k, v in pairs for c in (self.name(k), self.code(v))]
        joins = "".join(f" JOIN quads q{n} ON q{n}.s = q0.s AND q{n}.p = ? AND q{n}.o = ?"
                        for n in range(1, len(pairs)))
        row = self.con.execute(f"SELECT q0.s FROM quads q0{joins} WHERE q0.p = ? AND q0.o = ?"
                               f" AND +q0.g > 0", [*codes[2:], *codes[:2]]).fetchone()
        return None if row is None else int(row[0])

    def put(self, vertex: int, **props: Any) -> None:
        for key, value in props.items():
            cur = self.con.execute("UPDATE quads SET o = ? WHERE s = ? AND p = ? AND +g > 0",
                                   [self.code(value), vertex, self.name(key)])
            if cur.rowcount == 0:
                self.con.execute("INSERT INTO quads VALUES (?, ?, ?, ?)",
                                 [vertex, self.name(key), self.code(value), self.element()])

    def add(self, label: str, **props: Any) -> int:
        vertex = self.element()
        self.con.execute("INSERT INTO quads VALUES (?, 0, ?, 0)", [vertex, self.string(label)])
        for key, value in props.items():
            self.con.execute("INSERT INTO quads VALUES (?, ?, ?, ?)",
                             [vertex, self.name(key), self.code(value), self.element()])
        return vertex

    def edge(self, source: int, label: str, target: int) -> None:
        self.con.execute("INSERT INTO quads VALUES (?, ?, ?, ?)",
                         [source, -self.string(label), target, -self.element()])

    def claim(self, task_id: str, token: int) -> bool:
        task = self.find(("task_id", task_id), ("task_version", 0), ("task_fence", "0" * 20))
        if task is None:
            return False
        self.put(task, task_state=json.dumps({"status": "RUNNING", "owner": "floor",
                                              "attempts": 1}),
                 task_version=1, task_fence=f"{token:020d}", task_queue="running")
        attempt = self.add("attempt", attempt_id=f"{task_id}-a", attempt_status="RUNNING",
                           attempt_start=json.dumps({"task": task_id, "seq": 1}))
        self.edge(task, "has_attempt", attempt)
        return True

    def end(self, task_id: str, token: int) -> bool:
        attempt = self.find(("attempt_id", f"{task_id}-a"), ("attempt_status", "RUNNING"))
        task = self.find(("task_id", task_id), ("task_version", 1),
                         ("task_fence", f"{token:020d}"))
        if attempt is None or task is None:
            return False
        self.put(attempt, attempt_status="SUCCEEDED",
                 attempt_end=json.dumps({"duration_ms": 1}))
        self.put(task, task_state=json.dumps({"status": "WAITING", "finished": True,
                                              "attempts": 1}),
                 task_version=2, task_queue="closed")
        return True


def sql_writes(where: str, batch: int, tasks: int = 2000) -> dict[str, float]:
    """:func:`graph_writes`' claims and ends of ``tasks`` tasks, ``batch`` per transaction, as
    SQL on the gremlite file at ``where`` (see the module)."""
    from gremlite import SQLiteConnection  # type: ignore[import-untyped]
    remote = SQLiteConnection(Path(where), isolation_level=None, timeout=30)
    con = remote.con
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")

    def write(fn: Callable[[], Any]) -> Any:
        con.execute("BEGIN IMMEDIATE")
        try:
            out = fn()
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")
        return out
    try:
        ids = _make_tasks(traversal().with_remote(remote), tasks, write)
        sql = _Sql(con)
        cpu, began = _cpu(), time.perf_counter()
        for first in range(0, tasks, batch):
            chunk = ids[first:first + batch]
            claimed = write(lambda c=chunk: sum(sql.claim(t, 7) for t in c))
            ended = write(lambda c=chunk: sum(sql.end(t, 7) for t in c))
            if claimed != len(chunk) or ended != len(chunk):
                raise RuntimeError(f"floor batch wrote {claimed}/{ended} of {len(chunk)}")
        took = time.perf_counter() - began
        used = _cpu() - cpu
    finally:
        remote.close()
    return {"tasks_per_s": tasks / took, "client_cpu_ms_per_task": used * 1000 / tasks}


def graph_writes(where: str, batch: int, tasks: int = 2000, lean: bool = False,
                 server_pid: int | None = None) -> dict[str, float]:
    """Claim and end ``tasks`` tasks, ``batch`` per traversal, on the gremlite file or the
    Gremlin Server at ``where`` (see the module); ``server_pid``: the Gremlin Server's process,
    whose CPU per task is given too (``server_cpu_ms_per_task``)."""
    if where.startswith("ws://"):
        return _graph_writes(where, batch, tasks, server_pid)
    from gremlite import results  # type: ignore[import-untyped]

    from runner.store.embedded.replace import lean_replace

    lean_replace()  # installed in this process either way: set each run's own
    kept = results.Result.set_property
    results.Result.set_property = kept if lean else results.Result._latchwork_own
    try:
        return _graph_writes(where, batch, tasks)
    finally:
        results.Result.set_property = kept


def _graph_writes(where: str, batch: int, tasks: int, server_pid: int | None = None
                  ) -> dict[str, float]:
    if where.startswith("ws://"):
        from gremlin_python.driver.driver_remote_connection import DriverRemoteConnection
        remote: Any = DriverRemoteConnection(where, "g")
        g = traversal().with_remote(remote)

        def write(fn: Callable[[], Any]) -> Any:
            return fn()
    else:
        from gremlite import SQLiteConnection  # type: ignore[import-untyped]
        remote = SQLiteConnection(Path(where), isolation_level=None, timeout=30)
        remote.con.execute("PRAGMA journal_mode=WAL")
        remote.con.execute("PRAGMA synchronous=NORMAL")
        g = traversal().with_remote(remote)

        def write(fn: Callable[[], Any]) -> Any:
            remote.con.execute("BEGIN IMMEDIATE")
            try:
                out = fn()
            except BaseException:
                remote.con.execute("ROLLBACK")
                raise
            remote.con.execute("COMMIT")
            return out
    try:
        ids = _make_tasks(g, tasks, write)
        server = _profile.cpu_seconds(server_pid) if server_pid else 0.0
        cpu, began = _cpu(), time.perf_counter()
        token = 7
        for first in range(0, tasks, batch):
            chunk = ids[first:first + batch]
            # each batch stands on its first task's vertex, found by its indexed id, as the
            # runner's batches do (an unindexed anchor is a scan of every vertex on a server)
            claimed = write(lambda c=chunk: g.V().has("task_id", c[0])
                            .union(*_claims(c, token)).to_list())
            ended = write(lambda c=chunk: g.V().has("task_id", c[0])
                          .union(*_ends(c, token)).to_list())
            if len(claimed) != len(chunk) or len(ended) != len(chunk):
                raise RuntimeError(f"floor batch wrote {len(claimed)}/{len(ended)} of "
                                   f"{len(chunk)}")
        took = time.perf_counter() - began
        used = _cpu() - cpu
        server = _profile.cpu_seconds(server_pid) - server if server_pid else 0.0
    finally:
        try:
            remote.close()
        except (OSError, sqlite3.Error):
            pass
    out = {"tasks_per_s": tasks / took, "client_cpu_ms_per_task": used * 1000 / tasks}
    if server_pid:
        out["server_cpu_ms_per_task"] = server * 1000 / tasks
    return out
