"""``python -m runner.testing.streamnode HOSTS CLUSTER GRAPH``: one copy of the built-in
moving-average stream (``readings`` -> ``averages``, crossings counted in the graph file
GRAPH), without a node around it. Prints ``READY``, steps until SIGTERM; a participant for tests
that kill and restart copies at random."""

from __future__ import annotations

import signal
import sys
import threading

from coord import ExactlyOnceHandler, LockFreeQueue, Session
from runner.store import open_store
from runner.tasks.features.example_stream import EXAMPLE, AveragesOutput, moving_average


def main(argv: list[str]) -> int:
    hosts, cluster, graph = argv
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with Session(hosts, cluster, timeout=4.0) as session, open_store(graph) as store:
        handler = ExactlyOnceHandler(session, EXAMPLE, [LockFreeQueue(session, "readings")],
                                     AveragesOutput(session, store), moving_average(),
                                     initial_state={"window": [], "over": False}, batch=50)
        print("READY", flush=True)
        handler.run(stop, idle=0.02)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
