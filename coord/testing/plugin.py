"""pytest fixtures over a real ZooKeeper: ``pytest_plugins = ["coord.testing.plugin"]``.

Session-scoped servers, started on free 127.0.0.1 ports with their state in pytest's temp dir,
the first time a test asks for them:

* ``zookeeper``: a standalone server, ``tickTime=500`` (sessions of 1 to 10 s);
* ``zookeeper_ensemble``: three servers on this host, same tick.

Per test:

* ``zk_namespace``: a uuid root (chroot) on ``zookeeper``, deleted after the test
  (``ensemble_namespace``: the same on ``zookeeper_ensemble``);
* ``zk_client``: a started kazoo client inside that root;
* ``spawn_node``: starts :class:`~coord.testing.nodeprocess.NodeProcess` subprocesses and makes
  sure they are gone after the test.

When a test fails, the tails of the server logs and of the subprocesses' output are attached to
its report. A missing ``zookeeper`` package fails with the ``apt-get install`` line to run.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from coord.testing import guard
from coord.testing.containers import ZooKeeperContainer, servers_backend
from coord.testing.nodeprocess import NodeProcess
from coord.testing.zookeeper import ZooKeeperCluster

TEST_TICK_MS = 500

@dataclass(frozen=True)
class ZkNamespace:
    """A private root on a ZooKeeper server: ``hosts`` includes it as the chroot."""

    server_hosts: str
    root: str

    @property
    def hosts(self) -> str:
        return f"{self.server_hosts}{self.root}"

    def client(self, timeout: float = 4.0, **kwargs: Any) -> KazooClient:
        """A new (not started) kazoo client inside this namespace."""
        return KazooClient(hosts=self.hosts, timeout=timeout, **kwargs)


@dataclass
class NodeSpawner:
    """Factory behind the ``spawn_node`` fixture."""

    directory: Path
    nodes: list[NodeProcess] = field(default_factory=list)

    def __call__(self, argv: Sequence[str], name: str = "node", ready_timeout: float = 30.0,
                 env: dict[str, str] | None = None, ready_prefix: str = "READY") -> NodeProcess:
        log = self.directory / f"{name}-{len(self.nodes)}.stderr.log"
        node = NodeProcess(argv, log, env=env, name=name)
        self.nodes.append(node)
        node.start(ready_timeout, ready_prefix)
        return node


def pytest_configure(config: pytest.Config) -> None:
    """The servers and nodes a test process starts end with it, however it ends
    (:mod:`coord.testing.guard`)."""
    guard.enable()


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[ZooKeeperCluster | ZooKeeperContainer]:
    """The run's ZooKeeper: a local server process, or a container with
    ``LATCHWORK_TEST_SERVERS=containers`` (:mod:`coord.testing.containers`)."""
    cluster: ZooKeeperCluster | ZooKeeperContainer
    if servers_backend() == "containers":
        cluster = ZooKeeperContainer(tick_ms=TEST_TICK_MS)
    else:
        cluster = ZooKeeperCluster(tmp_path_factory.mktemp("zookeeper"), 1, TEST_TICK_MS)
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def zookeeper_ensemble(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperCluster]:
    cluster = ZooKeeperCluster(tmp_path_factory.mktemp("zookeeper-ensemble"), 3, TEST_TICK_MS)
    cluster.start()
    yield cluster
    cluster.stop()


def _make_namespace(server_hosts: str) -> ZkNamespace:
    namespace = ZkNamespace(server_hosts, f"/test-{uuid.uuid4().hex[:12]}")
    admin = KazooClient(hosts=server_hosts, timeout=10.0)
    admin.start(timeout=30)
    try:
        admin.ensure_path(namespace.root)
    finally:
        admin.stop()
        admin.close()
    return namespace


def _drop_namespace(namespace: ZkNamespace) -> None:
    admin = KazooClient(hosts=namespace.server_hosts, timeout=10.0)
    admin.start(timeout=30)
    try:
        admin.delete(namespace.root, recursive=True)
    finally:
        admin.stop()
        admin.close()


@pytest.fixture
def zk_namespace(zookeeper: ZooKeeperCluster | ZooKeeperContainer) -> Iterator[ZkNamespace]:
    namespace = _make_namespace(zookeeper.hosts)
    yield namespace
    _drop_namespace(namespace)


@pytest.fixture
def ensemble_namespace(zookeeper_ensemble: ZooKeeperCluster) -> Iterator[ZkNamespace]:
    """Like ``zk_namespace``, on the 3-server ensemble."""
    namespace = _make_namespace(zookeeper_ensemble.hosts)
    yield namespace
    _drop_namespace(namespace)


@pytest.fixture
def zk_client(zk_namespace: ZkNamespace) -> Iterator[KazooClient]:
    client = zk_namespace.client()
    client.start(timeout=30)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def spawn_node(tmp_path: Path) -> Iterator[Callable[..., NodeProcess]]:
    spawner = NodeSpawner(tmp_path / "nodes")
    yield spawner
    for node in spawner.nodes:
        node.close()


def _log_sections(funcargs: dict[str, Any]) -> list[tuple[str, str]]:
    sections = []
    for name in ("zookeeper", "zookeeper_ensemble"):
        cluster = funcargs.get(name)
        if isinstance(cluster, ZooKeeperCluster | ZooKeeperContainer):
            for server, text in cluster.log_tails().items():
                sections.append((f"{name}: {server} log tail", text))
    spawner = funcargs.get("spawn_node")
    if isinstance(spawner, NodeSpawner):
        for node in spawner.nodes:
            sections.append((f"{node.name} (pid {node.pid}) stdout", "\n".join(node.lines[-40:])))
            sections.append((f"{node.name} (pid {node.pid}) stderr", node.stderr_tail(40)))
    return sections


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed:
        for title, text in _log_sections(getattr(item, "funcargs", {})):
            report.sections.append((title, text))
