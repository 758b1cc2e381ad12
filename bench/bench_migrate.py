"""The store migration on 100,000 tasks (issue 42: how long an upgrade takes), on both graphs,
one run.

Per backend (gremlite file; the Gremlin Server, TinkerPop 3.5.1 on TinkerGraph, one traversal
at a time, on loopback): a format-0 graph of ``--tasks`` tasks with one attempt each is written
with plain traversals (``runner.testing.formats``), then ``latchwork store migrate``'s steps
run on it in-process (``runner.store.migrations.migrate``, pages of ``--page`` tasks). Printed:
the time to write the format-0 graph (the baseline: the same backend writing about as many
properties), the migration's time and tasks/s, and their ratio.

Usage: ``python bench/bench_migrate.py [--tasks 100000] [--page 500] [--only embedded|server]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runner.store import migrations, open_graph, store_on
from runner.store.server.graph import SERIAL, RemoteGraph
from runner.testing.formats import write_format_0
from runner.testing.gremlinserver import GremlinServer

#: the steps that add a property to every task (their marker), by version; the others rewrite
#: nothing
MARKERS = {version: step.marker for version, (step, _) in migrations.STEPS.items()
           if isinstance(step, migrations.TaskBackfill)}


def expected(version: int, tasks: int) -> int:
    """What step ``version`` changes on ``write_format_0``'s ``tasks``: every task for a step
    that adds a property; for step 5 the finished and stopped ones (every third, every fifth),
    whose list word it rewrites; none for the others."""
    if version in MARKERS:
        return tasks
    if version == 5:
        return sum(1 for i in range(tasks) if i % 3 == 0 or i % 5 == 0)
    return 0


def measure(name: str, graph: object, tasks: int, page: int) -> tuple[float, float]:
    store = store_on(graph, check_format=False)  # type: ignore[arg-type]
    began = time.monotonic()
    write_format_0(store.graph, tasks)
    built = time.monotonic() - began
    began = time.monotonic()
    reports = migrations.migrate(store.graph, name, page=page)
    took = time.monotonic() - began
    assert [r.version for r in reports] == list(range(1, migrations.CURRENT + 1)), reports
    for report in reports:  # every step that adds a property changes every task
        assert report.changed == expected(report.version, tasks), report
    for marker in MARKERS.values():
        marked = store.graph.read(lambda g, m=marker: g.V().has(m).count().next())
        assert marked == tasks, (marker, marked)
    store_on(store.graph)  # opens: the format is the current one
    steps = ", ".join(f"step {r.version} {r.seconds:.1f}s" for r in reports)
    print(f"{name}: format 0 written in {built:.1f}s; migrated {tasks} tasks to format "
          f"{migrations.CURRENT} in {took:.1f}s ({steps}; {tasks / took:,.0f} tasks/s); "
          f"migrate / write = {took / built:.2f}", flush=True)
    return built, took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--page", type=int, default=500)
    parser.add_argument("--only", choices=["embedded", "server"], default=None)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        if args.only in (None, "embedded"):
            graph = open_graph(str(Path(scratch) / "graph.db"))
            try:
                results["embedded"] = measure("embedded", graph, args.tasks, args.page)
            finally:
                graph.close()
        if args.only in (None, "server"):
            server = GremlinServer(Path(scratch) / "gremlin-server", heap="4g")
            server.start()
            try:
                remote = RemoteGraph(server.url, atomicity=SERIAL, timeout=120)
                try:
                    results["server"] = measure("server", remote, args.tasks, args.page)
                finally:
                    remote.close()
            finally:
                server.stop()
    print("migration of", f"{args.tasks:,}", "tasks:", "; ".join(
        f"{name} {took:.1f}s ({took / built:.2f}x the time to write them)"
        for name, (built, took) in results.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
