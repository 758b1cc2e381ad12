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
  embedded file, with the store's replace of a property in place (:mod:`runner.store.replace`,
  which every node uses) instead of gremlite's own: the engine as latchwork runs it, the same
  traversals.
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


def graph_writes(where: str, batch: int, tasks: int = 2000, lean: bool = False,
                 server_pid: int | None = None) -> dict[str, float]:
    """Claim and end ``tasks`` tasks, ``batch`` per traversal, on the gremlite file or the
    Gremlin Server at ``where`` (see the module); ``server_pid``: the Gremlin Server's process,
    whose CPU per task is given too (``server_cpu_ms_per_task``)."""
    if where.startswith("ws://"):
        return _graph_writes(where, batch, tasks, server_pid)
    from gremlite import results  # type: ignore[import-untyped]

    from runner.store.replace import lean_replace

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
