"""The graph store on the embedded backend (gremlite) against raw gremlite, one run, ratios last.

1. Task creates/s (store.tasks.create: one transaction each) and attempt writes/s (start +
   finish of one attempt, two transactions) ÷ raw gremlite addV/s of a vertex with the same
   number of properties, one transaction each, on the same file.
2. Unfinished-task scan latency with 100 unfinished among 200k finished ÷ the same with 1k
   finished (median of 15 scans each). Target <= 1.2: the scan reads the "open" index entries
   only.
3. Aspect bulk upsert rows/s (store.avatars.upsert_aspect: id lookup + chained property writes
   per batch of 100) ÷ raw chained gremlite property writes by known vertex id, same batch.
   Target >= 0.8.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gremlin_python.process.traversal import Cardinality

from runner.store import (
    AttemptStatus,
    Avatar,
    EmbeddedGraph,
    Task,
    TaskStatus,
    codec,
    store_on,
)
from runner.store.gremlin.rows import task_props

CREATES = 1000
ATTEMPTS = 500
FEW, MANY = 1_000, 200_000
OPEN = 100
AVATARS = 10_000
BATCH = 100  # the store's batch size


def task_property_count() -> int:
    """How many properties the store writes for a new task (the raw baseline writes as many)."""
    now = codec.now()
    return len(task_props(Task(id="t", type="t", payload={}, active=True,
                               status=TaskStatus.WAITING, finished=False, priority=0,
                               created_at=now, updated_at=now, version=0, fence=0)))


def raw_add_v(graph: EmbeddedGraph, n: int) -> float:
    props = {f"raw_p{i}": f"value-{i}" for i in range(task_property_count())}
    started = time.perf_counter()
    for _ in range(n):
        def run(g: Any) -> None:
            t = g.add_v("raw")
            for k, v in props.items():
                t = t.property(k, v)
            t.iterate()
        graph.write(run)
    return n / (time.perf_counter() - started)


def bulk_finished(graph: EmbeddedGraph, n: int) -> None:
    """Finished tasks in the store's own format, written in chained batches (setup only, not
    measured)."""
    created = codec.now()
    for start in range(0, n, 25):  # 10 steps per vertex; gremlite recurses per step
        def run(g: Any, start: int = start) -> None:
            t = g
            for i in range(start, min(n, start + 25)):
                done = Task(id=f"done-{i}", type="t", payload={}, active=True,
                            status=TaskStatus.WAITING, finished=True, priority=0,
                            created_at=created, updated_at=created, version=1, fence=0)
                t = t.add_v("task")
                for key, value in task_props(done).items():
                    t = t.property(key, value)
            t.iterate()
        graph.write(run)


def scan_latency(path: Path, finished: int) -> float:
    graph = EmbeddedGraph(path)
    store = store_on(graph)
    bulk_finished(graph, finished)
    for i in range(OPEN):
        store.tasks.create("t", {"n": i})
    timings = []
    for _ in range(15):
        started = time.perf_counter()
        found = store.tasks.unfinished()
        timings.append(time.perf_counter() - started)
        if len(found) != OPEN:
            raise RuntimeError(f"scan found {len(found)} tasks, expected {OPEN}")
    store.close()
    return statistics.median(timings)


def aspect_rates(path: Path) -> tuple[float, float]:
    graph = EmbeddedGraph(path)
    store = store_on(graph)
    avatars = [Avatar(f"av{i}", "https://brickschema.org/schema/Brick#AHU", {"lat": i})
               for i in range(AVATARS)]
    store.avatars.upsert(avatars)
    ids = graph.read(lambda g: g.V().has_label("avatar").id_().to_list())
    value = codec.encode_json({"type": "Point", "coordinates": [4.0, 52.0]})
    started = time.perf_counter()
    for start in range(0, len(ids), BATCH):
        def run(g: Any, start: int = start) -> None:
            t = g
            for vid in ids[start:start + BATCH]:
                t = t.V(vid).property(Cardinality.single, "aspect.raw", value)
            t.iterate()
        graph.write(run)
    raw = len(ids) / (time.perf_counter() - started)
    values = {a.id: {"type": "Point", "coordinates": [4.0, 52.0]} for a in avatars}
    started = time.perf_counter()
    written = store.avatars.upsert_aspect("geo", values)
    ours = written / (time.perf_counter() - started)
    store.close()
    return raw, ours


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="latchwork-bench-") as tmp:
        root = Path(tmp)
        graph = EmbeddedGraph(root / "rates.db")
        store = store_on(graph)
        raw_add_v(graph, 100)  # warm-up
        raw = raw_add_v(graph, CREATES)
        started = time.perf_counter()
        tasks = [store.tasks.create("t", {"n": i}) for i in range(CREATES)]
        creates = CREATES / (time.perf_counter() - started)
        started = time.perf_counter()
        for task in tasks[:ATTEMPTS]:
            attempt = store.attempts.start(task.id, "bench:1:x")
            store.attempts.finish(attempt.id, AttemptStatus.SUCCEEDED)
        attempts = ATTEMPTS / (time.perf_counter() - started)
        store.close()
        few = scan_latency(root / "few.db", FEW)
        many = scan_latency(root / "many.db", MANY)
        raw_aspect, our_aspect = aspect_rates(root / "aspects.db")
    print(f"raw gremlite addV ({task_property_count()} properties, 1 txn each):  {raw:8.0f} /s")
    print(f"task create:                                  {creates:8.0f} /s")
    print(f"attempt start+finish:                         {attempts:8.0f} /s")
    print(f"unfinished scan, {OPEN} open + {FEW} finished:    {few * 1000:8.2f} ms (median)")
    print(f"unfinished scan, {OPEN} open + {MANY} finished:  {many * 1000:8.2f} ms (median)")
    print(f"raw chained property writes:                  {raw_aspect:8.0f} rows/s")
    print(f"aspect bulk upsert:                           {our_aspect:8.0f} rows/s")
    print(f"ratio task create/raw addV: {creates / raw:.2f}")
    print(f"ratio attempt write/raw addV: {attempts / raw:.2f}")
    print(f"ratio scan 200k/1k finished: {many / few:.2f} (target <= 1.2)")
    print(f"ratio aspect upsert/raw property writes: {our_aspect / raw_aspect:.2f} "
          f"(target >= 0.8)")


if __name__ == "__main__":
    main()
