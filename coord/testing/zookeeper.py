"""ZooKeeper as local processes: one standalone server or an ensemble on 127.0.0.1.

A server is ready when ``srvr`` answers ``Mode:`` (``ruok`` answers before quorum). Session
expiry is rounded up to ``tickTime``; tests use 500 ms. A missing ``zookeeper`` package raises
:class:`~coord.testing.processes.MissingPackage`; a server not ready in time raises
:class:`~coord.testing.processes.ServerNotReady` with its log tail.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from coord.testing.ports import check_ports_free, free_ports
from coord.testing.processes import (
    LOOPBACK,
    DevServerError,
    MissingPackage,
    ProcessRecord,
    ServerNotReady,
    in_netns,
    reap,
    spawn,
    tail,
)
from coord.testing.tls import ServerTls

ZOOKEEPER_CLASSPATH = os.environ.get(
    "LATCHWORK_DEV_ZOOKEEPER_CLASSPATH",
    "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar",
)
#: the Netty jars a TLS port needs beyond what zookeeper.jar's manifest names (Debian's
#: libnetty-java, which the zookeeper package pulls in)
NETTY_CLASSPATH = ("/usr/share/java/netty-codec.jar:/usr/share/java/netty-resolver.jar:"
                   "/usr/share/java/netty-transport-native-unix-common.jar")


# --------------------------------------------------------------------------------------------
# ZooKeeper


def zk_four_letter(port: int, command: str = "srvr", host: str = LOOPBACK,
                   timeout: float = 1.0, tls: ssl.SSLContext | None = None) -> str | None:
    """Send a four-letter word (over TLS with ``tls``); None when the server does not
    answer."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw, \
                (raw if tls is None else tls.wrap_socket(raw, server_hostname=host)) as sock:
            sock.sendall(command.encode())
            chunks = []
            while True:
                data = sock.recv(4096)
                if not data:
                    break
                chunks.append(data)
    except OSError:  # ssl.SSLError included
        return None
    return b"".join(chunks).decode(errors="replace")


def zk_mode(port: int, host: str = LOOPBACK, tls: ssl.SSLContext | None = None) -> str | None:
    """'standalone', 'leader' or 'follower' once the server serves clients, else None.

    ``ruok`` answers ``imok`` before an ensemble has a quorum; ``srvr`` prints a ``Mode:``
    line only once the server really serves requests.
    """
    answer = zk_four_letter(port, "srvr", host, tls=tls)
    if not answer:
        return None
    for line in answer.splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return None


def check_zookeeper_installed() -> None:
    if shutil.which("java") is None:
        raise MissingPackage("default-jre-headless", "java")
    for jar in ZOOKEEPER_CLASSPATH.split(":"):
        if not Path(jar).exists():
            package = "zookeeper" if "zookeeper" in jar else "libslf4j-java"
            raise MissingPackage(package, jar)


