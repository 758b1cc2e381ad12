"""A Spark standalone cluster on this host: one Master and N Workers, on loopback (or on a host's
address inside its network namespace: ``host``, ``netns``; docs/testing.md).

The pyspark distribution ships ``bin/spark-class`` and the jars a standalone cluster needs, so
nothing is downloaded: the Master is ``org.apache.spark.deploy.master.Master`` and each Worker
``org.apache.spark.deploy.worker.Worker``, each a JVM in a session of its own, its log and work
directory under one directory of the caller's. Ports are picked like the other dev servers'
(or given, for ``latchwork dev up --spark-workers N``). The Master's status comes from its own
web UI's ``/json/`` (on the cluster's address).

Failure behaviour:

* no ``java`` on the PATH: :class:`~coord.testing.processes.MissingPackage` naming the Debian
  package, before anything is started; a taken port: :class:`PortInUse`;
* a Master or Worker that does not come up (or dies) in time: :class:`ServerNotReady` with its
  log tail, and :meth:`SparkStandalone.start` stops what it started;
* :meth:`SparkStandalone.kill_worker` is kill -9 of a Worker's process group: the Worker and
  the executors it launched die together, as on a host that is lost. Running tasks on them
  fail with ``ExecutorLostFailure`` and Spark retries them on the other executors;
* stopping only signals the recorded process groups while the leader is still ours.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coord.testing.ports import check_ports_free, free_ports
from coord.testing.processes import (
    LOOPBACK,
    MissingPackage,
    ProcessRecord,
    ServerNotReady,
    in_netns,
    reap,
    spawn,
    tail,
)


def spark_home() -> Path:
    """The pyspark distribution's directory (it holds ``bin/spark-class`` and ``jars/``)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def check_spark_installed() -> None:
    if shutil.which("java") is None:
        raise MissingPackage("default-jre-headless", "java")
    if not (spark_home() / "bin" / "spark-class").exists():
        raise ServerNotReady(f"{spark_home()}/bin/spark-class is missing: reinstall pyspark")


@dataclass
class SparkDaemon:
    """One Master or Worker JVM."""

    name: str
    directory: Path
    argv: list[str]
    ui_port: int
    record: ProcessRecord | None = None
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    host: str = LOOPBACK

    @property
    def log_path(self) -> Path:
        return self.directory / f"{self.name}.log"

    def start(self, env: dict[str, str]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._proc, self.record = spawn(self.name, self.argv, self.log_path, env=env,
                                        cwd=self.directory)

    def alive(self) -> bool:
        return self.record is not None and self.record.is_ours()

    def ui_json(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.ui_port}/json/",
                                        timeout=2) as reply:
                value: dict[str, Any] = json.loads(reply.read())
                return value
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def stop(self) -> None:
        if self.record is not None:
            self.record.stop(timeout=15.0, group=True)
        reap(self._proc)

    def kill(self) -> None:
        """kill -9 of the process group: the daemon and what it launched (executors)."""
        if self.record is not None:
            self.record.signal(signal.SIGKILL, group=True)
            self.record.wait_gone(10.0)
        reap(self._proc)


