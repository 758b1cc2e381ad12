"""The test harness coord ships, the way kazoo ships ``kazoo.testing``: real ZooKeeper servers
as local processes, and the faults that happen to them in production, on demand.

* servers: :class:`ZooKeeperServer`, :class:`ZooKeeperCluster` (:mod:`coord.testing.zookeeper`);
* faults: :func:`expire_session`, :func:`kill_ensemble_leader`, :func:`lose_first_set_reply`
  (:mod:`coord.testing.faults`), network cuts and silent partitions through :class:`TcpProxy`;
* participants: :class:`NodeProcess` (a subprocess to kill -9 or SIGSTOP) and the small
  programs it runs here (``coordnode``, ``ephemeral``, ``batchworker``);
* pytest fixtures: ``pytest_plugins = ["coord.testing.plugin"]``.

Nothing here is imported by coord itself.
"""

from coord.testing.faults import (
    expire_session,
    kill_ensemble_leader,
    lose_first_reply,
    lose_first_set_reply,
)
from coord.testing.nodeprocess import NodeProcess, wait_until
from coord.testing.ports import free_port_block, free_ports, port_is_free, port_is_listening
from coord.testing.processes import (
    LOOPBACK,
    DevServerError,
    FaultInjectionFailed,
    terminate_all,
)
from coord.testing.proxy import TcpProxy
from coord.testing.tls import Pki, ServerTls
from coord.testing.zookeeper import ZooKeeperCluster, ZooKeeperServer

__all__ = [
    "LOOPBACK",
    "DevServerError",
    "FaultInjectionFailed",
    "NodeProcess",
    "Pki",
    "ServerTls",
    "TcpProxy",
    "ZooKeeperCluster",
    "ZooKeeperServer",
    "expire_session",
    "free_port_block",
    "free_ports",
    "kill_ensemble_leader",
    "lose_first_reply",
    "lose_first_set_reply",
    "port_is_free",
    "port_is_listening",
    "terminate_all",
    "wait_until",
]
