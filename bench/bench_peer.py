"""The peer: Celery 5 with RabbitMQ on this box, set up the way a user who must not lose a task
would (3 prefork worker processes, ``acks_late``, ``task_reject_on_worker_lost``, prefetch 1,
no result backend), measured on the same work as bench/bench_runner.py:

1. **drain**: ``THROUGHPUT_TASKS`` tasks that do nothing, published before the workers start;
   tasks/s from the first start to the last end, the median of ``ROUNDS`` rounds;
2. **submit to start, paced**: one task every 50 ms, the time from just before its publish to
   the start of its body (both clocks of this host), p50 and p99;
3. **one-second tasks**: 60 tasks of 1 s on the 3 workers, the wall time from the first start
   to the last end against the ideal 20 s.

A task records its start and end as one line appended to a file of its worker process (no
result backend: the bench reads the files). ``measure(amqp_url)`` is what bench_runner.py
calls to print both runners side by side from one run; run alone, this script starts its own
RabbitMQ. Celery is a bench-only dependency: ``pip install -e '.[bench]'`` (``make bench``).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

WORKERS = 3
THROUGHPUT_TASKS = 1000
ROUNDS = 3
LATENCY_TASKS = 300  # paced, 50 ms apart: a p99 of 60 was their largest
SLOW_TASKS, SLOW_SECONDS = 60, 1.0

APP = textwrap.dedent('''
    import os, time
    from celery import Celery

    app = Celery("peer", broker=os.environ["PEER_BROKER"])
    app.conf.update(task_acks_late=True, task_reject_on_worker_lost=True,
                    worker_prefetch_multiplier=1, task_ignore_result=True,
                    result_backend=None, broker_connection_retry_on_startup=True,
                    worker_hijack_root_logger=False, task_default_queue=os.environ["PEER_QUEUE"])
    RECORDS = os.environ["PEER_RECORDS"]

    @app.task(name="peer.sleep")
    def sleep(seconds, sent):
        began = time.time()
        if seconds:
            time.sleep(seconds)
        with open(os.path.join(RECORDS, str(os.getpid())), "a") as out:
            out.write(f"{sent} {began} {time.time()}\\n")
''')


def _records(directory: Path) -> list[tuple[float, float, float]]:
    rows = []
    for path in directory.iterdir():
        for line in path.read_text().splitlines():
            sent, began, ended = (float(x) for x in line.split())
            rows.append((sent, began, ended))
    return rows


class Peer:
    """A Celery app in a scratch directory, its workers started and stopped per measurement."""

    def __init__(self, amqp_url: str, scratch: Path) -> None:
        self.scratch = scratch
        (scratch / "peer_app.py").write_text(APP)
        self.round = 0
        self.env = {**os.environ, "PEER_BROKER": amqp_url,
                    "PYTHONPATH": str(scratch)}
        sys.path.insert(0, str(scratch))
        self.records = scratch / "records"

    def _fresh(self) -> None:
        """A new queue and record directory per measurement: nothing left from the last."""
        self.round += 1
        self.queue = f"peer-{os.getpid()}-{self.round}"
        self.records = self.scratch / f"records-{self.round}"
        self.records.mkdir()
        self.env.update(PEER_QUEUE=self.queue, PEER_RECORDS=str(self.records))
        os.environ.update(PEER_BROKER=self.env["PEER_BROKER"], PEER_QUEUE=self.queue,
                          PEER_RECORDS=str(self.records))
        for name in [m for m in sys.modules if m == "peer_app"]:
            del sys.modules[name]
        import peer_app  # type: ignore[import-not-found]
        self.app: Any = peer_app.app
        self.app.conf.task_default_queue = self.queue

    def _workers(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "peer_app", "worker", "--pool", "prefork",
             "--concurrency", str(WORKERS), "--prefetch-multiplier", "1", "-Q", self.queue,
             "--without-gossip", "--without-mingle", "--without-heartbeat",
             "--loglevel", "WARNING", "-n", f"peer{self.round}@%h"],
            env=self.env, cwd=self.scratch, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)

    def _stop(self, workers: subprocess.Popen[bytes]) -> None:
        os.killpg(workers.pid, signal.SIGTERM)
        try:
            workers.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(workers.pid, signal.SIGKILL)
            workers.wait()

    def _wait_for(self, count: int, timeout: float) -> list[tuple[float, float, float]]:
        deadline = time.monotonic() + timeout
        while True:
            rows = _records(self.records)
            if len(rows) >= count:
                return rows
            if time.monotonic() > deadline:
                raise RuntimeError(f"celery ran {len(rows)} of {count} tasks in {timeout}s")
            time.sleep(0.1)

    def _send(self, seconds: float) -> None:
        self.app.send_task("peer.sleep", args=(seconds, time.time()), queue=self.queue)

    def drain(self, count: int) -> float:
        self._fresh()
        with self.app.connection_for_write() as conn, self.app.producer_or_acquire(conn):
            for _ in range(count):
                self._send(0)
        workers = self._workers()
        try:
            rows = self._wait_for(count, 300)
        finally:
            self._stop(workers)
        return count / (max(r[2] for r in rows) - min(r[1] for r in rows))

    def paced(self, count: int, every: float = 0.05) -> list[float]:
        self._fresh()
        workers = self._workers()
        try:
            self._send(0)  # warm: the pool is up and consuming
            self._wait_for(1, 60)
            for n in range(count):
                self._send(0)
                self._wait_for(n + 2, 30)
                time.sleep(every)
            rows = sorted(_records(self.records))[1:]
        finally:
            self._stop(workers)
        return sorted(began - sent for sent, began, _ in rows)

    def slow(self, count: int, seconds: float) -> float:
        self._fresh()
        workers = self._workers()
        try:
            self._send(0)
            self._wait_for(1, 60)
            for _ in range(count):
                self._send(seconds)
            rows = sorted(self._wait_for(count + 1, 300))[1:]
        finally:
            self._stop(workers)
        return max(r[2] for r in rows) - min(r[1] for r in rows)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(amqp_url: str, *, rounds: int = ROUNDS,
            tasks: int = THROUGHPUT_TASKS) -> dict[str, Any]:
    """Celery's figures on the broker at ``amqp_url`` (see the module)."""
    with tempfile.TemporaryDirectory(prefix="latchwork-peer-") as scratch:
        peer = Peer(amqp_url, Path(scratch))
        drains = [peer.drain(tasks) for _ in range(rounds)]
        latencies = peer.paced(LATENCY_TASKS)
        slow = peer.slow(SLOW_TASKS, SLOW_SECONDS)
    return {"drain_per_s": statistics.median(drains), "drains": drains,
            "p50_ms": statistics.median(latencies) * 1000,
            "p99_ms": percentile(latencies, 0.99) * 1000,
            "slow_s": slow, "slow_ideal_s": SLOW_TASKS * SLOW_SECONDS / WORKERS}


def main() -> None:
    from bench._servers import rabbitmq
    with rabbitmq() as mq:
        figures = measure(mq.url)
    print(json.dumps(figures, indent=1))
    print(f"celery: drain {figures['drain_per_s']:.0f} tasks/s; submit->start p50 "
          f"{figures['p50_ms']:.2f} ms, p99 {figures['p99_ms']:.2f} ms; {SLOW_TASKS} x "
          f"{SLOW_SECONDS:g} s tasks in {figures['slow_s']:.2f} s "
          f"({figures['slow_s'] / figures['slow_ideal_s']:.3f}x the ideal)")


if __name__ == "__main__":
    main()