@dataclass
class SparkStandalone:
    """A Master and ``workers`` Workers (``cores`` and ``memory`` each) under ``directory``."""

    directory: Path
    workers: int = 2
    cores: int = 2
    memory: str = "1g"
    master_port: int = 0
    ports: list[int] = field(default_factory=list)  # master UI, then (port, UI) per worker
    master: SparkDaemon | None = None
    worker_daemons: list[SparkDaemon] = field(default_factory=list)
    #: the address the Master and Workers listen on, and the namespace they run in (a host of
    #: their own: coord.testing.hosts)
    host: str = LOOPBACK
    netns: str | None = None

    def __post_init__(self) -> None:
        self.directory = self.directory.resolve()
        if not self.master_port:
            picked = free_ports(2 + 2 * self.workers)
            self.master_port, self.ports = picked[0], picked[1:]
        elif not self.ports:  # given a base: the next ports, predictable for users
            self.ports = [self.master_port + 1 + i for i in range(1 + 2 * self.workers)]

    @property
    def url(self) -> str:
        return f"spark://{self.host}:{self.master_port}"

    @property
    def master_ui_port(self) -> int:
        return self.ports[0]

    def port_map(self) -> dict[str, int]:
        found = {"spark master": self.master_port, "spark master UI": self.master_ui_port}
        for i in range(self.workers):
            found[f"spark worker {i}"] = self.ports[1 + 2 * i]
            found[f"spark worker {i} UI"] = self.ports[2 + 2 * i]
        return found

    def env(self) -> dict[str, str]:
        home = spark_home()
        return {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": self.host,
                "SPARK_LOG_DIR": str(self.directory / "logs"),
                "SPARK_WORKER_DIR": str(self.directory / "work"),
                # executors run Python (if a job needs it) with the interpreter of this venv
                "PYSPARK_PYTHON": sys.executable,
                "SPARK_DAEMON_MEMORY": "256m", "SPARK_NO_DAEMONIZE": "1"}

    def start(self, timeout: float = 90.0) -> None:
        check_spark_installed()
        if self.netns is None:
            check_ports_free(self.port_map())
        spark_class = str(spark_home() / "bin" / "spark-class")
        env = self.env()
        self.master = SparkDaemon(
            "spark-master", self.directory / "master",
            in_netns(self.netns, [spark_class, "org.apache.spark.deploy.master.Master", "--host",
                                  self.host, "--port", str(self.master_port), "--webui-port",
                                  str(self.master_ui_port)]),
            self.master_ui_port, host=self.host)
        try:
            self.master.start(env)
            self._wait(lambda: (self.master.ui_json() or {}).get("status") == "ALIVE"
                       if self.master else False, timeout, self.master)
            for i in range(self.workers):
                self.start_worker(i, env)
            self.wait_workers(self.workers, timeout)
        except BaseException:
            self.stop()
            raise

    def start_worker(self, index: int, env: dict[str, str] | None = None) -> SparkDaemon:
        port, ui = self.ports[1 + 2 * index], self.ports[2 + 2 * index]
        daemon = SparkDaemon(
            f"spark-worker-{index}", self.directory / f"worker-{index}",
            in_netns(self.netns, [
                str(spark_home() / "bin" / "spark-class"), "org.apache.spark.deploy.worker.Worker",
                "--host", self.host, "--port", str(port), "--webui-port", str(ui),
                "--cores", str(self.cores), "--memory", self.memory,
                "--work-dir", str(self.directory / f"worker-{index}" / "work"), self.url]),
            ui, host=self.host)
        daemon.start(env or self.env())
        if index < len(self.worker_daemons):
            self.worker_daemons[index] = daemon
        else:
            self.worker_daemons.append(daemon)
        return daemon

    def status(self) -> dict[str, Any]:
        """The Master's view: ``aliveworkers``, ``workers``, ``activeapps``..."""
        return (self.master.ui_json() if self.master else None) or {}

    def alive_workers(self) -> int:
        return int(self.status().get("aliveworkers", 0))

    def wait_workers(self, count: int, timeout: float = 60.0) -> None:
        self._wait(lambda: self.alive_workers() >= count, timeout, self.master)

    def running_tasks(self, index: int) -> int:
        """Tasks running now on worker ``index``'s executors, from the executors' own logs
        (``work/<app>/<executor>/stderr``: each task logs its start and its end)."""
        running = 0
        for log in (self.directory / f"worker-{index}" / "work").glob("*/*/stderr"):
            try:
                text = log.read_text(errors="replace")
            except OSError:
                continue
            running += text.count("Executor: Running task") - sum(
                text.count(end) for end in ("Executor: Finished task", "Executor: Executor killed",
                                            "Executor: Exception in task"))
        return max(running, 0)

    def kill_worker(self, index: int) -> None:
        """kill -9 of worker ``index`` and its executors (a lost host)."""
        self.worker_daemons[index].kill()

    def _wait(self, ready: Any, timeout: float, daemon: SparkDaemon | None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            for d in [self.master, *self.worker_daemons]:
                if d is not None and d.record is not None and not d.alive():
                    raise ServerNotReady(f"{d.name} died while starting; log tail:\n"
                                         f"{tail(d.log_path)}")
            time.sleep(0.2)
        log = daemon.log_path if daemon else self.directory
        raise ServerNotReady(f"Spark standalone cluster not ready after {timeout:.0f}s; "
                             f"log tail:\n{tail(log)}")

    def stop(self) -> None:
        for daemon in reversed(self.worker_daemons):
            daemon.stop()
        if self.master is not None:
            self.master.stop()

    def log_tails(self, lines: int = 40) -> dict[str, str]:
        daemons = [d for d in [self.master, *self.worker_daemons] if d is not None]
        return {d.name: tail(d.log_path, lines) for d in daemons}
