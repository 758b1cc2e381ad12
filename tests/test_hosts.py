"""What crosses hosts, on hosts of their own (network namespaces on a bridge: coord.testing.hosts):
the addresses a node advertises for others to reach it. A stream copy's liveness beacon at its
node's ``stream_liveness_host``, followed from another host, and the Spark driver at its node's
``spark_driver_host``, reached by executors on another host. Skipped with the one-line reason
where this machine cannot make hosts (not root); the chaos suite's ``--hosts`` profile runs the
rest of the cluster this way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from coord import LockFreeQueue, Session
from coord.testing import NodeProcess, ZooKeeperCluster, wait_until
from coord.testing.hosts import Host, HostNetwork, hosts_unavailable_reason
from coord.testing.processes import in_netns
from messaging.testing import RabbitMQServer
from runner.client import Client
from runner.tasks.features.example_stream import EXAMPLE, moving_average
from runner.tasks.features.streams import copies
from runner.testing.gremlinserver import GremlinServer
from runner.testing.sparkcluster import SparkStandalone

CLUSTER = "hosts"
SESSION = 6.0

pytestmark = pytest.mark.skipif(hosts_unavailable_reason() is not None,
                                reason=hosts_unavailable_reason() or "")


@dataclass
class HostCluster:
    """ZooKeeper, RabbitMQ and a Gremlin Server each on a host of its own, and nodes on theirs
    (started by :meth:`start_node`)."""

    network: HostNetwork
    workdir: Path
    zk: ZooKeeperCluster
    rabbit: RabbitMQServer
    graph: GremlinServer
    nodes: dict[str, NodeProcess] = field(default_factory=dict)
    node_hosts: dict[str, Host] = field(default_factory=dict)

    def env(self, host: Host | None) -> dict[str, str]:
        env = {**os.environ, "LATCHWORK_CLUSTER": CLUSTER, "LATCHWORK_ZK_HOSTS": self.zk.hosts,
               "LATCHWORK_AMQP_URL": self.rabbit.url, "LATCHWORK_GRAPH": self.graph.url,
               "LATCHWORK_GRAPH_SERIAL_SERVER": "true",
               "LATCHWORK_SESSION_TIMEOUT": str(SESSION), "LATCHWORK_SCAN_INTERVAL": "1",
               "LATCHWORK_REAP_INTERVAL": "0.5", "LATCHWORK_DATA_DIR": str(self.workdir)}
        if host is not None:  # what the other hosts reach this node at
            env.update(LATCHWORK_STREAM_LIVENESS_HOST=host.address,
                       LATCHWORK_SPARK_DRIVER_HOST=host.address)
        return env

    def start_node(self, *args: str) -> str:
        index = len(self.nodes)
        host = self.network.add(f"node{index}")
        node = NodeProcess(["-m", "runner.cli", "node", "start", *args],
                           self.workdir / f"node{index}.log", env=self.env(host),
                           name=f"node{index}", netns=host.netns)
        member = node.start(ready_timeout=60, ready_prefix="latchwork node").split()[0]
        self.nodes[member], self.node_hosts[member] = node, host
        return member

    def client(self) -> Client:
        return Client(self.rabbit.url, CLUSTER, timeout=20.0, sender="tests")


@pytest.fixture
def host_cluster(tmp_path: Path) -> Iterator[HostCluster]:
    network = HostNetwork().start()
    try:
        zk_host, broker, graph_host = (network.add(n) for n in ("zk", "broker", "graph"))
        zk = ZooKeeperCluster(tmp_path / "zk", tick_time=500,
                              hosts_of=[(zk_host.address, zk_host.netns)])
        rabbit = RabbitMQServer(tmp_path / "rabbitmq", 5672, 25672, 4369,
                                host=broker.address, netns=broker.netns)
        graph = GremlinServer(tmp_path / "gremlin-server", 8182, host=graph_host.address,
                              netns=graph_host.netns)
        zk.start()
        try:
            rabbit.start()
            graph.start()
            rabbit.wait_ready()
            cluster = HostCluster(network, tmp_path, zk, rabbit, graph)
            try:
                yield cluster
            finally:
                for node in cluster.nodes.values():
                    node.close()
        finally:
            graph.kill()
            rabbit.stop()
            zk.stop()
    finally:
        network.close()


def stamp(session: Session) -> dict[str, str | None]:
    """What the stream's state names: its leading copy's beacon (``at``) and the follower
    connected to that beacon, to step in first (``next``)."""
    data, _ = session.client.get(f"/handlers/{EXAMPLE}/state")
    value = json.loads(data.decode())["value"] or {}
    return {"at": value.get("at"), "next": value.get("next")}


def beacon_of(session: Session) -> str | None:
    return stamp(session)["at"]


def test_a_stream_copy_is_followed_through_the_beacon_its_host_advertises(
        host_cluster: HostCluster) -> None:
    """Two copies of the example stream on nodes of their own hosts: the state names the
    leading copy's beacon at its host's address (``stream_liveness_host``; the loopback
    default would name 127.0.0.1, which no other host reaches), the follower on the other host
    connects to it there (the state names it as the one to step in first), and when the
    leader's node is killed -9 the follower takes over, long before the leader's session
    (6 s) could expire; every output is the sequential result."""
    for _ in range(2):
        host_cluster.start_node("--tasks", "runner.tasks.features.example_stream")
    with host_cluster.client() as client:
        client.request("stream.start", {"name": EXAMPLE, "redundancy": 2})
    readings = [json.dumps({"t": i * 5.0, "v": (i * 7) % 13}).encode() for i in range(180)]
    with Session(host_cluster.zk.hosts, CLUSTER, timeout=SESSION) as s:
        source, sink = LockFreeQueue(s, "readings"), LockFreeQueue(s, "averages")
        for raw in readings[:60]:
            source.push(raw)
        assert wait_until(lambda: sink.end() >= 30, 60, 0.2)
        # both copies run, one per node: the node that took both tasks declined one, which the
        # other finds by its next listing (seconds; more on a loaded box)
        assert wait_until(lambda: len(copies(s, EXAMPLE)) == 2, 60, 0.2), copies(s, EXAMPLE)
        # the follower, on the other host, connects to the leader's beacon there; the leader
        # names it in the next state it writes (fed slowly so that there are some)
        fed, until = 60, time.monotonic() + 30
        while stamp(s)["next"] is None and fed < 120 and time.monotonic() < until:
            source.push(readings[fed])
            fed += 1
            time.sleep(0.25)
        assert stamp(s)["next"] is not None, (stamp(s), copies(s, EXAMPLE))
        at = beacon_of(s)
        assert at is not None
        addresses = {h.address: m for m, h in host_cluster.node_hosts.items()}
        leader = addresses.get(at.rsplit(":", 1)[0])
        assert leader is not None, (at, addresses)  # a host's address, not loopback
        host_cluster.nodes[leader].kill()
        killed = s.client.get(f"/handlers/{EXAMPLE}/state")[1].mtime
        for raw in readings[fed:]:
            source.push(raw)
        assert wait_until(lambda: (beacon_of(s) or "").rsplit(":", 1)[0]
                          not in ("", at.rsplit(":", 1)[0]), 30, 0.05)
        taken = s.client.get(f"/handlers/{EXAMPLE}/state")[1].mtime
        assert (taken - killed) / 1000 < SESSION / 2, (taken - killed)
        assert wait_until(lambda: sink.end() == len(readings), 60, 0.2)
        outputs = [v for _, v in sink.read(0, limit=1000)]
    _, expected = moving_average()({"window": [], "over": False},
                                   [("readings", i, raw) for i, raw in enumerate(readings)])
    assert outputs == expected


DRIVER = textwrap.dedent('''
    import sys
    from runner.config import Settings
    from runner.pipeline.spark import spark_session
    spark = spark_session(Settings.load(None), "hosts-test")
    try:
        total = spark.sparkContext.parallelize(range(1000), 4).map(lambda x: x * 2).sum()
        hosts = sorted({e.host() for e in spark.sparkContext._jsc.sc()
                        .statusTracker().getExecutorInfos()})
        print("RESULT", total, ",".join(hosts), flush=True)
    finally:
        spark.stop()
''')


def test_spark_executors_on_another_host_reach_the_driver_at_its_advertised_address(
        host_cluster: HostCluster, tmp_path: Path) -> None:
    """A Spark standalone Master and Worker on a host of their own, a driver built from a
    node's settings on another host (``spark_driver_host`` = that host's address): the
    executors on the Worker's host connect back to the driver there and the job's result is
    right (with the driver advertising loopback they could not: the job would never end)."""
    spark_host = host_cluster.network.add("spark")
    driver_host = host_cluster.network.add("driver")
    standalone = SparkStandalone(tmp_path / "spark", workers=1, cores=2, memory="1g",
                                 host=spark_host.address, netns=spark_host.netns)
    standalone.start()
    try:
        env = {**host_cluster.env(driver_host), "LATCHWORK_SPARK_MASTER": standalone.url,
               "LATCHWORK_SPARK_DRIVER_MEMORY": "512m",
               "LATCHWORK_SPARK_CONF": json.dumps({"spark.cores.max": "2",
                                                   "spark.executor.memory": "512m",
                                                   "spark.ui.enabled": "false"})}
        driver = subprocess.Popen(in_netns(driver_host.netns, [sys.executable, "-c", DRIVER]),
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, start_new_session=True)
        try:
            out, err = driver.communicate(timeout=170)
        except subprocess.TimeoutExpired:  # the driver and its JVM, as a group
            os.killpg(driver.pid, signal.SIGKILL)
            out, err = driver.communicate()
        lines = [line for line in out.splitlines() if line.startswith("RESULT")]
        assert driver.returncode == 0 and lines, err[-3000:]
        _, total, hosts = lines[0].split()
        assert int(total) == 999_000
        assert spark_host.address in hosts.split(","), hosts  # the executors ran there
    finally:
        standalone.stop()
