"""The lock-free queue and the concurrent exactly-once handler against their baselines, one run.

1. LockFreeQueue.push/s vs raw kazoo sequential-node creates/s on the same server (target
   ratio >= 0.5: a push is two writes and a read, a sequential create one write).
2. Input-to-output latency (p50) with 3 concurrent copies vs 1 copy (target ratio <= 1.2):
   the copies contend on one CAS, and only one transition wins at a time.
3. The output gap when a copy is killed -9 (3 copy processes, one input every 20 ms): the
   longest pause between two outputs around the kill, vs the session timeout a lock-based
   failover waits (target: no longer than a few transitions, far below the session timeout).
"""

from __future__ import annotations

import itertools
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kazoo.client import KazooClient

from bench._servers import zookeeper
from coord import ExactlyOnceHandler, LockFreeQueue, QueueOutput, Session
from coord.testing import NodeProcess
from coord.testing.streamcopy import running_sum

PUSHES = 1000
INPUTS = 150
SESSION = 4.0


def raw_sequential(hosts: str) -> float:
    client = KazooClient(hosts=hosts)
    client.start()
    client.ensure_path("/raw")
    try:
        started = time.perf_counter()
        for i in range(PUSHES):
            client.create("/raw/e-", str(i).encode(), sequence=True)
        return PUSHES / (time.perf_counter() - started)
    finally:
        client.stop()
        client.close()


def pushes(hosts: str) -> float:
    with Session(hosts, "bench", timeout=SESSION) as s:
        queue = LockFreeQueue(s, "push")
        started = time.perf_counter()
        for i in range(PUSHES):
            queue.push(str(i).encode())
        return PUSHES / (time.perf_counter() - started)


def latency(hosts: str, copies: int, name: str) -> float:
    """p50 seconds from a push to its output, ``copies`` handler copies in threads."""
    stop = threading.Event()
    sessions = [Session(hosts, "bench", timeout=SESSION).start() for _ in range(copies)]
    threads = []
    try:
        for s in sessions:
            handler = ExactlyOnceHandler(s, name, [LockFreeQueue(s, f"{name}-in")],
                                         QueueOutput(LockFreeQueue(s, f"{name}-out")),
                                         running_sum, initial_state=0, batch=10)
            threads.append(threading.Thread(target=handler.run, args=(stop, 0.001)))
        for t in threads:
            t.start()
        source = LockFreeQueue(sessions[0], f"{name}-in")
        sink = LockFreeQueue(sessions[0], f"{name}-out")
        samples = []
        for i in range(INPUTS):
            began = time.perf_counter()
            source.push(b"1")
            while sink.get(i) is None:
                time.sleep(0.0005)
            samples.append(time.perf_counter() - began)
        return statistics.median(samples)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        for s in sessions:
            s.close()


def kill_gap(hosts: str) -> float:
    """The longest pause between outputs around kill -9 of one of 3 copy processes."""
    with tempfile.TemporaryDirectory() as tmp:
        procs = [NodeProcess(["-m", "coord.testing.streamcopy", hosts, "bench", "gap",
                              "gap-in", "gap-out"], Path(tmp) / f"copy{i}.log", name=f"c{i}")
                 for i in range(3)]
        for p in procs:
            p.start(30)
        try:
            with Session(hosts, "bench", timeout=SESSION) as s:
                source, sink = LockFreeQueue(s, "gap-in"), LockFreeQueue(s, "gap-out")
                seen: list[float] = []
                for i in range(300):
                    source.push(b"1")
                    if i == 150:
                        procs[0].kill()
                    time.sleep(0.02)
                    while sink.end() > len(seen):
                        seen.append(time.perf_counter())
                while sink.end() < 300:
                    time.sleep(0.005)
                    while sink.end() > len(seen):
                        seen.append(time.perf_counter())
                return max(b - a for a, b in itertools.pairwise(seen))
        finally:
            for p in procs:
                p.close()


def main() -> int:
    with zookeeper() as zk:
        hosts = zk.hosts
        raw = raw_sequential(hosts)
        ours = pushes(hosts)
        one = latency(hosts, 1, "one")
        three = latency(hosts, 3, "three")
        gap = kill_gap(hosts)
    print(f"raw kazoo sequential create: {raw:.0f}/s; LockFreeQueue.push: {ours:.0f}/s")
    print(f"input-to-output p50: 1 copy {one * 1000:.1f} ms, 3 copies {three * 1000:.1f} ms")
    print(f"longest output gap around kill -9 of a copy: {gap * 1000:.0f} ms "
          f"(session timeout {SESSION:g} s)")
    print(f"ratio push/raw create: {ours / raw:.2f} (target >= 0.5)")
    print(f"ratio latency 3 copies/1 copy: {three / one:.2f} (target <= 1.2)")
    print(f"ratio kill gap/session timeout: {gap / SESSION:.3f} (a lock-based failover: >= 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
