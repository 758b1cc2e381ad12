"""The lock-free queue and the concurrent exactly-once handler against their baselines, one run.

1. LockFreeQueue.push/s vs raw kazoo sequential-node creates/s on the same server (target
   ratio >= 0.5: a push is two writes and a read, a sequential create one write).
2. Input-to-output latency (p50) with 3 concurrent copies vs 1 copy (target ratio <= 1.2):
   the copies contend on one CAS, and only one transition wins at a time.
3. The output gap when the copy that is ahead is killed -9 (3 copy processes, one input every
   20 ms): the longest pause between two outputs around the kill, the longest one before it
   (the inputs' own pace) and what the kill added, against one transition (an input to its
   output with one copy; target: the kill adds no more) and against the session timeout a
   lock-based failover waits. A follower steps in when the state has stood still with an
   input waiting for three times the delay it has seen the copy ahead take (50 ms at most).
"""

from __future__ import annotations

import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kazoo.client import KazooClient

from bench._servers import zookeeper
from coord import LockFreeQueue, Session, VersionedRegister
from coord.testing import NodeProcess

PUSHES = 1000
INPUTS = 150
ROUNDS = 3
SESSION = 4.0
INPUT_EVERY = 0.02


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


def latency(hosts: str, copies: int, name: str) -> list[float]:
    """Seconds from a push to its output, ``copies`` handler copies as processes (as on
    distinct nodes), waiting on watches of their next input."""
    with tempfile.TemporaryDirectory() as tmp:
        procs = [NodeProcess(["-m", "coord.testing.streamcopy", hosts, "bench", name,
                              f"{name}-in", f"{name}-out", "0.05", "10"],
                             Path(tmp) / f"copy{i}.log", name=f"{name}{i}")
                 for i in range(copies)]
        for p in procs:
            p.start(30)
        try:
            with Session(hosts, "bench", timeout=SESSION) as s:
                source, sink = LockFreeQueue(s, f"{name}-in"), LockFreeQueue(s, f"{name}-out")
                samples = []
                for i in range(INPUTS):
                    began = time.perf_counter()
                    source.push(b"1")
                    while sink.get(i) is None:
                        time.sleep(0.0005)
                    samples.append(time.perf_counter() - began)
                    time.sleep(0.005)
                return samples
        finally:
            for p in procs:
                p.close()


def transition(hosts: str) -> float:
    """One transition here: the p50 time from an input to its output with one copy (its CASes
    through HANDLING, PREPARING and WRITING, and the output's push)."""
    return statistics.median(latency(hosts, 1, "step"))


def kill_gap(hosts: str) -> tuple[float, float]:
    """The longest pause between outputs around kill -9 of the copy that is ahead, of 3 copy
    processes (followers step in after 50 ms of a stalled state), one input every 20 ms."""
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
                state = VersionedRegister(s, "handlers/gap/state")
                killed = None
                kill_at = 0
                for i in range(300):
                    source.push(b"1")
                    if i == 150:  # kill -9 the copy that wrote the state last: the one ahead
                        ahead = str(state.get()[0]["by"])
                        killed = next(p for p in procs if ahead.endswith(f":{p.pid}"))
                        killed.kill()
                        kill_at = len(seen)
                    time.sleep(INPUT_EVERY)
                    while sink.end() > len(seen):
                        seen.append(time.perf_counter())
                while sink.end() < 300:
                    time.sleep(0.005)
                    while sink.end() > len(seen):
                        seen.append(time.perf_counter())
                gaps = [b - a for a, b in itertools.pairwise(seen)]
                # after the followers learned the copy ahead's pace (the first 50 outputs)
                return max(gaps[kill_at - 1:]), max(gaps[50:kill_at - 1])
        finally:
            for p in procs:
                p.close()


def main() -> int:
    with zookeeper() as zk:
        hosts = zk.hosts
        raw = raw_sequential(hosts)
        ours = pushes(hosts)
        # alternated rounds, so that the machine's drift weighs on both alike
        ones: list[float] = []
        threes: list[float] = []
        for r in range(ROUNDS):
            ones += latency(hosts, 1, f"one{r}")
            threes += latency(hosts, 3, f"three{r}")
        one, three = statistics.median(ones), statistics.median(threes)
        gap, steady = kill_gap(hosts)
        step = transition(hosts)
    extra = gap - steady
    print(f"raw kazoo sequential create: {raw:.0f}/s; LockFreeQueue.push: {ours:.0f}/s")
    print(f"input-to-output p50: 1 copy {one * 1000:.1f} ms, 3 copies {three * 1000:.1f} ms")
    print(f"longest output gap around kill -9 of a copy: {gap * 1000:.0f} ms; longest gap "
          f"before it {steady * 1000:.0f} ms (inputs every {INPUT_EVERY * 1000:.0f} ms); "
          f"the kill added {extra * 1000:.0f} ms (session timeout {SESSION:g} s)")
    print(f"one transition (input to its output, one copy): {step * 1000:.1f} ms")
    print(f"ratio push/raw create: {ours / raw:.2f} (target >= 0.5)")
    print(f"ratio latency 3 copies/1 copy: {three / one:.2f} (target <= 1.2)")
    print(f"ratio kill gap/session timeout: {gap / SESSION:.3f} (a lock-based failover: >= 1)")
    print(f"ratio gap the kill added/one transition: {extra / step:.2f} (target: <= 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
