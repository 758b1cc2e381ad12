"""The test servers in containers (testcontainers), for ``LATCHWORK_TEST_SERVERS=containers``.

The local-process backend (:mod:`coord.testing.zookeeper`) is the default and the one CI runs
here (no Docker engine answers on its machines). With ``LATCHWORK_TEST_SERVERS=containers`` and
a Docker engine answering, the ``zookeeper`` fixture starts the official ``zookeeper:3.8``
image instead (tickTime 500, like the local servers), its client port published on 127.0.0.1
only; tests see the same ``hosts``, ``servers[0].client_port`` and ``log_tails()``. The 3-server
ensemble fixture stays local (its faults kill and restart server processes). Asked for with no
Docker engine answering, the fixture fails at once saying so: a test run that was meant to use
containers never falls back silently.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from coord.testing.ports import free_ports
from coord.testing.processes import LOOPBACK, DevServerError, ServerNotReady
from coord.testing.zookeeper import zk_mode

#: which backend the server fixtures use: "local" (default) or "containers"
SERVERS_ENV = "LATCHWORK_TEST_SERVERS"


def servers_backend() -> str:
    backend = os.environ.get(SERVERS_ENV, "local")
    if backend not in ("local", "containers"):
        raise DevServerError(f"{SERVERS_ENV}={backend!r}: use 'local' or 'containers'")
    return backend


def require_docker() -> None:
    """Raise :class:`DevServerError` unless a Docker engine answers."""
    try:
        import docker

        docker.from_env().ping()
    except Exception as exc:
        raise DevServerError(f"{SERVERS_ENV}=containers, but no Docker engine answers "
                             f"({type(exc).__name__}: {exc}); unset it to use local "
                             "server processes") from exc


def publish(container: Any, port: int) -> int:
    """Publish the container's ``port`` on a free port of 127.0.0.1 (never all interfaces)."""
    host = free_ports(1)[0]
    container.ports[port] = (LOOPBACK, host)
    return host


def log_tail(container: Any, lines: int) -> str:
    try:
        out, err = container.get_logs()
    except Exception as exc:  # the container is gone
        return f"(no log: {exc})"
    text = (out or b"").decode(errors="replace") + (err or b"").decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True)
class PublishedServer:
    """What tests read of a server: the port clients reach it at."""

    client_port: int


class ZooKeeperContainer:
    """One standalone ZooKeeper in a container, shaped like a local ``ZooKeeperCluster``."""

    def __init__(self, image: str = "zookeeper:3.8", tick_ms: int = 500) -> None:
        self.image = image
        self.tick_ms = tick_ms
        self._container: Any = None
        self._port = 0

    @property
    def hosts(self) -> str:
        return f"{LOOPBACK}:{self._port}"

    @property
    def servers(self) -> list[PublishedServer]:
        return [PublishedServer(self._port)]

    def start(self, timeout: float = 120.0) -> None:
        require_docker()
        from testcontainers.core.container import DockerContainer

        container = (DockerContainer(self.image)
                     .with_env("ZOO_TICK_TIME", str(self.tick_ms))
                     .with_env("ZOO_4LW_COMMANDS_WHITELIST", "ruok,srvr,stat,mntr")
                     .with_env("ZOO_ADMINSERVER_ENABLED", "false"))
        self._port = publish(container, 2181)
        self._container = container.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if zk_mode(self._port):
                return
            time.sleep(0.2)
        tail = log_tail(self._container, 30)
        self.stop()
        raise ServerNotReady(f"the ZooKeeper container is not serving after {timeout:.0f}s; "
                             f"log tail:\n{tail}")

    def stop(self) -> None:
        if self._container is not None:
            self._container.stop()
            self._container = None

    def log_tails(self, lines: int = 40) -> dict[str, str]:
        return {"zookeeper container": log_tail(self._container, lines)}
