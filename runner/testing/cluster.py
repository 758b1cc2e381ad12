"""A test cluster of ``latchwork node start`` subprocesses sharing one graph: a gremlite file,
or a Gremlin Server (``graph=ws://...``: one that runs one traversal at a time).

Tests drive it through the node API (:meth:`Cluster.request`, :meth:`Cluster.submit`) and the
real ``latchwork`` command as a subprocess (:meth:`Cluster.cli`); the store view reads the graph
file directly to check invariants. It never imports the CLI's code: what a user runs is what is
tested.
"""

from __future__ import annotations

import json
import os
import sqlite3
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coord.testing import NodeProcess, wait_until
from runner.client import Client
from runner.store import AttemptStatus, Store, Task, is_server, open_store

if TYPE_CHECKING:  # pytest imports the plugin itself (assertion rewriting)
    from messaging.testing.plugin import AmqpNamespace

CLUSTER = "r1"
SESSION = 2.0


@dataclass(frozen=True)
class CliResult:
    exit_code: int
    output: str


def log_problems(log: str) -> list[str]:
    """The node log's lines that must never appear for input from outside."""
    return [line for line in log.splitlines()
            if " ERROR " in line or " CRITICAL " in line or "Traceback" in line
            or "Exception in thread" in line]


class Cluster:
    """Node processes of one test cluster, a store view and a CLI."""

    def __init__(self, zk_hosts: str, amqp: AmqpNamespace, directory: Path,
                 spawn: Callable[..., NodeProcess], graph: str | None = None,
                 **settings: str) -> None:
        self.graph = graph or str(directory / "graph.db")
        self.remote = is_server(self.graph)
        remote = {"LATCHWORK_GRAPH_SERIAL_SERVER": "true"} if self.remote else {}
        self.env = {**os.environ, "LATCHWORK_CLUSTER": CLUSTER, "LATCHWORK_ZK_HOSTS": zk_hosts,
                    "LATCHWORK_AMQP_URL": amqp.url, "LATCHWORK_GRAPH": self.graph, **remote,
                    "LATCHWORK_SESSION_TIMEOUT": str(SESSION), "LATCHWORK_SCAN_INTERVAL": "1",
                    "LATCHWORK_REAP_INTERVAL": "0.5", "LATCHWORK_WORKERS": "2",
                    "LATCHWORK_SHUTDOWN_TIMEOUT": "10", "COLUMNS": "200",
                    **{f"LATCHWORK_{k.upper()}": v for k, v in settings.items()}}
        self.amqp = amqp
        self.spawn = spawn
        self.nodes: dict[str, NodeProcess] = {}
        # a shared server's graph is the last test's until the fixture clears it (which
        # stamps the current format): its format is not checked here
        self.store: Store = (
            open_store(self.graph, atomicity="serial", check_format=False) if self.remote
            else open_store(self.graph))

    def start_node(self, *args: str) -> str:
        """Start ``latchwork node start ARGS``; its member id once it joined."""
        node = self.spawn(["-m", "runner.cli", "node", "start", *args],
                          name=f"node{len(self.nodes)}",
                          env=self.env, ready_prefix="latchwork node")
        member = node.lines[-1].split()[2]
        self.nodes[member] = node
        return member

    def load_module(self, site: Path, name: str, code: str) -> Path:
        """Write ``code`` as the module ``name`` in the directory ``site`` and have the nodes
        started from now on load it (``PYTHONPATH``, the ``tasks`` setting), as a user's
        ``--tasks`` module; the module's path."""
        site.mkdir(parents=True, exist_ok=True)
        path = site / f"{name}.py"
        path.write_text(code)
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site),
                                                               self.env.get("PYTHONPATH")]))
        self.env["LATCHWORK_TASKS"] = json.dumps([name])
        return path

    def cli(self, *args: str, timeout: float = 60.0) -> CliResult:
        """Run ``latchwork ARGS`` against this cluster; stdout and stderr interleaved."""
        proc = subprocess.run([sys.executable, "-m", "runner.cli", *args], env=self.env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout, check=False)
        return CliResult(proc.returncode, proc.stdout)

    def start_without_tasks_setting(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run ``latchwork node start ARGS`` (the ``tasks`` setting emptied) to its exit: for a
        start that must be refused; stdout and stderr apart."""
        env = {**self.env, "LATCHWORK_TASKS": "[]"}
        return subprocess.run([sys.executable, "-m", "runner.cli", "node", "start", *args],
                              env=env, capture_output=True, text=True, timeout=60, check=False)

    def client(self, timeout: float = 10.0) -> Client:
        """A :class:`~runner.client.Client` of this cluster (close it, or use ``with``)."""
        return Client(self.env["LATCHWORK_AMQP_URL"], CLUSTER, timeout=timeout, sender="tests")

    def request(self, command: str, payload: dict[str, Any] | None = None,
                timeout: float = 10.0) -> Any:
        """One API request through whichever node answers (as a client would)."""
        with self.client(timeout) as client:
            return client.request(command, payload)

    def submit(self, task_type: str, payload: dict[str, Any], *,
               priority: int = 0, unique_key: str | None = None) -> str:
        with self.client() as client:
            return client.submit(task_type, payload, priority=priority,
                                 unique_key=unique_key).id

    def start_web(self, *args: str, scheme: str = "http", cafile: str | None = None,
                  **env: str) -> tuple[str, NodeProcess]:
        """Start ``latchwork web ARGS`` on a free port; its base URL once a static file
        answers (over TLS checked against ``cafile`` for ``https``), and its process."""
        from coord.testing import free_ports

        (port,) = free_ports(1)
        web = self.spawn(["-m", "runner.cli", "web", "--port", str(port), *args],
                         name=f"web{port}", env={**self.env, **env},
                         ready_prefix="latchwork web")
        url = f"{scheme}://127.0.0.1:{port}"
        context = ssl.create_default_context(cafile=cafile) if scheme == "https" else None

        def answers() -> bool:
            try:
                with urllib.request.urlopen(f"{url}/static/style.css", timeout=2,
                                            context=context) as r:
                    return bool(r.status == 200)
            except OSError:
                return False
        assert wait_until(answers, 30, 0.1), web.stderr_tail()
        return url, web

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

    def pause(self, member: str, tries: int = 50) -> None:
        """SIGSTOP ``member``'s node (a long GC pause) at a moment it holds no write lock on
        the shared graph file.

        The embedded graph is one SQLite file: a process frozen inside a write keeps the file's
        write lock, and every writer on the host waits for it (up to the busy timeout, then
        ``StoreUnavailable``) until it wakes or dies (docs/graph.md). A test that freezes an
        owner to see the cluster take its task over needs the others able to write, so the
        node is frozen, the write lock tried from here, and on a lock held the node is let go
        for a moment and frozen again."""
        node = self.nodes[member]
        if self.remote:  # a server holds no lock for a frozen client
            node.pause()
            return
        for _ in range(tries):
            node.pause()
            probe = sqlite3.connect(self.graph, timeout=0.5, isolation_level=None)
            try:
                probe.execute("BEGIN IMMEDIATE")
                probe.execute("ROLLBACK")
                return
            except sqlite3.OperationalError:
                node.resume()  # frozen inside a write (or another node was writing)
                time.sleep(0.01)
            finally:
                probe.close()
        raise AssertionError(f"{member}: the graph file stayed write-locked around {tries} "
                             "pauses")


