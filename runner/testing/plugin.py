"""pytest plugin for latchwork's own tests and for users' tests of their task types:
``pytest_plugins = ["runner.testing.plugin"]``.

It loads the ZooKeeper fixtures of :mod:`coord.testing.plugin` and the RabbitMQ fixtures of
:mod:`messaging.testing.plugin`, and adds ``cluster`` (a :class:`~runner.testing.cluster.Cluster`
of node processes in the test's own ZooKeeper root and vhost, started with
``cluster.start_node()``), ``spark`` (the run's one SparkSession: local[2], UI off) and
``spark_standalone`` (a Spark standalone Master and two Workers of the test's own, from the
pyspark distribution: :mod:`runner.testing.sparkcluster`). A Docker engine is never required:
the local-process path is the one CI runs (see docs/testing.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from coord.testing.nodeprocess import NodeProcess
from runner.testing.cluster import Cluster
from runner.testing.gremlinserver import GremlinServer
from runner.testing.sparkcluster import SparkStandalone

if TYPE_CHECKING:  # imported at run time by pytest as plugins (for assertion rewriting)
    from coord.testing.plugin import ZkNamespace
    from messaging.testing.plugin import AmqpNamespace

pytest_plugins = ["coord.testing.plugin", "messaging.testing.plugin"]


@pytest.fixture
def cluster(request: pytest.FixtureRequest, zk_namespace: ZkNamespace,
            amqp_vhost: AmqpNamespace, tmp_path: Path,
            spawn_node: Callable[..., NodeProcess]) -> Iterator[Cluster]:
    """Node processes of one cluster sharing a graph file under ``tmp_path``; none started.
    Parametrised indirectly with ``"server"`` (``@pytest.mark.parametrize("cluster",
    ["gremlite", "server"], indirect=True)``), the nodes share the run's Gremlin Server
    instead, its graph emptied first."""
    graph = None
    if getattr(request, "param", "gremlite") == "server":
        server: GremlinServer = request.getfixturevalue("gremlin_server")
        graph = server.url
    c = Cluster(zk_namespace.hosts, amqp_vhost, tmp_path, spawn_node, graph=graph)
    if graph is not None:
        c.store.clear()
    yield c
    c.store.close()


@pytest.fixture(scope="session")
def gremlin_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GremlinServer]:
    """The run's Gremlin Server (TinkerPop 3.5.1, TinkerGraph, one traversal at a time) on a
    free loopback port: :mod:`runner.testing.gremlinserver`. Tests share its one graph: each
    that uses it starts by dropping what the last one left."""
    server = GremlinServer(tmp_path_factory.mktemp("gremlin-server"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def spark_standalone(tmp_path: Path) -> Iterator[SparkStandalone]:
    """A Spark standalone cluster of the test's own: a Master and two Workers (2 cores and
    1 GiB each) on loopback; stopped, executors included, after the test."""
    cluster = SparkStandalone(tmp_path / "spark", workers=2, cores=2, memory="1g")
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def _spark_process() -> Iterator[None]:
    """Stops the process's SparkSession at the end of the test run."""
    from runner.pipeline.spark import stop_spark
    yield
    stop_spark()


@pytest.fixture
def spark(_spark_process: None) -> Any:
    """The process's SparkSession (local[2], UI off, 2 shuffle partitions), shared by the
    tests of a run: created on first use, and again after a node closed in this process
    stopped it (a node stops the process's session as it leaves)."""
    from runner.config import Settings
    from runner.pipeline.spark import TEST_CONF, spark_session
    return spark_session(Settings.load(spark_master="local[2]", spark_conf=TEST_CONF,
                                       spark_driver_memory="1g"), "latchwork-tests")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test that used ``spark_standalone`` carries its daemons' log tails."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    cluster = getattr(item, "funcargs", {}).get("spark_standalone")
    if report.failed and isinstance(cluster, SparkStandalone):
        for name, text in cluster.log_tails().items():
            report.sections.append((f"{name} log tail", text))
