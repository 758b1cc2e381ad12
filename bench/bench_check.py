"""What ``ctx.check()`` costs, and so how wide the window it leaves is.

``ctx.check()`` is what a handler calls right before an effect on a system that cannot check a
fencing token: it asks ZooKeeper whether its lock node still exists with its czxid, and the
graph whether its token is still the task's. The window that remains is the time from its
return to the effect (plus any pause in between); this measures the check itself against its
baseline, one raw kazoo ``exists`` and one raw gremlite read, in the same run.

Prints p50/p99 of each and the ratio check p50 / (raw exists p50 + raw read p50) last.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _servers import zookeeper

from coord import Session
from runner.store import open_store
from runner.tasks import TaskContext, TaskRegistry
from runner.tasks.worker.loop import LoopSettings, TaskLoop

ROUNDS = 2000


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1000, ordered[int(len(ordered) * 0.99)] * 1000


def main() -> None:
    with zookeeper() as zk, tempfile.TemporaryDirectory() as tmp, \
            open_store(str(Path(tmp) / "graph.db")) as store, \
            Session(zk.hosts, "bench", timeout=10.0) as session:
        timings: list[float] = []
        done = threading.Event()

        def measure(ctx: TaskContext, payload: dict[str, Any]) -> None:
            for _ in range(ROUNDS):
                started = time.perf_counter()
                ctx.check()
                timings.append(time.perf_counter() - started)
            done.set()

        registry = TaskRegistry()
        registry.register("bench.check", measure)
        task = store.tasks.create("bench.check")
        processor = TaskLoop(session, "bench", store, registry,
                             LoopSettings(workers=1, scan_interval=60)).start()
        try:
            assert done.wait(300), "the measuring task never ran"
        finally:
            processor.close()
        client = session.client
        raw_zk, raw_read = [], []
        client.ensure_path("/bench/node")
        for _ in range(ROUNDS):
            started = time.perf_counter()
            client.exists("/bench/node")
            raw_zk.append(time.perf_counter() - started)
            started = time.perf_counter()
            store.tasks.get(task.id)
            raw_read.append(time.perf_counter() - started)
    check50, check99 = percentiles(timings)
    zk50, zk99 = percentiles(raw_zk)
    read50, read99 = percentiles(raw_read)
    print(f"ctx.check(): p50 {check50:.3f} ms, p99 {check99:.3f} ms ({ROUNDS} calls)")
    print(f"raw kazoo exists: p50 {zk50:.3f} ms, p99 {zk99:.3f} ms")
    print(f"raw graph task read: p50 {read50:.3f} ms, p99 {read99:.3f} ms")
    print(f"ratio check / (exists + read), p50: {check50 / (zk50 + read50):.2f}")


if __name__ == "__main__":
    main()
