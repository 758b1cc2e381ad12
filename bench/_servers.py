"""Shared by the benchmarks: private ZooKeeper and RabbitMQ servers for one run, stopped after,
and the nodes a bench starts."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from coord.testing import ZooKeeperCluster, terminate_all
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


def start_nodes(env: Mapping[str, str], count: int = 3, cwd: Path | None = None,
                logs: Path | None = None) -> list[subprocess.Popen[bytes]]:
    """``count`` ``latchwork node start`` processes (WARNING logs: to ``logs``/node-N.log when
    given, else dropped), each past its "joined" line; stop them with
    ``coord.testing.terminate_all``."""
    procs = []
    for n in range(count):
        with contextlib.ExitStack() as stack:  # the child keeps its own copy of the log file
            err = (subprocess.DEVNULL if logs is None
                   else stack.enter_context((logs / f"node-{n}.log").open("wb")))
            procs.append(subprocess.Popen([sys.executable, "-m", "runner.cli", "node", "start",
                                           "--log-level", "WARNING"], env=dict(env), cwd=cwd,
                                          stdout=subprocess.PIPE, stderr=err))
    try:
        for n, proc in enumerate(procs):
            joined(proc, logs / f"node-{n}.log" if logs is not None else None)
    except RuntimeError:
        terminate_all(procs)
        raise
    return procs


def joined(proc: subprocess.Popen[bytes], log: Path | None = None) -> None:
    """Wait for a started node's "joined" line; a node that exits before it (a graph it
    refuses, a broker out of reach) stops the bench, naming its log, instead of leaving the
    bench to measure the nodes that did start."""
    assert proc.stdout is not None
    line = proc.stdout.readline().decode(errors="replace")
    if "joined" not in line:
        proc.wait(10)
        said = log.read_text(errors="replace").strip()[-2000:] if log is not None else ""
        raise RuntimeError(f"a node did not start (exit {proc.returncode}); "
                           + (f"its log {log}:\n{said}" if log is not None
                              else "its log is not kept"))