@dataclass
class ZooKeeperServer:
    """One ZooKeeper server: standalone, or member ``server_id`` of an ensemble of ``peers``.

    ``peers`` maps server id to (client port, quorum port, election port) for every member.
    """

    directory: Path
    client_port: int
    tick_time: int = 500
    server_id: int | None = None
    peers: Mapping[int, tuple[int, int, int]] = field(default_factory=dict)
    heap_mb: int = 256
    record: ProcessRecord | None = None
    #: a TLS client port instead of the plain one (standalone servers only), clients
    #: required to present a certificate of ``tls.ca``
    tls: ServerTls | None = None
    #: the address it listens on, and each member's (a host of its own: ``netns``)
    host: str = LOOPBACK
    peer_hosts: Mapping[int, str] = field(default_factory=dict)
    netns: str | None = None
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def log_path(self) -> Path:
        return self.directory / "zookeeper.log"

    @property
    def name(self) -> str:
        return "zookeeper" if self.server_id is None else f"zookeeper-{self.server_id}"

    def ports(self) -> dict[str, int]:
        ports = {f"{self.name} client": self.client_port}
        if self.server_id is not None:
            _, quorum, election = self.peers[self.server_id]
            ports[f"{self.name} quorum"] = quorum
            ports[f"{self.name} election"] = election
        return ports

    def write_config(self) -> Path:
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        if self.tls is None:
            port = [f"clientPort={self.client_port}", f"clientPortAddress={self.host}"]
        else:  # the secure port only: no client reaches this server without TLS
            port = [f"secureClientPort={self.client_port}",
                    f"secureClientPortAddress={LOOPBACK}",
                    "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
                    f"ssl.keyStore.location={self.tls.server_pem}", "ssl.keyStore.type=PEM",
                    f"ssl.trustStore.location={self.tls.ca}", "ssl.trustStore.type=PEM",
                    "ssl.clientAuth=need",
                    "authProvider.x509="
                    "org.apache.zookeeper.server.auth.X509AuthenticationProvider"]
        lines = [
            f"tickTime={self.tick_time}",
            f"dataDir={data}",
            *port,
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,srvr,stat,mntr",
            # Sessions from 2 to 20 ticks, the ZooKeeper defaults, stated so tests can rely on them.
            f"minSessionTimeout={2 * self.tick_time}",
            f"maxSessionTimeout={20 * self.tick_time}",
            "initLimit=10",
            "syncLimit=5",
            "maxClientCnxns=0",
        ]
        if self.server_id is not None:
            (data / "myid").write_text(f"{self.server_id}\n")
            for sid, (_, quorum, election) in sorted(self.peers.items()):
                peer = self.peer_hosts.get(sid, LOOPBACK)
                lines.append(f"server.{sid}={peer}:{quorum}:{election}")
            lines.append("quorumListenOnAllIPs=false")
        config = self.directory / "zoo.cfg"
        config.write_text("\n".join(lines) + "\n")
        return config

    def start(self) -> None:
        if self.record is not None and self.record.is_ours():
            raise DevServerError(f"{self.name} is already running (pid {self.record.pid})")
        check_zookeeper_installed()
        config = self.write_config()
        argv = [
            "java", f"-Xmx{self.heap_mb}m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-cp", ZOOKEEPER_CLASSPATH + ("" if self.tls is None else ":" + NETTY_CLASSPATH),
            "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(config),
        ]
        self._proc, self.record = spawn(self.name, in_netns(self.netns, argv), self.log_path,
                                        cwd=self.directory)

    def mode(self) -> str | None:
        return zk_mode(self.client_port, self.host,
                       tls=None if self.tls is None else self.tls.client_context())

    def wait_ready(self, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            mode = self.mode()
            if mode:
                return mode
            if self.record is not None and not self.record.is_ours():
                self._reap()
                raise ServerNotReady(f"{self.name} died while starting; log tail:\n"
                                     f"{tail(self.log_path)}")
            time.sleep(0.1)
        raise ServerNotReady(f"{self.name} not serving after {timeout:.0f}s; log tail:\n"
                             f"{tail(self.log_path)}")

    def _reap(self) -> None:
        reap(self._proc)

    def stop(self) -> None:
        if self.record is not None:
            self.record.stop()
        self._reap()

    def kill(self) -> None:
        """kill -9, for fault injection."""
        if self.record is not None:
            self.record.signal(signal.SIGKILL)
            self.record.wait_gone(10.0)
        self._reap()

    def restart(self) -> None:
        self.stop()
        self.start()

    def is_running(self) -> bool:
        return self.record is not None and self.record.is_ours()


@dataclass
class ZooKeeperCluster:
    """A standalone server (``size == 1``) or an ensemble of ``size`` servers on one host."""

    directory: Path
    size: int = 1
    tick_time: int = 500
    client_ports: Sequence[int] | None = None
    servers: list[ZooKeeperServer] = field(default_factory=list)
    #: one (address, network namespace) per server: each on a host of its own, all on the
    #: standard ports (2181, 2888, 3888); None: all on loopback, on free ports
    hosts_of: Sequence[tuple[str, str]] | None = None

    def __post_init__(self) -> None:
        if self.servers:
            return
        if self.hosts_of is not None:
            peers = {i + 1: (2181, 2888, 3888) for i in range(len(self.hosts_of))}
            addresses = {i + 1: address for i, (address, _) in enumerate(self.hosts_of)}
            self.size = len(self.hosts_of)
            self.servers = [
                ZooKeeperServer(self.directory / f"server-{sid}", 2181, self.tick_time,
                                sid if self.size > 1 else None, peers if self.size > 1 else {},
                                host=addresses[sid], peer_hosts=addresses, netns=netns)
                for sid, (_, netns) in zip(addresses, self.hosts_of, strict=True)]
            return
        if self.size < 1:
            raise DevServerError("a ZooKeeper ensemble needs at least one server")
        clients = list(self.client_ports or free_ports(self.size))
        if len(clients) != self.size:
            raise DevServerError(f"{self.size} servers need {self.size} client ports")
        if self.size == 1:
            self.servers = [ZooKeeperServer(self.directory, clients[0], self.tick_time)]
            return
        quorum = free_ports(2 * self.size)
        peers = {i + 1: (clients[i], quorum[2 * i], quorum[2 * i + 1]) for i in range(self.size)}
        self.servers = [
            ZooKeeperServer(self.directory / f"server-{sid}", port, self.tick_time, sid, peers)
            for sid, (port, _, _) in peers.items()
        ]

    @property
    def hosts(self) -> str:
        """The kazoo connection string, e.g. ``127.0.0.1:2181,127.0.0.1:2182``."""
        return ",".join(f"{s.host}:{s.client_port}" for s in self.servers)

    def ports(self) -> dict[str, int]:
        ports: dict[str, int] = {}
        for server in self.servers:
            ports.update(server.ports())
        return ports

    def start(self, timeout: float = 60.0) -> None:
        check_zookeeper_installed()
        if self.hosts_of is None:  # on hosts of their own, the ports are theirs
            check_ports_free(self.ports())
        try:
            for server in self.servers:
                server.start()
            for server in self.servers:
                server.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def leader(self) -> ZooKeeperServer:
        """The server whose ``srvr`` says leader (or the standalone server)."""
        for server in self.servers:
            if server.mode() in ("leader", "standalone"):
                return server
        raise ServerNotReady("no ZooKeeper server reports itself as leader")

    def wait_quorum(self, timeout: float = 30.0) -> None:
        """Wait until every running server serves clients again (after a fault)."""
        deadline = time.monotonic() + timeout
        for server in self.servers:
            if server.is_running():
                server.wait_ready(max(0.1, deadline - time.monotonic()))

    def log_tails(self, lines: int = 40) -> dict[str, str]:
        return {s.name: tail(s.log_path, lines) for s in self.servers}


