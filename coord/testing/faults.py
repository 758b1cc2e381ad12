"""ZooKeeper faults on demand: what happens to a cluster in production, made to happen in a test.

* :func:`expire_session`: the server expires a client's session (as after a long GC pause or a
  partition), for real, and the call returns once the victim has seen LOST;
* :func:`kill_ensemble_leader`: kill -9 of the server that currently leads the ensemble;
* :func:`lose_first_reply` (:func:`lose_first_set_reply`): a write that reaches the server but
  whose reply is lost.

An injector that cannot inject its fault, or whose victim never notices it, raises
:class:`FaultInjectionFailed` (an AssertionError, so the test fails rather than errors).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from kazoo.client import KazooClient, KazooState

from coord.testing.processes import FaultInjectionFailed
from coord.testing.zookeeper import ZooKeeperCluster, ZooKeeperServer


def expire_session(client: KazooClient, timeout: float = 15.0) -> None:
    """Make the server expire ``client``'s session, and wait until ``client`` reports LOST.

    A second client attaches to the same session id and password, then closes the session.
    The server ends the session for everyone: ephemeral nodes go, watches fire, and the victim
    learns it is expired when it reconnects. Unlike kazoo's own harness this does not fake the
    event inside the client, so the server-side effects are real too.
    """
    lost = threading.Event()

    def on_state(state: str) -> bool:
        if state == KazooState.LOST:
            lost.set()
            return True  # kazoo removes a listener that returns True
        return False

    client.add_listener(on_state)
    session_id, password = client.client_id
    hosts = ",".join(f"{host}:{port}" for host, port in client.hosts)
    intruder = KazooClient(hosts=hosts, client_id=(session_id, password), timeout=timeout)
    try:
        intruder.start(timeout=timeout)
    finally:
        intruder.stop()  # sends closeSession for the shared session id
        intruder.close()
    if not lost.wait(timeout):
        client.remove_listener(on_state)
        raise FaultInjectionFailed(f"session 0x{session_id:x} was closed but the client never "
                                   f"reported LOST within {timeout}s")


def kill_ensemble_leader(cluster: ZooKeeperCluster, timeout: float = 30.0) -> ZooKeeperServer:
    """kill -9 the leading server, wait until the survivors serve again, and return the victim.

    The caller restarts it with ``victim.start(); victim.wait_ready()`` when the ensemble must be
    whole again.
    """
    if len(cluster.servers) < 3:
        raise FaultInjectionFailed("killing the leader needs an ensemble of at least 3 servers")
    victim = cluster.leader()
    victim.kill()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        modes = [s.mode() for s in cluster.servers if s is not victim]
        if "leader" in modes and all(m in ("leader", "follower") for m in modes):
            return victim
        time.sleep(0.05)
    raise FaultInjectionFailed(f"no new ZooKeeper leader within {timeout}s of killing "
                               f"{victim.name}")


def lose_first_reply(monkeypatch: Any, client: Any, method: str) -> dict[str, int]:
    """Make the next ``client.<method>`` (``set``, ``create``, ...) reach the server but raise
    ConnectionLoss, as a reply lost on the wire would; later calls behave. Returns the call
    counter (``calls["n"]``)."""
    from kazoo.exceptions import ConnectionLoss
    real = getattr(client, method)
    calls = {"n": 0}

    def call_then_lose_reply(*args: object, **kwargs: object) -> object:
        calls["n"] += 1
        result = real(*args, **kwargs)
        if calls["n"] == 1:
            raise ConnectionLoss("reply lost")
        return result

    monkeypatch.setattr(client, method, call_then_lose_reply)
    return calls


def lose_first_set_reply(monkeypatch: Any, client: Any) -> dict[str, int]:
    """:func:`lose_first_reply` of ``client.set``."""
    return lose_first_reply(monkeypatch, client, "set")
