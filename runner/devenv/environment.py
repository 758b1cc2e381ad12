"""The set of local servers ``latchwork dev`` starts: ZooKeeper, RabbitMQ and, on request, a
Spark standalone cluster (a Master and N Workers) and a Gremlin Server, state on disk.

``up()`` checks packages and ports before starting anything and stops what it started when a
later step fails; ``down()`` signals only the PIDs recorded in ``state.json``, and only while
they are still ours (a reused PID is never hit).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from coord.testing.ports import check_ports_free
from coord.testing.processes import LOOPBACK, DevServerError, ProcessRecord
from coord.testing.zookeeper import ZooKeeperCluster, ZooKeeperServer, check_zookeeper_installed
from messaging.testing.rabbitmq import RabbitMQServer, check_rabbitmq_installed
from runner.config import (
    DEFAULT_AMQP_PORT,
    DEFAULT_GRAPH_PORT,
    DEFAULT_SPARK_PORT,
    DEFAULT_ZK_PORT,
)
from runner.testing.gremlinserver import GremlinServer, check_gremlin_installed
from runner.testing.sparkcluster import SparkDaemon, SparkStandalone, check_spark_installed

STATE_FILE = "state.json"


def _record_to_json(record: ProcessRecord | None) -> dict[str, object] | None:
    return None if record is None else asdict(record)


def _record_from_json(raw: object) -> ProcessRecord | None:
    if not isinstance(raw, dict):
        return None
    return ProcessRecord(str(raw["name"]), int(raw["pid"]), int(raw["start_ticks"]))


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    pid: int | None
    running: bool
    ready: bool
    detail: str


@dataclass(frozen=True)
class DevPlan:
    """What ``latchwork dev up`` starts: its directory, ZooKeeper's size, ports and tick, and
    the servers asked for besides (a Spark standalone cluster, a Gremlin Server)."""

    directory: Path
    zk_size: int = 1
    zk_port: int = DEFAULT_ZK_PORT
    amqp_port: int = DEFAULT_AMQP_PORT
    tick_time: int = 2000
    spark_workers: int = 0
    spark_port: int = DEFAULT_SPARK_PORT
    graph_server: bool = False
    graph_port: int = DEFAULT_GRAPH_PORT


@dataclass
class DevEnvironment:
    """ZooKeeper (standalone or an ensemble) plus one RabbitMQ node, with state under ``directory``.

    ``up()`` checks packages and ports before starting anything, and stops whatever it started if a
    later step fails, so a failed ``up`` leaves nothing running. The PIDs and start times are kept
    in ``<directory>/state.json``; ``down()`` signals only those, and only while they are ours.
    """

    directory: Path
    zookeeper: ZooKeeperCluster
    rabbitmq: RabbitMQServer
    spark: SparkStandalone | None = None
    graph: GremlinServer | None = None

    @classmethod
    def plan(cls, plan: DevPlan) -> DevEnvironment:
        directory = plan.directory.resolve()
        zk_size, zk_port, amqp_port, tick_time = (plan.zk_size, plan.zk_port, plan.amqp_port,
                                                  plan.tick_time)
        spark_workers, spark_port = plan.spark_workers, plan.spark_port
        graph_server, graph_port = plan.graph_server, plan.graph_port
        clients = [zk_port + i for i in range(zk_size)]
        zookeeper = ZooKeeperCluster(directory / "zookeeper", zk_size, tick_time, clients)
        # Distribution and epmd ports sit next to the AMQP port so a user can predict them.
        rabbitmq = RabbitMQServer(directory / "rabbitmq", amqp_port, amqp_port + 1, amqp_port + 2,
                                  nodename=f"latchwork-dev{amqp_port}@localhost")
        # the Master's web UI and each Worker's port and UI follow the Master's port
        spark = SparkStandalone(directory / "spark", spark_workers, master_port=spark_port) \
            if spark_workers else None
        graph = GremlinServer(directory / "gremlin-server", graph_port) if graph_server else None
        return cls(directory, zookeeper, rabbitmq, spark, graph)

    # -- persistence -------------------------------------------------------------------------

    def save(self) -> None:
        state = {
            "zookeeper": [
                {"directory": str(s.directory), "client_port": s.client_port,
                 "tick_time": s.tick_time, "server_id": s.server_id,
                 "peers": {str(k): list(v) for k, v in s.peers.items()},
                 "record": _record_to_json(s.record)}
                for s in self.zookeeper.servers
            ],
            "rabbitmq": {
                "directory": str(self.rabbitmq.directory), "node_port": self.rabbitmq.node_port,
                "dist_port": self.rabbitmq.dist_port, "epmd_port": self.rabbitmq.epmd_port,
                "nodename": self.rabbitmq.nodename, "record": _record_to_json(self.rabbitmq.record),
                "launcher": _record_to_json(self.rabbitmq.launcher),
            },
        }
        if self.spark is not None:
            daemons = [self.spark.master, *self.spark.worker_daemons]
            state["spark"] = {
                "directory": str(self.spark.directory), "workers": self.spark.workers,
                "cores": self.spark.cores, "memory": self.spark.memory,
                "master_port": self.spark.master_port, "ports": self.spark.ports,
                "daemons": [{"name": d.name, "directory": str(d.directory), "argv": d.argv,
                             "ui_port": d.ui_port, "record": _record_to_json(d.record)}
                            for d in daemons if d is not None]}
        if self.graph is not None:
            state["graph"] = {"directory": str(self.graph.directory), "port": self.graph.port,
                              "record": _record_to_json(self.graph.record)}
        (self.directory / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")

    @classmethod
    def load(cls, directory: Path) -> DevEnvironment | None:
        """The environment recorded under ``directory``, or None when nothing was started there."""
        directory = directory.resolve()
        try:
            raw = json.loads((directory / STATE_FILE).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise DevServerError(f"{directory / STATE_FILE} is unreadable: {exc}") from exc
        servers = []
        for z in raw["zookeeper"]:
            peers = {int(k): (int(v[0]), int(v[1]), int(v[2])) for k, v in z["peers"].items()}
            servers.append(ZooKeeperServer(Path(z["directory"]), int(z["client_port"]),
                                           int(z["tick_time"]), z["server_id"], peers,
                                           record=_record_from_json(z["record"])))
        zookeeper = ZooKeeperCluster(directory / "zookeeper", len(servers), servers=servers)
        r = raw["rabbitmq"]
        rabbitmq = RabbitMQServer(Path(r["directory"]), int(r["node_port"]), int(r["dist_port"]),
                                  int(r["epmd_port"]), str(r["nodename"]),
                                  record=_record_from_json(r["record"]),
                                  launcher=_record_from_json(r.get("launcher")))
        spark = None
        if raw.get("spark"):
            sp = raw["spark"]
            daemons = [SparkDaemon(d["name"], Path(d["directory"]), list(d["argv"]),
                                   int(d["ui_port"]), _record_from_json(d["record"]))
                       for d in sp["daemons"]]
            spark = SparkStandalone(Path(sp["directory"]), int(sp["workers"]), int(sp["cores"]),
                                    str(sp["memory"]), int(sp["master_port"]),
                                    [int(x) for x in sp["ports"]],
                                    next((d for d in daemons if d.name == "spark-master"), None),
                                    [d for d in daemons if d.name != "spark-master"])
        graph = None
        if raw.get("graph"):
            gr = raw["graph"]
            graph = GremlinServer(Path(gr["directory"]), int(gr["port"]),
                                  record=_record_from_json(gr["record"]))
        return cls(directory, zookeeper, rabbitmq, spark, graph)

    # -- lifecycle ---------------------------------------------------------------------------

    def up(self, timeout: float = 90.0) -> None:
        existing = DevEnvironment.load(self.directory)
        if existing is not None and existing.any_running():
            raise DevServerError(f"servers are already running from {self.directory}; "
                                 f"run 'latchwork dev down --dir {self.directory}' first")
        check_zookeeper_installed()
        check_rabbitmq_installed()
        spark_ports = {}
        if self.spark is not None:
            check_spark_installed()
            spark_ports = self.spark.port_map()
        graph_ports = {}
        if self.graph is not None:
            check_gremlin_installed()
            graph_ports = self.graph.ports()
        check_ports_free({**self.zookeeper.ports(), **self.rabbitmq.ports(), **spark_ports,
                          **graph_ports})
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            for server in self.zookeeper.servers:
                server.start()
            self.save()
            self.rabbitmq.start()
            self.save()
            self.zookeeper.wait_quorum(timeout)
            self.rabbitmq.wait_ready(timeout)
            self.save()  # now with the broker VM's own PID
            if self.spark is not None:
                try:
                    self.spark.start(timeout)
                finally:
                    self.save()
            if self.graph is not None:
                try:
                    self.graph.start(timeout)  # until it answers a traversal
                finally:
                    self.save()
        except BaseException:
            self.down()
            raise

    def down(self) -> None:
        if self.graph is not None:
            self.graph.stop()  # SIGTERM: TinkerGraph writes its data file for the next up
        if self.spark is not None:
            self.spark.stop()
        self.rabbitmq.stop()
        self.zookeeper.stop()
        (self.directory / STATE_FILE).unlink(missing_ok=True)

    def any_running(self) -> bool:
        spark = self.spark is not None and any(
            d.alive() for d in [self.spark.master, *self.spark.worker_daemons] if d is not None)
        graph = self.graph is not None and self.graph.is_running()
        return spark or graph or self.rabbitmq.is_running() or any(
            s.is_running() for s in self.zookeeper.servers)

    def status(self) -> list[ServiceStatus]:
        rows = []
        for server in self.zookeeper.servers:
            mode = server.mode() if server.is_running() else None
            rows.append(ServiceStatus(
                server.name, server.record.pid if server.record else None, server.is_running(),
                mode is not None, f"{LOOPBACK}:{server.client_port} mode={mode or '-'}"))
        rabbit = self.rabbitmq
        ready = rabbit.is_running() and rabbit.is_ready()
        running = rabbit.record or rabbit.launcher
        pid = running.pid if running else None
        rows.append(ServiceStatus("rabbitmq", pid,
                                  rabbit.is_running(), ready, f"{LOOPBACK}:{rabbit.node_port}"))
        if self.spark is not None:
            master = self.spark.master
            seen = self.spark.status() if master is not None and master.alive() else {}
            alive = {int(w["port"]) for w in seen.get("workers", []) if w.get("state") == "ALIVE"}
            rows.append(ServiceStatus(
                "spark-master", master.record.pid if master and master.record else None,
                bool(master and master.alive()), seen.get("status") == "ALIVE",
                f"{self.spark.url} ui={LOOPBACK}:{self.spark.master_ui_port} "
                f"workers={len(alive)}"))
            for i, worker in enumerate(self.spark.worker_daemons):
                port = self.spark.ports[1 + 2 * i]
                rows.append(ServiceStatus(
                    worker.name, worker.record.pid if worker.record else None, worker.alive(),
                    worker.alive() and port in alive,
                    f"{LOOPBACK}:{port} cores={self.spark.cores} memory={self.spark.memory}"))
        if self.graph is not None:
            up = self.graph.is_running()
            serving = False
            if up:
                try:
                    serving = self.graph.answers(timeout=2.0)
                except Exception:  # running, not serving
                    serving = False
            rows.append(ServiceStatus(
                "gremlin-server", self.graph.record.pid if self.graph.record else None,
                up, serving, f"{self.graph.url} (TinkerGraph, one traversal at a time)"))
        return rows

    def exports(self) -> dict[str, str]:
        """Connection settings, named as :class:`runner.config.Settings` reads them."""
        found = {"LATCHWORK_ZK_HOSTS": self.zookeeper.hosts,
                 "LATCHWORK_AMQP_URL": self.rabbitmq.url}
        if self.spark is not None:
            found["LATCHWORK_SPARK_MASTER"] = self.spark.url
        if self.graph is not None:
            found["LATCHWORK_GRAPH"] = self.graph.url
            found["LATCHWORK_GRAPH_SERIAL_SERVER"] = "true"
        return found


