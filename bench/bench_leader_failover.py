"""Leader failover after kill -9: seconds until another process leads, and ÷ session timeout.

Session timeout 4 s, tickTime 500 (expiry is rounded up to a tick). Target: failover <= session
timeout + 1 s. Three participants as separate processes; the leader is killed -9 each round.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._servers import zookeeper
from coord import Session, read_leader
from coord.testing import NodeProcess

SESSION = 4.0
ROUNDS = 3


def main() -> None:
    results = []
    with zookeeper(tick_ms=500) as zk, tempfile.TemporaryDirectory() as tmp, \
            Session(zk.hosts, "bench", timeout=SESSION) as reader:
        nodes: dict[str, NodeProcess] = {}

        def spawn() -> None:
            node = NodeProcess(["-m", "coord.testing.coordnode", "latch", zk.hosts, "bench",
                                str(SESSION)], Path(tmp) / f"n{len(nodes)}.log")
            nodes[node.start()] = node

        try:
            for _ in range(3):
                spawn()
            for _ in range(ROUNDS):
                while read_leader(reader) not in nodes:
                    time.sleep(0.01)
                leader = read_leader(reader)
                assert leader is not None
                victim = nodes.pop(leader)
                killed = time.monotonic()
                victim.kill()
                while read_leader(reader) not in nodes:
                    time.sleep(0.005)
                results.append(time.monotonic() - killed)
                print(f"failover {len(results)}: {results[-1]:.2f} s")
                spawn()  # keep three participants
        finally:
            for node in nodes.values():
                node.close()
    worst, median = max(results), statistics.median(results)
    print(f"session timeout {SESSION:.1f} s; median {median:.2f} s, worst {worst:.2f} s "
          f"(target <= {SESSION + 1:.1f} s)")
    print(f"ratio worst failover / session timeout: {worst / SESSION:.2f} "
          f"(target <= {(SESSION + 1) / SESSION:.2f})")


if __name__ == "__main__":
    main()
