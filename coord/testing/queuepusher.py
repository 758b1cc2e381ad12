"""``python -m coord.testing.queuepusher HOSTS CLUSTER QUEUE WORKER COUNT``: pushes
``WORKER-<n>`` for n in 0..COUNT-1 to a LockFreeQueue, printing ``P <value> <index>`` after each
push; prints ``READY`` first and ``DONE`` last. A participant for kill -9 / SIGSTOP tests."""

from __future__ import annotations

import sys

from coord import Session
from coord.queue import LockFreeQueue


def main(argv: list[str]) -> int:
    hosts, cluster, queue_name, worker, count = argv
    with Session(hosts, cluster, timeout=4.0) as session:
        queue = LockFreeQueue(session, queue_name)
        print("READY", flush=True)
        for n in range(int(count)):
            value = f"{worker}-{n}"
            index = queue.push(value.encode())
            print(f"P {value} {index}", flush=True)
        print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
