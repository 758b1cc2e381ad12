"""What each part of the task loop's store work costs, one part at a time, with nothing else
running: a profile to find where the CPU of a drain goes and to compare two trees, not a
target.

On a fresh graph (a Gremlin Server started here, one traversal at a time, or an embedded
file), one client (the code of ``--tree``: this checkout by default, or a worktree of another
commit) writes ``--tasks`` ``diag.sleep 0`` tasks with ``add_many`` (pages of 500), reads
ready pages of 64 rows (``ready_page``, the listing's read; one per ``--page-every`` tasks, as
a drain of 5,000 on 3 nodes reads them), claims the tasks ``--batch`` at a time
(``claim_many``, each with its fencing token) and ends them ``--batch`` at a time
(``conclude_many``), ``--rounds`` times on a cleared graph. For each part it prints the median
over the rounds of the CPU per task of the graph server (``/proc``) and of the client, and
the wall time per task. No nodes, ZooKeeper or broker run beside it, so each part's share can
be read (a drain's profile mixes them), but the box's drift still moves the figures: two runs
ten minutes apart gave 0.97 and 1.27 ms of server CPU per task for the three loop parts
together, in the same proportions. To compare two trees, alternate them (``--tree``) and
compare within a pair.

Usage: ``python bench/profile_store.py [--graph server|embedded] [--tasks 3000] [--batch 10]
[--page-every 11] [--rounds 3] [--tree PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))

from runner.testing.gremlinserver import GremlinServer  # noqa: E402

#: the client, run with the tree's code: prints one JSON line per part and round
CLIENT = textwrap.dedent("""
    import json, resource, sys, time
    from bench._profile import cpu_seconds
    from runner.store import AttemptStatus, Conclusion, TaskStatus, open_store
    graph, server_pid, tasks, batch, page_every, rounds = sys.argv[1:7]
    tasks, batch, page_every, rounds = int(tasks), int(batch), int(page_every), int(rounds)

    def server_cpu():
        return 0.0 if server_pid == "-" else cpu_seconds(int(server_pid), descendants=False)

    def own_cpu():
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    def part(name, fn, rnd):
        marks = server_cpu(), own_cpu(), time.perf_counter()
        extra = fn() or {}
        ends = server_cpu(), own_cpu(), time.perf_counter()
        print(json.dumps({"part": name, "round": rnd, **extra,
                          **{k: (b - a) / tasks * 1000 for k, a, b in
                             zip(("server", "client", "wall"), marks, ends)}}), flush=True)

    finished = {"status": TaskStatus.WAITING, "finished": True}
    options = {"atomicity": "serial"} if graph.startswith("ws") else {}
    with open_store(graph, **options) as store:
        store.tasks.add_many([store.tasks.new("diag.sleep", {"seconds": 0})
                              for _ in range(200)])  # warm: the server's JIT, the caches
        for rnd in range(rounds):
            store.clear()
            made, claimed = [], []

            def add():
                for first in range(0, tasks, 500):
                    made.extend(store.tasks.add_many(
                        [store.tasks.new("diag.sleep", {"seconds": 0})
                         for _ in range(min(500, tasks - first))]))

            def pages():
                rows = 0
                for _ in range(tasks // page_every):
                    rows += len(store.tasks.ready_page(lane, seconds[:2], 64))
                return {"rows_per_page": rows / max(1, tasks // page_every)}

            def claims():
                token = 10 ** 12
                for first in range(0, len(made), batch):
                    chunk = []
                    for task in made[first:first + batch]:
                        token += 1
                        chunk.append((task, token))
                    claimed.extend(store.claim_many(chunk, "profile"))

            def ends():
                won = [c for c in claimed if isinstance(c, tuple)]
                for first in range(0, len(won), batch):
                    store.conclude_many([Conclusion.of(a, AttemptStatus.SUCCEEDED, t, finished)
                                         for t, a in won[first:first + batch]])

            part("add_many, pages of 500", add, rnd)
            lane = store.tasks.lanes()[0]  # where the pages read, found outside their time
            seconds = store.tasks.lane_seconds(lane)
            part(f"ready pages of 64 rows, one per {page_every} tasks", pages, rnd)
            part(f"claim_many, {batch} a batch", claims, rnd)
            part(f"conclude_many, {batch} a batch", ends, rnd)
""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", choices=["server", "embedded"], default="server")
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--page-every", type=int, default=11)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tree", type=Path, default=HERE, help="the checkout the client runs")
    args = parser.parse_args()
    tree = args.tree.resolve()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory() as tmp:
        server = None
        graph, server_pid = str(Path(tmp) / "graph.db"), "-"
        if args.graph == "server":
            server = GremlinServer(Path(tmp) / "gremlin-server", heap="2g")
            server.start()
            graph = server.url
            server_pid = str(server.record.pid) if server.record else "-"
        try:
            out = subprocess.run(
                [sys.executable, "-c", CLIENT, graph, server_pid, str(args.tasks),
                 str(args.batch), str(args.page_every), str(args.rounds)],
                env=env, cwd=tree, check=True, capture_output=True, text=True).stdout
        finally:
            if server is not None:
                server.kill()
    report([json.loads(line) for line in out.splitlines() if line.startswith("{")],
           args.graph == "server")


def report(lines: list[dict[str, float | str]], remote: bool) -> None:
    parts: dict[str, list[dict[str, float | str]]] = {}
    for line in lines:
        parts.setdefault(str(line["part"]), []).append(line)
    print("| part | graph server CPU, ms/task | client CPU, ms/task | wall, ms/task |")
    print("| --- | --- | --- | --- |")
    total = {"server": 0.0, "client": 0.0}
    for name, rounds in parts.items():
        median = {k: statistics.median(float(r[k]) for r in rounds)
                  for k in ("server", "client", "wall")}
        if not name.startswith("add_many"):
            total["server"] += median["server"]
            total["client"] += median["client"]
        server = f"{median['server']:.3f}" if remote else "-"
        print(f"| {name} | {server} | {median['client']:.3f} | {median['wall']:.3f} |")
    server = f"{total['server']:.3f}" if remote else "-"
    print(f"| the loop's parts (pages, claims, ends) | {server} | {total['client']:.3f} | |")
    rows = [float(line["rows_per_page"]) for line in lines if "rows_per_page" in line]
    if rows:  # fewer than 64: the pages read fewer rows than a drain's do
        print(f"rows a page read: {statistics.median(rows):.0f}")


if __name__ == "__main__":
    main()
