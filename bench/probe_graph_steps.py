"""What each part of a claim costs a Gremlin Server: the floor's batched claim
(bench/_floors.py) written whole and with parts taken away, the Gremlin Server's CPU per task.

Each variant is one ``union`` traversal of ``--batch`` branches standing on its first task's
vertex, as the runner writes its batches, sent with the driver alone and with the strategies
the store skips (``runner.store.server.graph.SKIPPED_STRATEGIES``) skipped too, so that the server
does what it does for the nodes:

* ``claim``: the floor's claim (the task's version and fence guarded, four properties set, an
  attempt vertex with three properties, an edge from the task to it, through step labels);
* ``claim_edge_no_labels``: the same, the edge added to an ``add_v`` child traversal (no labels);
* ``claim_no_edge``: the attempt vertex without its edge;
* ``props``: the guarded task's four properties only;
* ``lookup``: each branch finds its task by its indexed id, and writes nothing.

Prints each variant's server CPU per task, ``--rounds`` rounds interleaved (the figures drift
between hours: compare within a run). The server's CPU is read from ``/proc`` (10 ms ticks:
a round of 1,024 tasks uses a few hundred of them).

Usage: ``python bench/probe_graph_steps.py [--batch 16] [--tasks 1024] [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gremlin_python.driver.driver_remote_connection import DriverRemoteConnection
from gremlin_python.process.anonymous_traversal import traversal
from gremlin_python.process.graph_traversal import __
from gremlin_python.process.traversal import Cardinality

from bench import _floors, _profile
from runner.store.server.graph import SKIPPED_STRATEGIES
from runner.testing.gremlinserver import GremlinServer

SINGLE = Cardinality.single
Branches = Callable[[list[str], int], list[Any]]


def _guarded(task_id: str, token: int) -> Any:
    state = json.dumps({"status": "RUNNING", "owner": "probe", "attempts": 1})
    return (__.V().has("task_id", task_id).has("task_version", 0).has("task_fence", "0" * 20)
            .property(SINGLE, "task_state", state).property(SINGLE, "task_version", 1)
            .property(SINGLE, "task_fence", f"{token:020d}")
            .property(SINGLE, "task_queue", "running"))


def _attempt(task_id: str) -> Any:
    return (__.add_v("attempt").property("attempt_id", f"{task_id}-a")
            .property("attempt_status", "RUNNING")
            .property("attempt_start", json.dumps({"task": task_id, "seq": 1})))


def claim(tasks: list[str], token: int) -> list[Any]:
    return _floors._claims(tasks, token)


def claim_edge_no_labels(tasks: list[str], token: int) -> list[Any]:
    return [_guarded(t, token).add_e("has_attempt").to(_attempt(t)).constant(n)
            for n, t in enumerate(tasks)]


def claim_no_edge(tasks: list[str], token: int) -> list[Any]:
    return [_guarded(t, token).add_v("attempt").property("attempt_id", f"{t}-a")
            .property("attempt_status", "RUNNING")
            .property("attempt_start", json.dumps({"task": t, "seq": 1})).constant(n)
            for n, t in enumerate(tasks)]


def props(tasks: list[str], token: int) -> list[Any]:
    return [_guarded(t, token).constant(n) for n, t in enumerate(tasks)]


def lookup(tasks: list[str], token: int) -> list[Any]:
    return [__.V().has("task_id", t).constant(n) for n, t in enumerate(tasks)]


VARIANTS: list[Branches] = [claim, claim_edge_no_labels, claim_no_edge, props, lookup]


def server_ms_per_task(url: str, pid: int, branches: Branches, batch: int, tasks: int) -> float:
    """Make ``tasks`` tasks, then write them ``batch`` per traversal with ``branches``: the
    server's CPU per task of the writes alone."""
    remote = DriverRemoteConnection(url, "g")
    try:
        g = traversal().with_remote(remote).without_strategies(*SKIPPED_STRATEGIES)
        ids = _floors._make_tasks(g, tasks, lambda fn: fn())
        before = _profile.cpu_seconds(pid)
        for first in range(0, tasks, batch):
            chunk = ids[first:first + batch]
            written = g.V().has("task_id", chunk[0]).union(*branches(chunk, 7)).to_list()
            if len(written) != len(chunk):
                raise RuntimeError(f"{branches.__name__} wrote {len(written)} of {len(chunk)}")
        return (_profile.cpu_seconds(pid) - before) * 1000 / tasks
    finally:
        remote.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tasks", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        server = GremlinServer(Path(scratch) / "gremlin-server", heap="2g", tuned=True)
        server.start()
        try:
            if server.record is None:
                raise RuntimeError("the Gremlin Server's process is not known")
            pid = server.record.pid
            for variant in VARIANTS:  # warm: the server's JIT is cold
                server_ms_per_task(server.url, pid, variant, args.batch, args.tasks)
            print(f"Gremlin Server CPU per task, ms, {args.batch} tasks per traversal")
            for n in range(args.rounds):
                costs = [server_ms_per_task(server.url, pid, v, args.batch, args.tasks)
                         for v in VARIANTS]
                print(f"round {n + 1}: " + ", ".join(
                    f"{v.__name__} {ms:.3f}" for v, ms in zip(VARIANTS, costs, strict=True)),
                    flush=True)
        finally:
            server.kill()


if __name__ == "__main__":
    main()
