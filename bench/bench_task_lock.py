"""TaskLock try_acquire+release cycles/s vs raw kazoo Lock acquire+release, same server, one run.

Target: ratio >= 0.8. TaskLock also records the owner, returns a fencing token and deletes the
empty parent on release; kazoo's Lock does none of these. Distinct task ids per cycle (each task
has its own lock parent), which is how the runner uses them; the raw baseline uses the same ids.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kazoo.client import KazooClient

from bench._servers import zookeeper
from coord import Session, TaskLock

CYCLES = 2000
ROUNDS = 3


def raw_kazoo(hosts: str) -> float:
    client = KazooClient(hosts=hosts)
    client.start()
    client.ensure_path("/raw")
    try:
        started = time.perf_counter()
        for i in range(CYCLES):
            lock = client.Lock(f"/raw/t{i}", "member")
            lock.acquire()
            lock.release()
        return CYCLES / (time.perf_counter() - started)
    finally:
        client.stop()
        client.close()


def task_lock(hosts: str) -> float:
    with Session(hosts, "bench", timeout=10.0) as session:
        TaskLock(session, "warm", "m").try_acquire()  # creates /locks/tasks once
        started = time.perf_counter()
        for i in range(CYCLES):
            lock = TaskLock(session, f"t{i}", "member")
            if lock.try_acquire() is None:
                raise RuntimeError("uncontended lock refused")
            lock.release()
        return CYCLES / (time.perf_counter() - started)


def main() -> None:
    with zookeeper() as zk:
        raw_kazoo(zk.hosts)  # warm-up (JIT of the server, client imports)
        raws, ours = [], []
        for _ in range(ROUNDS):  # interleaved, best of each, so drift hits both alike
            raws.append(raw_kazoo(zk.hosts))
            ours.append(task_lock(zk.hosts))
    raw, mine = max(raws), max(ours)
    print(f"raw kazoo Lock acquire+release: {raw:8.0f} cycles/s (best of {ROUNDS})")
    print(f"TaskLock try_acquire+release:   {mine:8.0f} cycles/s (best of {ROUNDS})")
    print(f"ratio TaskLock/kazoo Lock: {mine / raw:.2f} (target >= 0.8)")


if __name__ == "__main__":
    main()
