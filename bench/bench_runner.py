"""The task runner on 3 node processes against its peer, Celery, on this box in one run.

latchwork runs on the embedded graph (gremlite file) and on a Gremlin Server (the nodes share
it over loopback, one traversal at a time), Celery 5 on RabbitMQ with the durable-message setup
of bench/bench_peer.py (3 prefork workers, acks_late, reject on worker lost, prefetch 1, no
result backend). Per graph:

1. **submit -> start**: tasks submitted through the API one at a time, 50 ms apart; latency =
   the start of the handler's body - the client's clock just before its submit, as the peer
   measures it (``bench.mark``, bench/marks.py, loaded by the nodes); p50, p99; and, printed
   beside it, the part inside the nodes: the first attempt's start - the task's creation;
2. **throughput**: ``THROUGHPUT_TASKS`` ``diag.sleep 0`` tasks written at once, run by the 3
   nodes (4 workers each); tasks/s from the first start to the last end, median of ``ROUNDS``;
   with the **profile** of one round: per task, ZooKeeper requests (the server's packet count,
   pings included), graph store reads and writes and their time (the nodes' metrics), broker
   messages consumed, and the CPU of each process (nodes, ZooKeeper, RabbitMQ, Gremlin Server,
   this bench);
3. **60 one-second tasks** on 3 nodes of one worker each, wall time against the ideal 20 s;
4. (embedded only, last) **kill -9** of the node running a task -> the task running on another
   node.

Baselines measured in the same run: the raw kazoo Lock cycle (warm) and Celery. The targets
(issue 32): throughput >= 0.5x Celery's drain and >= 2x the raw Lock cycle; p50 <= 1.5x
Celery's paced p50 and p99 <= 3x its p99; the one-second tasks within 1.05x the ideal. The
last lines print every ratio. ``--graph embedded|server|both`` (both), ``--no-peer``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _profile
from bench._servers import rabbitmq, zookeeper
from bench.bench_peer import _records
from bench.bench_task_lock import raw_kazoo
from coord.testing import terminate_all
from coord.testing.ports import free_ports
from messaging import ApiClient, Connector, Topology
from runner.store import AttemptStatus, GraphStore, open_store
from runner.store.remote import SERIAL
from runner.testing.gremlinserver import GremlinServer

ROOT = Path(__file__).resolve().parent.parent
SESSION = 2.0
SCAN = 1.0
LATENCY_TASKS = 60
THROUGHPUT_TASKS = 600
ROUNDS = 3
SLOW_TASKS, SLOW_SECONDS = 60, 1.0


def wait(predicate, timeout: float, step: float = 0.05) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out")
        time.sleep(step)


def first_start(store: GraphStore, task_id: str) -> float | None:
    attempts = store.attempts.for_task(task_id)
    return attempts[0].started_at.timestamp() if attempts else None


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Nodes:
    """3 node processes with ``workers`` each, their metrics on ports of their own."""

    def __init__(self, env: dict[str, str], workers: int) -> None:
        self.ports = free_ports(3)
        logs = os.environ.get("LATCHWORK_BENCH_LOGS")  # a directory: keep the nodes' INFO logs
        self.procs = []
        for i, port in enumerate(self.ports):
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "runner.cli", "node", "start",
                 "--log-level", "INFO" if logs else "WARNING"],
                env={**env, "LATCHWORK_WORKERS": str(workers),
                     "LATCHWORK_METRICS_PORT": str(port)},
                stdout=subprocess.PIPE,
                stderr=open(Path(logs) / f"node{i}-{workers}.log", "a")  # noqa: SIM115
                if logs else subprocess.DEVNULL))
        for proc in self.procs:
            assert proc.stdout is not None
            proc.stdout.readline()  # "latchwork node <id> joined ..."

    def close(self) -> None:
        terminate_all(self.procs)


@contextlib.contextmanager
def nodes(env: dict[str, str], workers: int) -> Iterator[Nodes]:
    started = Nodes(env, workers)
    try:
        yield started
    finally:
        started.close()


def submit_and_wait(store: GraphStore, client: ApiClient, seconds: float) -> float:
    """Inside the nodes: the task's creation -> its first attempt's start, both written by
    the accepting node."""
    task = client.request("task.submit", {"type": "diag.sleep", "payload": {"seconds": seconds}})
    wait(lambda: first_start(store, task["id"]) is not None, 30, step=0.05)
    start = first_start(store, task["id"])
    assert start is not None
    return start - store.tasks.get(task["id"]).created_at.timestamp()


def mark_and_wait(client: ApiClient, marks: Path) -> float:
    """As the peer measures it: the client's clock just before its submit -> the handler's
    first line (``bench.mark``, bench/marks.py)."""
    count = len(_records(marks))
    client.request("task.submit", {"type": "bench.mark", "payload": {"sent": time.time()}})
    # polled as the peer's records are: the latency is read from the record, and a fast
    # poll would take CPU from the nodes on 2 cores
    wait(lambda: len(_records(marks)) > count, 30, step=0.05)
    sent, began, _ = max(_records(marks), key=lambda r: r[0])
    return began - sent


def create_at_once(store: GraphStore, count: int, seconds: float) -> list[str]:
    """``count`` tasks written together (one transaction on the file), so that the nodes see
    the whole batch at once; a TRIGGER_SCAN broadcast (:func:`tell`) then tells them."""
    return store.graph.write(lambda g: [store.tasks.create("diag.sleep", {"seconds": seconds}).id
                                        for _ in range(count)])


def tell(client: ApiClient) -> None:
    """Every node scans now, as a node tells the others of tasks it cannot take (an API submit
    no longer does: the node that accepts it starts it when a worker is free, and tells no
    one)."""
    client.broadcast("TRIGGER_SCAN", {})


def span(store: GraphStore, ids: list[str]) -> float:
    starts = [first_start(store, i) or 0.0 for i in ids]
    ends = [a.ended_at.timestamp() for i in ids for a in store.attempts.for_task(i)
            if a.ended_at is not None and a.status is AttemptStatus.SUCCEEDED]
    assert len(ends) == len(ids), (len(ends), len(ids))
    return max(ends) - min(starts)


def measure(graph: str, zk: Any, mq: Any, scratch: Path,
            server_pid: int | None) -> dict[str, Any]:
    marks = scratch / f"marks-{abs(hash(graph)) % 10**6}"
    marks.mkdir()
    env = {**os.environ, "LATCHWORK_ZK_HOSTS": zk.hosts, "LATCHWORK_AMQP_URL": mq.url,
           "LATCHWORK_GRAPH": graph, "LATCHWORK_CLUSTER": f"bench{abs(hash(graph)) % 10**6}",
           "LATCHWORK_SESSION_TIMEOUT": str(SESSION), "LATCHWORK_SCAN_INTERVAL": str(SCAN),
           "LATCHWORK_REAP_INTERVAL": "0.5", "LATCHWORK_TASKS": '["bench.marks"]',
           "LATCHWORK_BENCH_MARKS": str(marks),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                       os.environ.get("PYTHONPATH")]))}
    remote = graph.startswith("ws://")
    if remote:
        env["LATCHWORK_GRAPH_SERIAL_SERVER"] = "true"
    store = open_store(graph, atomicity=SERIAL) if remote else open_store(graph)
    client = ApiClient(Connector(mq.url), Topology(env["LATCHWORK_CLUSTER"]), sender="bench")
    out: dict[str, Any] = {}
    try:
        with nodes(env, 4) as cluster:
            submit_and_wait(store, client, 0)  # warm
            mark_and_wait(client, marks)
            latencies, inside = [], []
            for _ in range(LATENCY_TASKS):
                latencies.append(mark_and_wait(client, marks))
                time.sleep(0.05)
                inside.append(submit_and_wait(store, client, 0))
                time.sleep(0.05)
            out["p50_ms"] = statistics.median(latencies) * 1000
            out["p99_ms"] = percentile(latencies, 0.99) * 1000
            out["inside_p50_ms"] = statistics.median(inside) * 1000
            out["inside_p99_ms"] = percentile(inside, 0.99) * 1000

            zk_server = zk.servers[0]
            procs = {"nodes": [p.pid for p in cluster.procs],
                     "zookeeper": [s.record.pid for s in zk.servers],
                     "rabbitmq": [r.pid for r in mq._processes()],
                     "bench": [os.getpid()]}
            if server_pid is not None:
                procs["gremlin-server"] = [server_pid]
            rounds = []
            for n in range(ROUNDS):
                before = _profile.snapshot(procs, (zk_server.host, zk_server.client_port),
                                           cluster.ports)
                ids = create_at_once(store, THROUGHPUT_TASKS, 0)
                tell(client)
                # polled slowly: listing open tasks costs CPU the nodes need (2 cores here)
                wait(lambda: not store.tasks.unfinished(), 600, step=1.0)
                if n == 0:
                    out["profile"] = _profile.per_task(
                        before, _profile.snapshot(procs, (zk_server.host, zk_server.client_port),
                                                  cluster.ports), THROUGHPUT_TASKS)
                rounds.append(THROUGHPUT_TASKS / span(store, ids))
            out["rounds"] = rounds
            out["throughput"] = statistics.median(rounds)
        with nodes(env, 1):
            submit_and_wait(store, client, 0)  # warm
            ids = create_at_once(store, SLOW_TASKS, SLOW_SECONDS)
            tell(client)
            wait(lambda: not store.tasks.unfinished(), 300, step=0.5)
            out["slow_s"] = span(store, ids)
        if not remote:  # last: its 60 s task would hold a worker of the phases after it
            with nodes(env, 4):
                out["takeover_s"] = takeover(store, client)
    finally:
        client.close()
        store.close()
    return out


def takeover(store: GraphStore, client: ApiClient) -> float:
    task = client.request("task.submit", {"type": "diag.sleep", "payload": {"seconds": 60}})

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
    return store.attempts.for_task(task["id"])[-1].started_at.timestamp() - killed


def report(name: str, f: dict[str, Any], raw: float, peer: dict[str, Any] | None) -> None:
    ideal = SLOW_TASKS * SLOW_SECONDS / 3
    print(f"== latchwork on the {name} graph")
    print(f"submit->start (the client's clock before its submit -> the handler's first line, "
          f"as Celery's): p50 {f['p50_ms']:.2f} ms, p99 {f['p99_ms']:.2f} ms "
          f"({LATENCY_TASKS} tasks, 50 ms apart); inside the nodes (creation -> attempt "
          f"start): p50 {f['inside_p50_ms']:.2f} ms, p99 {f['inside_p99_ms']:.2f} ms")
    print(f"diag.sleep 0 on 3 nodes x 4 workers: {f['throughput']:.0f} tasks/s (median of "
          f"{', '.join(f'{r:.0f}' for r in f['rounds'])}; {THROUGHPUT_TASKS} tasks a round)")
    print(f"{SLOW_TASKS} x {SLOW_SECONDS:g} s tasks on 3 nodes x 1 worker: {f['slow_s']:.2f} s "
          f"(ideal {ideal:g} s)")
    if "takeover_s" in f:
        print(f"kill -9 -> running elsewhere: {f['takeover_s']:.2f} s (session {SESSION:g} s "
              f"+ scan {SCAN:g} s = {SESSION + SCAN:g} s)")
    print("profile per task: " + ", ".join(f"{k} {v:.2f}" for k, v in f["profile"].items()))
    ratios = [f"throughput/raw kazoo lock {f['throughput'] / raw:.2f} (target >= 2)",
              f"slow/ideal {f['slow_s'] / ideal:.3f} (target <= 1.05)"]
    if peer is not None:
        ratios[:0] = [
            f"throughput/celery drain {f['throughput'] / peer['drain_per_s']:.2f} "
            "(target >= 0.5)",
            f"p50/celery p50 {f['p50_ms'] / peer['p50_ms']:.2f} (target <= 1.5)",
            f"p99/celery p99 {f['p99_ms'] / peer['p99_ms']:.2f} (target <= 3)"]
    if "takeover_s" in f:
        budget = SESSION + SCAN
        ratios.append(f"takeover/(session + scan) {f['takeover_s'] / budget:.2f} "
                      f"(target <= {1 + 1 / budget:.2f})")
    print(f"ratios ({name}): " + "; ".join(ratios))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graph", choices=["embedded", "server", "both"], default="both")
    parser.add_argument("--no-peer", action="store_true", help="leave Celery out")
    args = parser.parse_args()
    results: dict[str, dict[str, Any]] = {}
    peer: dict[str, Any] | None = None
    with zookeeper() as zk, rabbitmq() as mq, tempfile.TemporaryDirectory() as tmp:
        raw_kazoo(zk.hosts)  # warm-up only: ZooKeeper's JIT is cold
        raw = raw_kazoo(zk.hosts)  # the same baseline as bench_task_lock.py, warm
        if not args.no_peer:
            from bench.bench_peer import measure as celery
            peer = celery(mq.url)
        if args.graph in ("embedded", "both"):
            results["embedded"] = measure(str(Path(tmp) / "graph.db"), zk, mq, Path(tmp), None)
        if args.graph in ("server", "both"):
            server = GremlinServer(Path(tmp) / "gremlin-server")
            server.start()
            try:
                results["server"] = measure(server.url, zk, mq, Path(tmp),
                                            server.record.pid if server.record else None)
            finally:
                server.kill()
    print(f"raw kazoo Lock, warm: {raw:.0f} cycles/s")
    if peer is not None:
        print(f"celery (3 prefork workers, acks_late, prefetch 1): drain "
              f"{peer['drain_per_s']:.0f} tasks/s (rounds "
              f"{', '.join(f'{d:.0f}' for d in peer['drains'])}); submit->start p50 "
              f"{peer['p50_ms']:.2f} ms, p99 {peer['p99_ms']:.2f} ms; {SLOW_TASKS} x "
              f"{SLOW_SECONDS:g} s in {peer['slow_s']:.2f} s "
              f"({peer['slow_s'] / peer['slow_ideal_s']:.3f}x the ideal)")
    for name, figures in results.items():
        report(name, figures, raw, peer)


if __name__ == "__main__":
    main()
