"""``python -m coord.testing.streamcopy HOSTS CLUSTER NAME INPUT OUTPUT [FOLLOWER_IDLE [BATCH
[LIVENESS]]]``: one copy of an ExactlyOnceHandler computing running sums of the integers in INPUT
into OUTPUT (one output per input: the sum so far; a follower steps in after FOLLOWER_IDLE
seconds of a stalled state, default 0.05, or as soon as the copy ahead's process is gone: its
beacon listens on LIVENESS, default 127.0.0.1; ``-`` for none, timing alone).
Prints ``READY``, then steps until SIGTERM; a participant for kill -9 / SIGSTOP tests of
concurrent copies."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

from coord import BadInput, Session
from coord.exactly_once import ExactlyOnceHandler, QueueOutput
from coord.queue import LockFreeQueue


def running_sum(state: Any, inputs: list[tuple[str, int, bytes]]) -> tuple[Any, list[bytes]]:
    """The running sum of integers; anything else is refused (BadInput: a dead letter)."""
    total = int(state or 0)
    outputs = []
    for queue, index, value in inputs:
        try:
            total += int(value)
        except ValueError:
            raise BadInput(f"{queue}@{index}: not an integer: {value[:40]!r}") from None
        outputs.append(str(total).encode())
    return total, outputs


def main(argv: list[str]) -> int:
    hosts, cluster, name, source, sink = argv[:5]
    follower_idle = float(argv[5]) if len(argv) > 5 else 0.05
    batch = int(argv[6]) if len(argv) > 6 else 7
    liveness = argv[7] if len(argv) > 7 else "127.0.0.1"
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with Session(hosts, cluster, timeout=4.0) as session:
        handler = ExactlyOnceHandler(session, name, [LockFreeQueue(session, source)],
                                     QueueOutput(LockFreeQueue(session, sink)), running_sum,
                                     initial_state=0, batch=batch,
                                     liveness=None if liveness == "-" else liveness)
        print("READY", flush=True)
        handler.run(stop, idle=0.5, follower_idle=follower_idle)
        print(f"STOPPED won={handler.won} lost={handler.lost} "
              f"gone={handler.stepped_in['gone']} patience={handler.stepped_in['patience']}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
