"""The task runner with 3 node processes on this box, one run (ratios last).

1. submit -> start latency: tasks submitted through the API one at a time (50 ms apart);
   latency = the first attempt's start - the task's creation (both written on this host).
   p50 and p99. Target p50 <= 50 ms.
2. Throughput of ``diag.sleep 0`` tasks across the 3 nodes (tasks/s from the first start to the
   last finish; the median of 3 rounds of 300) ÷ raw kazoo Lock acquire+release cycles/s on the
   same ZooKeeper, measured warm: a freshly started ZooKeeper JVM runs the first thousand
   cycles ~35% slower, and a cold baseline would flatter the ratio. Target >= 0.5.
3. kill -9 of the node running a task -> the task running on another node, ÷ (session timeout +
   scan interval). Target <= 1 + 1 s / (session timeout + scan interval).
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._servers import rabbitmq, zookeeper
from bench.bench_task_lock import raw_kazoo
from coord.testing import terminate_all
from messaging import ApiClient, Connector, Topology
from runner.store import AttemptStatus, GraphStore, open_store

SESSION = 2.0
SCAN = 1.0
LATENCY_TASKS = 60
THROUGHPUT_TASKS = 300
ROUNDS = 3


def wait(predicate, timeout: float, step: float = 0.05) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out")
        time.sleep(step)


def first_start(store: GraphStore, task_id: str) -> float | None:
    attempts = store.attempts.for_task(task_id)
    return attempts[0].started_at.timestamp() if attempts else None


def main() -> None:
    with zookeeper() as zk, rabbitmq() as mq, tempfile.TemporaryDirectory() as tmp:
        raw_kazoo(zk.hosts)  # warm-up only: ZooKeeper's JIT is cold
        raw = raw_kazoo(zk.hosts)  # the same baseline as bench_task_lock.py, warm
        graph = str(Path(tmp) / "graph.db")
        env = {**os.environ, "LATCHWORK_ZK_HOSTS": zk.hosts, "LATCHWORK_AMQP_URL": mq.url,
               "LATCHWORK_GRAPH": graph, "LATCHWORK_CLUSTER": "bench",
               "LATCHWORK_SESSION_TIMEOUT": str(SESSION), "LATCHWORK_SCAN_INTERVAL": str(SCAN),
               "LATCHWORK_REAP_INTERVAL": "0.5", "LATCHWORK_WORKERS": "4"}
        # LATCHWORK_BENCH_LOGS=DIR keeps the nodes' INFO logs (claim statistics at exit)
        logs = os.environ.get("LATCHWORK_BENCH_LOGS")
        nodes = [subprocess.Popen([sys.executable, "-m", "runner.cli", "node", "start",
                                   "--log-level", "INFO" if logs else "WARNING"], env=env,
                                  stdout=subprocess.PIPE,
                                  stderr=open(Path(logs) / f"node{i}.log", "w")  # noqa: SIM115
                                  if logs else subprocess.DEVNULL)
                 for i in range(3)]
        try:
            for node in nodes:
                assert node.stdout is not None
                node.stdout.readline()  # "latchwork node <id> joined ..."
            store = open_store(graph)
            client = ApiClient(Connector(mq.url), Topology("bench"), sender="bench")
            client.request("task.submit", {"type": "diag.sleep", "payload": {"seconds": 0}})
            latencies = []
            for _ in range(LATENCY_TASKS):
                task = client.request("task.submit", {"type": "diag.sleep",
                                                      "payload": {"seconds": 0}})
                wait(lambda t=task: first_start(store, t["id"]) is not None, 30)
                created = store.tasks.get(task["id"]).created_at.timestamp()
                start = first_start(store, task["id"])
                assert start is not None
                latencies.append(start - created)
                time.sleep(0.05)
            latencies.sort()
            p50 = statistics.median(latencies)
            p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]

            rounds = []
            for _ in range(ROUNDS):
                # one transaction: the nodes see the whole batch at once (created one by one,
                # a periodic scan would start the first ones while the rest are being written,
                # and the round would time this process's writes, not the cluster)
                ids = store.graph.write(lambda g: [
                    store.tasks.create("diag.sleep", {"seconds": 0}).id
                    for _ in range(THROUGHPUT_TASKS)])
                client.request("task.submit", {"type": "diag.sleep", "payload": {"seconds": 0}})
                # polled slowly: listing 300 open tasks costs CPU the nodes need (2 cores here)
                wait(lambda: not store.tasks.unfinished(), 600, step=1.0)
                starts = [first_start(store, i) or 0.0 for i in ids]
                ends = [a.ended_at.timestamp() for i in ids for a in store.attempts.for_task(i)
                        if a.ended_at is not None and a.status is AttemptStatus.SUCCEEDED]
                rounds.append(THROUGHPUT_TASKS / (max(ends) - min(starts)))
            throughput = statistics.median(rounds)

            task = client.request("task.submit", {"type": "diag.sleep",
                                                  "payload": {"seconds": 60}})

            def executor() -> str | None:
                running = [a for a in store.attempts.for_task(task["id"])
                           if a.status is AttemptStatus.RUNNING]
                return running[0].executor if running else None

            wait(lambda: executor() is not None, 30)
            victim = executor()
            assert victim is not None
            killed = time.time()
            os.kill(int(victim.split(":")[1]), signal.SIGKILL)
            wait(lambda: executor() not in (None, victim), 60)
            takeover = store.attempts.for_task(task["id"])[-1].started_at.timestamp() - killed
            client.close()
            store.close()
        finally:
            terminate_all(nodes)
    budget = SESSION + SCAN
    print(f"submit->start latency: p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms "
          f"({LATENCY_TASKS} tasks, target p50 <= 50 ms)")
    print(f"diag.sleep 0 on 3 nodes: {throughput:.0f} tasks/s (median of "
          f"{', '.join(f'{r:.0f}' for r in rounds)}); raw kazoo Lock, warm: {raw:.0f} cycles/s")
    print(f"kill -9 -> running elsewhere: {takeover:.2f} s (session {SESSION:g} s + scan "
          f"{SCAN:g} s = {budget:g} s)")
    print(f"ratio throughput/raw kazoo lock: {throughput / raw:.2f} (target >= 0.5)")
    print(f"ratio takeover/(session + scan): {takeover / budget:.2f} "
          f"(target <= {1 + 1 / budget:.2f})")


if __name__ == "__main__":
    main()
