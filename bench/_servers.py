"""Shared by the benchmarks: private ZooKeeper and RabbitMQ servers for one run, stopped after."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from coord.testing import ZooKeeperCluster
from messaging.testing import RabbitMQServer


@contextmanager
def zookeeper(tick_ms: int = 500) -> Iterator[ZooKeeperCluster]:
    with tempfile.TemporaryDirectory(prefix="latchwork-bench-") as tmp:
        cluster = ZooKeeperCluster(Path(tmp) / "zk", 1, tick_ms)
        cluster.start()
        try:
            yield cluster
        finally:
            cluster.stop()


@contextmanager
def rabbitmq() -> Iterator[RabbitMQServer]:
    with tempfile.TemporaryDirectory(prefix="latchwork-bench-") as tmp:
        server = RabbitMQServer.on_free_ports(Path(tmp) / "rabbitmq")
        server.start()
        try:
            server.wait_ready()
            yield server
        finally:
            server.stop()
