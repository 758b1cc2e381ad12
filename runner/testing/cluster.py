"""A test cluster of ``latchwork node start`` subprocesses sharing one graph file."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from click.testing import CliRunner, Result

from coord.testing import NodeProcess, wait_until
from messaging.testing.plugin import AmqpNamespace
from runner.cli import cli
from runner.store import AttemptStatus, GraphStore, Task, open_store

CLUSTER = "r1"
SESSION = 2.0


class Cluster:
    """Node processes of one test cluster, a store view and a CLI."""

    def __init__(self, zk_hosts: str, amqp: AmqpNamespace, directory: Path,
                 spawn: Callable[..., NodeProcess], **settings: str) -> None:
        self.graph = str(directory / "graph.db")
        self.env = {**os.environ, "LATCHWORK_CLUSTER": CLUSTER, "LATCHWORK_ZK_HOSTS": zk_hosts,
                    "LATCHWORK_AMQP_URL": amqp.url, "LATCHWORK_GRAPH": self.graph,
                    "LATCHWORK_SESSION_TIMEOUT": str(SESSION), "LATCHWORK_SCAN_INTERVAL": "1",
                    "LATCHWORK_REAP_INTERVAL": "0.5", "LATCHWORK_WORKERS": "2",
                    "LATCHWORK_SHUTDOWN_TIMEOUT": "10", "COLUMNS": "200",
                    **{f"LATCHWORK_{k.upper()}": v for k, v in settings.items()}}
        self.spawn = spawn
        self.nodes: dict[str, NodeProcess] = {}
        self.store: GraphStore = open_store(self.graph)

    def start_node(self) -> str:
        node = self.spawn(["-m", "runner.cli", "node", "start"], name=f"node{len(self.nodes)}",
                          env=self.env, ready_prefix="latchwork node")
        member = node.lines[-1].split()[2]
        self.nodes[member] = node
        return member

    def cli(self, *args: str) -> Result:
        return CliRunner().invoke(cli, list(args), env=self.env, catch_exceptions=False)

    def submit(self, task_type: str, payload: dict[str, object], *extra: str) -> str:
        result = self.cli("task", "submit", task_type, "--payload", json.dumps(payload), *extra)
        assert result.exit_code == 0, result.output
        return result.output.strip()

    def task(self, task_id: str) -> Task:
        return self.store.tasks.get(task_id)

    def wait_finished(self, task_id: str, timeout: float = 30) -> Task:
        assert wait_until(lambda: self.task(task_id).finished, timeout, 0.1), self.task(task_id)
        return self.task(task_id)

    def wait_running_on(self, task_id: str, timeout: float = 30) -> str:
        def running() -> bool:
            return any(a.status is AttemptStatus.RUNNING
                       for a in self.store.attempts.for_task(task_id))
        assert wait_until(running, timeout, 0.05)
        (attempt,) = [a for a in self.store.attempts.for_task(task_id)
                      if a.status is AttemptStatus.RUNNING]
        return attempt.executor


