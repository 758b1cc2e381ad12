"""`latchwork node start`: joins membership and the election; SIGTERM leaves at once, exit 0."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from coord import Session, read_leader, read_members
from coord.testing import NodeProcess
from coord.testing.plugin import ZkNamespace
from messaging.testing.plugin import AmqpNamespace


def test_nodes_join_elect_a_master_and_leave_cleanly_on_sigterm(
        zk_namespace: ZkNamespace, amqp_vhost: AmqpNamespace, tmp_path: os.PathLike[str],
        spawn_node: Callable[..., NodeProcess]) -> None:
    env = {**os.environ, "LATCHWORK_ZK_HOSTS": zk_namespace.hosts, "LATCHWORK_CLUSTER": "demo",
           "LATCHWORK_SESSION_TIMEOUT": "4", "LATCHWORK_AMQP_URL": amqp_vhost.url,
           "LATCHWORK_GRAPH": os.path.join(tmp_path, "graph.db")}
    nodes = {}
    for i in range(2):
        node = spawn_node(["-m", "runner.cli", "node", "start"], name=f"node{i}", env=env,
                          ready_prefix="latchwork node")
        nodes[node.lines[-1].split()[2]] = node
    with Session(zk_namespace.hosts, "demo") as reader:
        assert set(read_members(reader)) == set(nodes)
        deadline = time.monotonic() + 5
        while read_leader(reader) not in nodes and time.monotonic() < deadline:
            time.sleep(0.02)
        master = read_leader(reader)
        assert master in nodes
        stopped = time.monotonic()
        assert nodes[master].terminate(timeout=10) == 0
        (other,) = [m for m in nodes if m != master]
        while read_leader(reader) != other and time.monotonic() - stopped < 2:
            time.sleep(0.01)
        # handed over well before the 4 s session timeout could have expired anything
        assert read_leader(reader) == other
        assert time.monotonic() - stopped < 2
        assert set(read_members(reader)) == {other}
        assert "became master" in nodes[master].stderr_tail(50)
        assert nodes[other].terminate(timeout=10) == 0
        assert read_members(reader) == {}


def test_node_start_rejects_bad_configuration(tmp_path: os.PathLike[str]) -> None:
    import subprocess
    import sys
    env = {**os.environ, "LATCHWORK_WORKERS": "zero"}
    result = subprocess.run([sys.executable, "-m", "runner.cli", "node", "start"], env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2  # input the user must change
    assert "workers" in result.stderr and "invalid configuration" in result.stderr


def test_a_node_has_a_lifecycle_started_once(zk_namespace: ZkNamespace,
                                              amqp_vhost: AmqpNamespace,
                                              tmp_path: os.PathLike[str]) -> None:
    """LATENT, STARTED, CLOSED (Curator's model, like the coord recipes'): a second start, or
    a start after close, is refused; close is idempotent."""
    import pytest

    from coord import LifecycleError
    from runner.config import Settings
    from runner.node.node import Node, NodeState

    settings = Settings.load(cluster="life", zk_hosts=zk_namespace.hosts, amqp_url=amqp_vhost.url,
                             graph=str(os.path.join(tmp_path, "graph.db")), session_timeout=2,
                             data_dir=str(os.path.join(tmp_path, "data")))
    node = Node(settings)
    assert node.state is NodeState.LATENT
    with node:
        assert node.state is NodeState.STARTED
        with pytest.raises(LifecycleError, match="STARTED"):
            node.start()
        assert node.member_id in read_members(node.session)
    assert node.state is NodeState.CLOSED
    node.close()  # again: nothing
    with pytest.raises(LifecycleError, match="CLOSED"):
        node.start()
