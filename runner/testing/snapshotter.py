"""A process exporting a snapshot, to be killed -9 mid-way and started again.

``python -m runner.testing.snapshotter ZK_HOSTS CLUSTER GRAPH_FILE ROOT SERIES CLASS PAGE_ROWS
PAUSE`` exports the avatars of CLASS from GRAPH_FILE into ``ROOT`` (a series' data directory)
with its progress in ZooKeeper (:func:`runner.pipeline.snapshot.write_snapshot`), printing
``PAGE <rows so far>`` after each page it recorded and waiting PAUSE seconds there (so a test
can kill it between two pages or in the middle of one), then ``DONE <rows>``; the pipeline's
log lines (``resuming at page N``) go to stderr.
"""

from __future__ import annotations

import logging
import sys
import time

from coord import Session
from runner.pipeline.snapshot import write_snapshot
from runner.pipeline.storage import SeriesPaths
from runner.store import open_store


def main(argv: list[str]) -> int:
    hosts, cluster, graph, root, series, cls, page_rows, pause = argv
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    logging.getLogger("latchwork").setLevel(logging.INFO)

    def report(done: int, total: int | None, message: str) -> None:
        print(f"PAGE {done}", flush=True)
        time.sleep(float(pause))

    with Session(hosts, cluster, timeout=4.0) as session, open_store(graph) as store:
        print("READY", flush=True)
        rows = write_snapshot(store, [cls], SeriesPaths(root), session, series,
                              page_rows=int(page_rows), report=report)
    print(f"DONE {rows}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
