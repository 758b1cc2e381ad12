"""Shared by the benchmarks: a private ZooKeeper started for one run, stopped afterwards."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from runner.devservers import ZooKeeperCluster


@contextmanager
def zookeeper(tick_ms: int = 500) -> Iterator[ZooKeeperCluster]:
    with tempfile.TemporaryDirectory(prefix="latchwork-bench-") as tmp:
        cluster = ZooKeeperCluster(Path(tmp) / "zk", 1, tick_ms)
        cluster.start()
        try:
            yield cluster
        finally:
            cluster.stop()
