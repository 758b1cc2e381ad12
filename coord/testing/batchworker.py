"""A randomised batch-series worker, run as a thread or as its own process (property tests).

``python -m coord.testing.batchworker HOSTS CLUSTER SERIES SEED TIMEOUT``: works the series
until it is COMPLETED (or FAILED), then prints one JSON line: the batches this worker finished
and the open-ended batches it closed. Each step is drawn from ``random.Random(SEED)``: a batch
of 1-7 positions or open-ended; then finish it, abort it, or abandon it (stop renewing, as a
worker killed -9 would, so it times out and someone else retries it).
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any

from coord import Session
from coord.batches import BatchClosed, BatchCoordinator, BatchLost, SeriesState


def work(session: Session, series: str, seed: int, timeout: float, owner: str,
         deadline: float = 60.0) -> dict[str, Any]:
    rng = random.Random(seed)
    coordinator = BatchCoordinator(session, series, timeout=timeout, max_in_progress=3,
                                   max_retrying=2, max_attempts=1000)
    finished: list[list[int]] = []
    closed: list[list[int]] = []
    double_closes = 0
    stop_at = time.monotonic() + deadline
    while time.monotonic() < stop_at:
        status = coordinator.status()
        if status.state is not SeriesState.OPEN:
            break
        size = None if rng.random() < 0.15 else rng.randint(1, 7)
        batch = coordinator.start_batch(owner, size)
        if batch is None:
            time.sleep(0.01)
            continue
        action = rng.random()
        try:
            if batch.end is None:
                end = batch.start + rng.randint(0, 5)
                if action < 0.5:
                    batch = coordinator.close_batch(batch, end)
                    closed.append([batch.no, end])
                    try:  # a second close must be refused
                        coordinator.close_batch(batch, end + 1)
                        double_closes += 1
                    except BatchClosed:
                        pass
            if action < 0.75:
                done = coordinator.finish(batch, rows=1, end=None if batch.end is not None
                                          else batch.start + rng.randint(0, 5))
                if batch.end is None:
                    closed.append([done.no, done.end or 0])
                finished.append([done.no, done.attempt, done.start, done.end or 0])
            elif action < 0.9:
                coordinator.abort(batch, f"random abort by {owner}")
            # else: abandoned; it times out
        except BatchLost:
            pass  # it timed out meanwhile and another worker took it
    return {"owner": owner, "finished": finished, "closed": closed,
            "double_closes": double_closes}


def main(argv: list[str]) -> int:
    hosts, cluster, series, seed, timeout = argv[0], argv[1], argv[2], int(argv[3]), float(argv[4])
    with Session(hosts, cluster, timeout=4.0) as session:
        print(json.dumps(work(session, series, seed, timeout, f"proc-{seed}")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
