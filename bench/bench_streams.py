"""The lock-free queue and the concurrent exactly-once handler against their baselines, one run.

1. LockFreeQueue.push/s vs raw kazoo sequential-node creates/s on the same server (target
   ratio >= 0.5: a push is two writes and a read, a sequential create one write).
2. Input-to-output latency (p50) with 3 concurrent copies vs 1 copy (target ratio <= 1.2):
   the copies contend on one CAS, and only one transition wins at a time.
3. What kill -9 of the copy that is ahead adds to the latency of the inputs around it (3 copy
   processes, one input every 20 ms, five kills, each output timed by a watch on its slot),
   median and worst, against one transition (an input to its output with one copy; target:
   the kill adds no more) and against the session timeout a lock-based failover waits. The
   copies have beacons (coord.liveness): the follower the killed copy named steps in as soon
   as its connection closes. The same kills with no beacons (a follower steps in when the state
   has stood still with an input waiting for 1.5 times the delay it has seen the copy ahead
   take) and the same measure over windows of three inputs with no kill (the machine's own
   noise in that figure) are printed beside it.
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import threading
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
KILLS = 5
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
                    arrived = threading.Event()
                    # a consumer waits on a watch of the output slot, as a real one would
                    # (polling would take a core of this machine from the copies)
                    if not sink.watch(i, lambda _event, a=arrived: a.set()):
                        began = time.perf_counter()
                        source.push(b"1")
                        if not arrived.wait(30):
                            raise RuntimeError(f"no output {i} in 30 s")
                    else:
                        raise RuntimeError(f"output {i} before its input")
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


def _copy(hosts: str, tmp: str, n: int, name: str, liveness: str) -> NodeProcess:
    proc = NodeProcess(["-m", "coord.testing.streamcopy", hosts, "bench", name, f"{name}-in",
                        f"{name}-out", "0.05", "7", liveness], Path(tmp) / f"copy{n}.log",
                       name=f"c{n}")
    proc.start(30)
    return proc


def kill_gaps(hosts: str, name: str = "gap", liveness: str = "127.0.0.1"
              ) -> tuple[list[float], list[float], float]:
    """What kill -9 of the copy that is ahead adds to the latency of the inputs around it: 3
    copy processes, one input every 20 ms, KILLS kills (a random 0-4 ms after an input's
    push, so that some land mid-transition), each killed copy replaced 30 inputs later (its
    start-up would disturb the figures) and the next kill 30 inputs after that. Each output's
    time is taken by a watch on its slot. Returns, per kill, the longest latency of the three
    inputs from the kill on minus the median latency of the inputs before the first kill; the
    same measure over the windows of three inputs before the first kill (a control: what it
    gives with no kill at all, the machine's own noise); and that median. ``liveness`` is the
    copies' beacon host (``-``: none, the followers' timing alone)."""
    total = 100 + KILLS * 60 + 20
    with tempfile.TemporaryDirectory() as tmp:
        procs = [_copy(hosts, tmp, n, name, liveness) for n in range(3)]
        try:
            with Session(hosts, "bench", timeout=SESSION) as s:
                source, sink = LockFreeQueue(s, f"{name}-in"), LockFreeQueue(s, f"{name}-out")
                state = VersionedRegister(s, f"handlers/{name}/state")
                pushed: list[float] = []
                arrived = [0.0] * total
                events = [threading.Event() for _ in range(total)]

                def on_output(index: int) -> None:
                    arrived[index] = time.perf_counter()
                    events[index].set()

                for index in range(total):
                    if sink.watch(index, lambda _e, i=index: on_output(i)):
                        on_output(index)
                kills: list[int] = []
                for i in range(total):
                    pushed.append(time.perf_counter())
                    source.push(b"1")
                    if i >= 100 and (i - 100) % 60 == 0 and len(kills) < KILLS:
                        time.sleep(random.uniform(0, 0.004))
                        ahead = str(state.get()[0]["by"])  # the copy that wrote the state last
                        victim = next(p for p in procs if ahead.endswith(f":{p.pid}"))
                        victim.kill()
                        procs.remove(victim)
                        kills.append(i)
                    elif kills and i == kills[-1] + 30:
                        procs.append(_copy(hosts, tmp, 3 + len(kills), name, liveness))
                    time.sleep(INPUT_EVERY)
                for event in events:
                    if not event.wait(60):
                        raise RuntimeError("an output did not arrive within 60 s")
                latency = [a - p for a, p in zip(arrived, pushed, strict=True)]
                steady = statistics.median(latency[50:100])
                control = [max(latency[i:i + 3]) - steady for i in range(10, 100, 3)]
                return [max(latency[k:k + 3]) - steady for k in kills], control, steady
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
        added, control, steady = kill_gaps(hosts)
        timed, _, timed_steady = kill_gaps(hosts, "gap-timing", "-")
        step = transition(hosts)
    worst = max(added)
    print(f"raw kazoo sequential create: {raw:.0f}/s; LockFreeQueue.push: {ours:.0f}/s")
    print(f"input-to-output p50: 1 copy {one * 1000:.1f} ms, 3 copies {three * 1000:.1f} ms")
    print(f"kill -9 of the copy ahead, {KILLS} times (inputs every {INPUT_EVERY * 1000:.0f} ms,"
          f" latency {steady * 1000:.1f} ms before): latency added "
          + ", ".join(f"{a * 1000:.1f}" for a in added)
          + f" ms; median {statistics.median(added) * 1000:.1f} ms (session timeout {SESSION:g} s)")
    print("the same kills without beacons (patience alone): latency added "
          + ", ".join(f"{a * 1000:.1f}" for a in timed)
          + f" ms (latency {timed_steady * 1000:.1f} ms before); median "
          f"{statistics.median(timed) * 1000:.1f} ms, worst {max(timed) * 1000:.1f} ms")
    print(f"the same measure with no kill ({len(control)} windows of three inputs before the "
          f"first kill): median {statistics.median(control) * 1000:.1f} ms, worst "
          f"{max(control) * 1000:.1f} ms, over one transition in "
          f"{sum(c > step for c in control)} of {len(control)}")
    print(f"one transition (input to its output, one copy): {step * 1000:.1f} ms")
    print(f"ratio push/raw create: {ours / raw:.2f} (target >= 0.5)")
    print(f"ratio latency 3 copies/1 copy: {three / one:.2f} (target <= 1.2)")
    print(f"ratio worst kill gap/session timeout: {(steady + worst) / SESSION:.3f} "
          f"(a lock-based failover: >= 1)")
    print(f"ratio median latency a kill added/one transition: "
          f"{statistics.median(added) / step:.2f} (target: <= 1)")
    print(f"ratio worst latency a kill added/one transition: {worst / step:.2f} (target: <= 1)")
    print(f"ratio worst latency a kill added/one transition without beacons: "
          f"{max(timed) / step:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
