"""Starvation under sustained overload: how long the top priority's tasks wait while a queue
of lower ones grows, and how long the tasks of a member that stopped taking any wait.

Issue 43 asks that under sustained load the oldest due task of the top priority starts within
2 s. On one cluster of 3 nodes x 4 workers (``diag.sleep 0`` tasks, the graph of ``--graph``)
it measures the drain rate first (``--calibrate`` tasks written at once), then for
``--seconds`` submits priority-0 tasks at ``--load`` times that rate (pages of
``submit_many`` every 0.1 s: the backlog grows all along) and every 0.25 s one priority-5
task. It prints, for the priority-5 tasks, the wait from their write (due at once) to their
attempt's start (p50, p99, the largest, and how many waited over 2 s), and for the priority-0
ones how many started during the load. With ``--stop-one`` one node is stopped (SIGSTOP) for
the middle third of the load: for the bench's 2 s session it stays a member, so the tasks it
is preferred for are the others' to take after ``steal_after``, and then its session expires
and its shards are the others' own; the priority-5 tasks it was preferred for are shown apart.
A page of submits that node had taken is sent again to another after 3 s (the client's
timeout): the wait is counted from the task's write.
A figure of this box, not a test: the waits depend on its speed.

Usage: ``python bench/bench_starvation.py [--graph embedded|server] [--seconds 20]
[--load 1.2] [--calibrate 2000] [--stop-one]``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._servers import rabbitmq, zookeeper
from bench.bench_runner import Cluster, Nodes, percentile
from runner.client import Client
from runner.store.due import preferred_index
from runner.testing.gremlinserver import GremlinServer

#: the top priority's tasks: one every this many seconds
TOP_EVERY = 0.25
#: seconds between two pages of the lower priority's tasks
PAGE_EVERY = 0.1
#: seconds the client waits for a node's answer before it sends a request again
REQUEST_TIMEOUT = 3.0


def load(cluster: Cluster, rate: float, seconds: float, stop: int | None
         ) -> tuple[list[tuple[str, float]], list[str]]:
    """Submit the load; (the top priority's ids with when each was submitted, the lower's).
    ``stop``: the node stopped for the load's middle third (timers: a page whose request that
    node had taken is sent again to another after the client's timeout)."""
    top: list[tuple[str, float]] = []
    low: list[str] = []
    per_page = max(1, round(rate * PAGE_EVERY))
    assert cluster.nodes is not None
    timers = []
    if stop is not None:
        pid = cluster.nodes.procs[stop].pid
        timers = [threading.Timer(seconds / 3, os.kill, (pid, signal.SIGSTOP)),
                  threading.Timer(2 * seconds / 3, os.kill, (pid, signal.SIGCONT))]
        for timer in timers:
            timer.start()
    began = time.monotonic()
    next_top = began
    try:
        while (now := time.monotonic()) < began + seconds:
            low += cluster.enqueue(per_page, lead=0.0)
            while next_top <= time.monotonic():
                sent = time.time()
                (task_id,) = cluster.enqueue(1, lead=0.0, priority=5)
                top.append((task_id, sent))
                next_top += TOP_EVERY
            time.sleep(max(0.0, PAGE_EVERY - (time.monotonic() - now)))
    finally:
        for timer in timers:
            timer.join()
    return top, low


def started_at(cluster: Cluster, task_id: str) -> float | None:
    attempts = cluster.store.attempts.for_task(task_id)
    return min(a.started_at.timestamp() for a in attempts) if attempts else None


def members(cluster: Cluster) -> list[str]:
    """The live members' ids, sorted (the order preference is counted in)."""
    from coord import Session, live_member_ids
    with Session(cluster.zk.hosts, cluster.env["LATCHWORK_CLUSTER"], timeout=5.0) as session:
        return sorted(live_member_ids(session) or ())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", choices=["embedded", "server"], default="embedded")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--load", type=float, default=1.2)
    parser.add_argument("--calibrate", type=int, default=2000)
    parser.add_argument("--stop-one", action="store_true")
    args = parser.parse_args()
    with zookeeper() as zk, rabbitmq() as mq, tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        server = None
        if args.graph == "server":
            server = GremlinServer(scratch / "gremlin-server", heap="4g")
            server.start()
            graph, pid = server.url, server.record.pid if server.record else None
        else:
            graph, pid = str(scratch / "graph.db"), None
        cluster = Cluster(args.graph, graph, zk, mq, scratch, pid)
        # a page a stopped node took is sent again to another within a few seconds
        cluster.client.close()
        cluster.client = Client(mq.url, f"bench-{args.graph}", timeout=REQUEST_TIMEOUT,
                                sender="bench")
        try:
            cluster.nodes = Nodes(cluster.env, 4)
            ids = cluster.enqueue(args.calibrate, lead=0.0)
            rate = len(ids) / cluster.drained(ids)
            print(f"drain rate: {rate:,.0f} tasks/s; load: {args.load} x that for "
                  f"{args.seconds:.0f} s", flush=True)
            order = members(cluster)
            stop, stopped_member = None, None
            if args.stop_one:  # node 0, whose member id holds its process id
                stop, pid0 = 0, cluster.nodes.procs[0].pid
                stopped_member = next(m for m in order if f":{pid0}:" in m)
            top, low = load(cluster, rate * args.load, args.seconds, stop)
            report(cluster, top, low, order, stopped_member, time.time())
        finally:
            cluster.close()
            if server is not None:
                server.kill()


def report(cluster: Cluster, top: list[tuple[str, float]], low: list[str],
           order: list[str], stopped: str | None, ended: float) -> None:
    deadline = time.monotonic() + 120
    waits: dict[str, float] = {}
    while len(waits) < len(top) and time.monotonic() < deadline:
        for task_id, sent in top:
            if task_id not in waits and (at := started_at(cluster, task_id)) is not None:
                # from when it was written, due at once (a page a stopped node took was
                # written after the client's timeout: not the loop's wait)
                written = cluster.store.tasks.get(task_id).created_at.timestamp()
                waits[task_id] = at - max(sent, written)
        time.sleep(0.5)
    never = len(top) - len(waits)
    groups = {"every top-priority task": list(waits)}
    if stopped is not None:
        index = order.index(stopped)
        groups[f"those preferred by the stopped member {stopped}"] = [
            t for t in waits if preferred_index(t, len(order)) == index]
    print("| top priority (5) | tasks | p50 wait, s | p99 | largest | over 2 s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, chosen in groups.items():
        values = [waits[t] for t in chosen] or [0.0]
        print(f"| {name} | {len(chosen)} | {percentile(values, 0.5):.2f} | "
              f"{percentile(values, 0.99):.2f} | {max(values):.2f} | "
              f"{sum(1 for v in values if v > 2.0)} |")
    if never:
        print(f"top-priority tasks never started within 120 s of the load's end: {never}")
    sample = low[::max(1, len(low) // 400)]
    ran = sum(1 for t in sample if (at := started_at(cluster, t)) is not None and at <= ended)
    print(f"priority 0: {len(low):,} submitted; of a sample of {len(sample)}, {ran} started by "
          f"the load's end")


if __name__ == "__main__":
    main()
