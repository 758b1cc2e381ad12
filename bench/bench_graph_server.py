"""The same store work on the two graphs, one run: gremlite (embedded file) and a Gremlin Server
(TinkerPop 3.5.1, TinkerGraph, one traversal at a time, on loopback), ratios last.

Per backend, one process, one thread:

1. raw ``addV`` of a vertex with 8 properties, one request (server) or transaction (file) each:
   the baseline of each backend;
2. ``tasks.create`` /s;
3. the task loop's two writes per task: ``claim`` (task RUNNING + its attempt, one guarded
   traversal) then ``conclude`` (attempt end + task finished, one guarded traversal), cycles/s;
4. ``tasks.get`` by id /s (an indexed lookup);
5. ``tasks.unfinished()`` with 200 open among 5,000 finished, median of 15, ms.

The last line prints server ÷ gremlite for each. No target: the server graph is the route to
several machines, and these say what one round trip per guarded write costs against the
embedded file's single writer (docs/graph.md).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runner.store import AttemptStatus, Store, TaskStatus, open_store
from runner.store.server.graph import SERIAL
from runner.testing.gremlinserver import GremlinServer

RAW = 500
CREATES = 500
CYCLES = 300
GETS = 1000
FINISHED, OPEN = 5_000, 200


def rate(count: int, fn: Any) -> float:
    began = time.perf_counter()
    for i in range(count):
        fn(i)
    return count / (time.perf_counter() - began)


def measure(store: Store) -> dict[str, float]:
    props = {f"p{i}": f"value-{i}" for i in range(8)}

    def raw(i: int) -> None:
        def write(g: Any) -> None:
            t = g.add_v("raw")
            for k, v in props.items():
                t = t.property(k, v)
            t.iterate()
        store.graph.write(write)

    out = {"raw_addv_per_s": rate(RAW, raw)}
    ids: list[str] = []
    out["create_per_s"] = rate(CREATES, lambda i: ids.append(store.tasks.create("b", {"n": i}).id))
    finished = {"status": TaskStatus.WAITING, "finished": True}

    def cycle(i: int) -> None:
        task, attempt = store.claim(store.tasks.get(ids[i]), 1000 + i, "bench")
        store.conclude(attempt, AttemptStatus.SUCCEEDED, None, None, task, 1000 + i, finished)

    out["claim_conclude_cycles_per_s"] = rate(CYCLES, cycle)
    out["get_per_s"] = rate(GETS, lambda i: store.tasks.get(ids[i % len(ids)]))
    for n in range(FINISHED - CYCLES):  # make the finished ones up to FINISHED (plain writes)
        task = store.tasks.create("b", {"n": n})
        store.tasks.update(task.id, task.version, None, finished=True)
    for _ in range(OPEN - (CREATES - CYCLES)):
        store.tasks.create("b", {})
    scans = []
    for _ in range(15):
        began = time.perf_counter()
        open_now = store.tasks.unfinished()
        scans.append((time.perf_counter() - began) * 1000)
    assert len(open_now) == OPEN, len(open_now)
    out["unfinished_scan_ms"] = statistics.median(scans)
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        with open_store(str(Path(scratch) / "graph.db")) as embedded:
            local = measure(embedded)
        server = GremlinServer(Path(scratch) / "gremlin-server")
        server.start()
        try:
            with open_store(server.url, atomicity=SERIAL) as remote:
                served = measure(remote)
        finally:
            server.kill()
    print(f"{'figure':<30} {'gremlite':>10} {'server':>10} {'server/gremlite':>16}")
    for key in local:
        print(f"{key:<30} {local[key]:>10.1f} {served[key]:>10.1f} "
              f"{served[key] / local[key]:>16.2f}")
    print("ratios server/gremlite: " + ", ".join(
        f"{k}={served[k] / local[k]:.2f}" for k in local))


if __name__ == "__main__":
    main()
