"""Delayed tasks and ordering keys with 3 node processes on this box, one run (ratios last).

1. Scheduled start precision: 1,000 ``diag.sleep 0`` tasks due over 10 s (created ahead in one
   write, so the nodes' listings have them); start - run_at, p50 and p99, with a 5 s scan
   interval: the nodes' timers, not the scan, start them. Target p50 <= 20 ms, p99 <= 100 ms.
2. Ordering-key throughput: 600 ``diag.sleep 0`` tasks on 100 keys (6 per key) vs the same
   tasks without keys, tasks/s from the first start to the last finish, in 3 alternated rounds
   (the box drifts 20-40% within minutes); the ratio of the medians. Target ratio >= 0.8.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._servers import rabbitmq, zookeeper
from bench.bench_runner import wait
from coord.testing import terminate_all
from runner.store import AttemptStatus, Store, codec, open_store

SESSION = 2.0
SCAN = 5.0
DUE = 1000
SPREAD = 10.0
ORDERED = 600
KEYS = 100
ROUNDS = 3


def throughput(store: Store, keys: int | None) -> float:
    ids = store.graph.write(lambda g: [
        store.tasks.create("diag.sleep", {"seconds": 0},
                           ordering_key=None if keys is None else f"k{n % keys}").id
        for n in range(ORDERED)])
    wait(lambda: not store.tasks.unfinished(), 600, step=1.0)
    starts, ends = [], []
    for task_id in ids:
        attempts = store.attempts.for_task(task_id)
        starts.append(attempts[0].started_at.timestamp())
        ends += [a.ended_at.timestamp() for a in attempts
                 if a.ended_at is not None and a.status is AttemptStatus.SUCCEEDED]
    return ORDERED / (max(ends) - min(starts))


def main() -> None:
    with zookeeper() as zk, rabbitmq() as mq, tempfile.TemporaryDirectory() as tmp:
        graph = str(Path(tmp) / "graph.db")
        env = {**os.environ, "LATCHWORK_ZK_HOSTS": zk.hosts, "LATCHWORK_AMQP_URL": mq.url,
               "LATCHWORK_GRAPH": graph, "LATCHWORK_CLUSTER": "bench",
               "LATCHWORK_SESSION_TIMEOUT": str(SESSION), "LATCHWORK_SCAN_INTERVAL": str(SCAN),
               "LATCHWORK_REAP_INTERVAL": "0.5", "LATCHWORK_WORKERS": "4"}
        nodes = [subprocess.Popen([sys.executable, "-m", "runner.cli", "node", "start",
                                   "--log-level", "WARNING"], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL) for _ in range(3)]
        try:
            for node in nodes:
                assert node.stdout is not None
                node.stdout.readline()
            store = open_store(graph)
            first = codec.now() + timedelta(seconds=2 * SCAN + 3)
            ids = store.graph.write(lambda g: [
                store.tasks.create("diag.sleep", {"seconds": 0},
                                   run_at=first + timedelta(seconds=SPREAD * n / DUE)).id
                for n in range(DUE)])
            # the observer stays light while the tasks are due (a listing of 1,000 open tasks
            # costs about 0.1 s of this 2-core box): it waits for the last one, then checks all
            time.sleep(2 * SCAN + 3 + SPREAD)
            wait(lambda: store.tasks.get(ids[-1]).finished, 120, step=0.5)
            wait(lambda: not store.tasks.unfinished(), 120, step=1.0)
            late = []
            for task_id in ids:
                task = store.tasks.get(task_id)
                assert task.run_at is not None
                started = store.attempts.for_task(task_id)[0].started_at
                late.append((started - task.run_at).total_seconds())
            late.sort()
            early = sum(1 for x in late if x < 0)
            p50 = statistics.median(late)
            p99 = late[int(0.99 * (len(late) - 1))]
            plains, keyeds = [], []
            for _ in range(ROUNDS):
                plains.append(throughput(store, None))
                keyeds.append(throughput(store, KEYS))
            plain, keyed = statistics.median(plains), statistics.median(keyeds)
            store.close()
        finally:
            terminate_all(nodes)
    print(f"{DUE} tasks due over {SPREAD:g} s on 3 nodes (scan interval {SCAN:g} s): start - "
          f"run_at p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, max "
          f"{late[-1] * 1000:.0f} ms; started early: {early} (target p50 <= 20 ms, "
          f"p99 <= 100 ms)")
    print(f"{ORDERED} tasks, {ROUNDS} rounds: without keys "
          f"{', '.join(f'{x:.0f}' for x in plains)} tasks/s, on {KEYS} ordering keys "
          f"{', '.join(f'{x:.0f}' for x in keyeds)} tasks/s")
    print(f"ratio p50/20 ms: {p50 / 0.020:.2f}; p99/100 ms: {p99 / 0.100:.2f} (targets <= 1)")
    print(f"ratio ordered/unordered throughput: {keyed / plain:.2f} (target >= 0.8)")


if __name__ == "__main__":
    main()
