"""The web console's task list on a big graph: a filtered page of 50 out of 100,000 tasks and
200,000 attempts (issue target: under 200 ms at the server).

Builds an embedded graph (gremlite) of ``--tasks`` tasks, each with two attempts, across 12
types, 3 owners, 50 ordering keys and 5 resources, spread over a week of creation times and in
every state (85% finished, 5% skipped, 5% stopped, 5% due next year; cached in ``--dir``: built
once, ~5 minutes for 100,000; reused after), starts one
node on it and the console in-process (Starlette's test client, over a real client and
RabbitMQ), and times whole requests of ``/tasks`` with each kind of filter, the next page, and
the counts: the time at the server, the node's store read included. Baseline in the same run:
the same filtered page as the store reads it directly (no console, no broker).

Usage: ``python bench/bench_web_list.py [--tasks 100000] [--dir /tmp/latchwork-bench-web]``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._servers import rabbitmq, zookeeper
from runner.store import AttemptStatus, Task, TaskStatus, codec, open_store
from runner.store.gremlin.rows import task_props
from runner.store.gremlin.search import TaskFilter
from runner.store.gremlin.steps import add_vertex

TYPES = [f"bench.kind{i}" for i in range(12)]
OWNERS = ["host-a:101:aaaa", "host-b:202:bbbb", "host-c:303:cccc"]


def build(path: Path, count: int) -> None:
    store = open_store(str(path))
    rng = random.Random(7)
    start = codec.now() - timedelta(days=7)
    step = timedelta(days=7) / count
    made = 0
    batch: list[Task] = []

    def flush() -> None:
        def write(g: Any) -> None:
            for task in batch:
                add_vertex(g, "task", task_props(task)).iterate()
                for seq in (1, 2):
                    status = (AttemptStatus.CANCELLED_BY_SYSTEM if seq == 1
                              else AttemptStatus.SUCCEEDED)
                    began = task.created_at + timedelta(seconds=seq)
                    props = {
                        "attempt_id": str(uuid.uuid4()), "attempt_status": status.value,
                        "attempt_start": codec.encode_json({
                            "task": task.id, "seq": seq, "executor": task.owner,
                            "started": codec.encode_time(began), "fence": "1"}),
                        "attempt_end": codec.encode_json({
                            "ended": codec.encode_time(began + timedelta(seconds=1)),
                            "duration_ms": 1000}),
                        "attempt_end_day": began.strftime("%Y-%m-%d")}
                    at = g.V().has("task_id", task.id).as_("t")
                    add_vertex(at, "attempt", props).as_("a").add_e("has_attempt") \
                        .from_("t").to("a").iterate()
        store.graph.write(write)
        batch.clear()

    while made < count:
        created = start + step * made
        roll = rng.random()  # 85% finished, 5% skipped, 5% stopped, 5% due next year
        finished = roll < 0.9
        task = Task(id=str(uuid.uuid4()), type=rng.choice(TYPES), payload={"n": made},
                    active=not (0.9 <= roll < 0.95), status=TaskStatus.WAITING,
                    finished=finished, skipped=0.85 <= roll < 0.9,
                    priority=rng.randint(0, 3), created_at=created,
                    updated_at=created, version=3, fence=1, owner=rng.choice(OWNERS),
                    attempts=2, run_at=codec.now() + timedelta(days=365) if roll >= 0.95
                    else None,
                    ordering_key=f"key-{rng.randrange(50)}" if rng.random() < 0.2 else None,
                    resources=(f"res-{rng.randrange(5)}",) if rng.random() < 0.1 else ())
        batch.append(task)
        made += 1
        if len(batch) == 10:
            flush()
        if made % 10_000 == 0:
            print(f"built {made} tasks", flush=True)
    if batch:
        flush()
    store.close()


def timed(fn: object, runs: int = 7) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--dir", type=Path,
                        default=Path(tempfile.gettempdir()) / "latchwork-bench-web")
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    graph = args.dir / f"graph-v3-{args.tasks}.db"
    if not graph.exists():
        t0 = time.monotonic()
        partial = graph.with_suffix(".partial")
        for leftover in args.dir.glob(partial.name + "*"):
            leftover.unlink()
        build(partial, args.tasks)
        partial.rename(graph)
        print(f"graph of {args.tasks} tasks and {2 * args.tasks} attempts built in "
              f"{time.monotonic() - t0:.0f} s")
    from starlette.testclient import TestClient

    from runner.config import Settings
    from runner.node.node import Node
    from runner.web.app import create_app

    queries = ["", "type:bench.kind3", "state:stopped", "type:bench.kind5 state:finished",
               f"owner:{OWNERS[1]}", "key:key-7", "resource:res-2",
               f"type:bench.kind1 owner:{OWNERS[0]} state:finished"]
    with zookeeper() as zk_cluster, rabbitmq() as broker:
        zk, amqp_url = zk_cluster.hosts, broker.url
        # the node's own rounds (scans, the master's incident round over stopped tasks) are
        # pushed out of the measurement: what is timed is the console's requests
        settings = Settings(cluster="benchweb", zk_hosts=zk, amqp_url=amqp_url,
                            graph=str(graph), scan_interval=3600, reap_interval=3600)
        with Node(settings) as node:
            from runner.client import Client
            web = TestClient(create_app(lambda: Client(amqp_url, "benchweb", timeout=30)))
            store = node.store
            print(f"{'query':<50} {'page ms':>8} {'next ms':>8} {'counts ms':>9} "
                  f"{'store ms':>8}")
            worst = 0.0
            for q in queries:
                first = web.get("/tasks", params={"q": q})
                assert first.status_code == 200, first.text[:500]
                page = timed(lambda q=q: web.get("/tasks", params={"q": q}))
                cursor = _next(first.text)
                later = timed(lambda q=q, c=cursor: web.get(
                    "/tasks", params={"q": q, "before": c})) if cursor else float("nan")
                counts = timed(lambda q=q: web.get("/tasks/counts", params={"q": q}), 3)
                where = _filter(q)
                direct = timed(lambda w=where: store.search.page(w, None, 50))
                worst = max(worst, page, later if cursor else 0.0)
                print(f"{q or '(all)':<50} {page:8.1f} {later:8.1f} {counts:9.1f} "
                      f"{direct:8.1f}")
            print(f"worst page of 50 at the server: {worst:.1f} ms (target < 200 ms); "
                  f"graph {os.path.getsize(graph) / 1e6:.0f} MB")
    return 0


def _next(html: str) -> str | None:
    import html as html_lib
    import re
    from urllib.parse import parse_qs, urlsplit
    found = re.search(r'href="([^"]+)" id="older"', html)
    if not found:
        return None
    return parse_qs(urlsplit(html_lib.unescape(found.group(1))).query)["before"][0]


def _filter(q: str) -> TaskFilter:
    from runner.web.views import parse_query
    query = parse_query(q)
    return TaskFilter(**query.filters, resource=query.resource)


if __name__ == "__main__":
    sys.exit(main())
