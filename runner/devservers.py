"""Local ZooKeeper and RabbitMQ servers as plain processes bound to 127.0.0.1.

Used by ``latchwork dev`` (for people) and by :mod:`runner.testing` (for tests). Everything a
server writes (configuration, data, logs) lives under one directory of ours, so two sets of
servers never share state and nothing is written to /etc or /var.

Failure behaviour:

* a missing Debian package raises :class:`MissingPackage` naming the package and the command
  that installs it, before anything is started;
* a port that is already taken raises :class:`PortInUse` before anything is started;
* a server that does not become ready in time raises :class:`ServerNotReady` (its log tail
  is in the message) and the caller stops what it started;
* stopping only ever signals a PID we recorded, and only while ``/proc/<pid>/stat`` still shows
  the start time we recorded (:class:`ProcessRecord.is_ours`), so a reused PID is never hit.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ZOOKEEPER_CLASSPATH = os.environ.get(
    "LATCHWORK_DEV_ZOOKEEPER_CLASSPATH",
    "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar",
)
RABBITMQ_BIN = Path(os.environ.get("LATCHWORK_DEV_RABBITMQ_BIN", "/usr/lib/rabbitmq/bin"))
LOOPBACK = "127.0.0.1"


class DevServerError(Exception):
    """Root of the errors raised while starting or stopping local servers."""


class MissingPackage(DevServerError):
    """A Debian package the servers need is not installed."""

    def __init__(self, package: str, missing: str) -> None:
        super().__init__(
            f"{missing} not found: the Debian package '{package}' is missing; "
            f"install it with: apt-get install -y {package}"
        )
        self.package = package


class PortInUse(DevServerError):
    """A port we were asked to bind is already taken by someone else."""

    def __init__(self, port: int, what: str) -> None:
        super().__init__(f"port {port} on {LOOPBACK} ({what}) is already in use")
        self.port = port


class ServerNotReady(DevServerError):
    """A server process did not become ready in time, or died while starting."""


# --------------------------------------------------------------------------------------------
# processes


def _proc_start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie is as good as dead
        return None
    return int(fields[19])


@dataclass(frozen=True)
class ProcessRecord:
    """A process we started, identified by PID *and* start time so that a reused PID is not ours."""

    name: str
    pid: int
    start_ticks: int

    @classmethod
    def of(cls, name: str, pid: int) -> ProcessRecord:
        ticks = _proc_start_ticks(pid)
        if ticks is None:
            raise ServerNotReady(f"{name} (pid {pid}) exited at once")
        return cls(name, pid, ticks)

    def is_ours(self) -> bool:
        return _proc_start_ticks(self.pid) == self.start_ticks

    def signal(self, sig: int, group: bool = False) -> bool:
        """Send ``sig`` if the process is still ours; False when it is gone (or not ours).

        ``group`` signals the process group the process leads (we start servers in a session of
        their own, so the group is the server and the children it did not detach).
        """
        if not self.is_ours():
            return False
        try:
            if group:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def wait_gone(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.is_ours():
                return True
            time.sleep(0.05)
        return not self.is_ours()

    def stop(self, timeout: float = 15.0, group: bool = False) -> None:
        """SIGTERM, then SIGKILL after ``timeout``. Never signals a PID that is no longer ours."""
        if self.signal(signal.SIGTERM, group) and not self.wait_gone(timeout):
            self.signal(signal.SIGKILL, group)
            self.wait_gone(5.0)


def _spawn(name: str, argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None,
           cwd: Path | None = None) -> tuple[subprocess.Popen[bytes], ProcessRecord]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,  # a Ctrl-C in the terminal is for us, not for the servers
        )
    try:
        return proc, ProcessRecord.of(name, proc.pid)
    except ServerNotReady:
        proc.wait()
        raise ServerNotReady(f"{name} exited at once; log tail:\n{tail(log)}") from None


def _reap(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    """Collect the exit status of a child we started and then signalled.

    ``/proc/<pid>/stat`` may stop being readable while a killed process is still exiting, so
    :meth:`ProcessRecord.wait_gone` can return before the child is a zombie; ``wait`` here
    closes that gap. A child that is not ours (a state file from another run) has no Popen.
    """
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pass  # still running: the caller decides (it only reaps what it has signalled)


def tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


# --------------------------------------------------------------------------------------------
# ports


def _ephemeral_floor() -> int:
    """The lowest port the kernel hands to outgoing connections."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


# Servers started on picked ports get them from below the kernel's ephemeral range: a port
# picked there by binding port 0 can be handed to an outgoing connection (a client's local
# port) before the server binds it, which CI saw as "already in use".
_PICK_FROM = 20000


def _pick(count: int, block: int) -> list[int]:
    """``count`` bases of ``block`` consecutive free ports each, all distinct, held bound until
    every one is picked."""
    high = _ephemeral_floor() - block
    socks: list[socket.socket] = []
    picked: list[int] = []
    try:
        if high <= _PICK_FROM:  # an unusual ephemeral range: let the kernel choose
            for _ in range(count * block):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.bind((LOOPBACK, 0))
                socks.append(sock)
            ports = [int(sock.getsockname()[1]) for sock in socks]
            if block == 1:
                return ports
            raise DevServerError(f"no block of {block} ports below the ephemeral range")
        for _ in range(500):
            if len(picked) == count:
                break
            base = random.randrange(_PICK_FROM, high)
            taken: list[socket.socket] = []
            try:
                for port in range(base, base + block):
                    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    taken.append(sock)
                    sock.bind((LOOPBACK, port))
            except OSError:
                for sock in taken:
                    sock.close()
                continue
            socks.extend(taken)
            picked.append(base)
        if len(picked) < count:
            raise DevServerError(f"found no {count} free block(s) of {block} port(s) on "
                                 f"{LOOPBACK}")
        return picked
    finally:
        for sock in socks:
            sock.close()


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports, below the kernel's ephemeral range."""
    return _pick(count, 1)


def free_port_block(size: int) -> int:
    """The first of ``size`` consecutive free loopback ports (e.g. ``latchwork dev up
    --zk-port BASE`` with an ensemble of ``size``), below the kernel's ephemeral range."""
    return _pick(1, size)[0]


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def port_is_listening(port: int, host: str = LOOPBACK) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def check_ports_free(ports: Mapping[str, int]) -> None:
    for what, port in ports.items():
        if not port_is_free(port):
            raise PortInUse(port, what)


# --------------------------------------------------------------------------------------------
# ZooKeeper


def zk_four_letter(port: int, command: str = "srvr", host: str = LOOPBACK,
                   timeout: float = 1.0) -> str | None:
    """Send a four-letter word; None when the server does not answer."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(command.encode())
            chunks = []
            while True:
                data = sock.recv(4096)
                if not data:
                    break
                chunks.append(data)
    except OSError:
        return None
    return b"".join(chunks).decode(errors="replace")


def zk_mode(port: int, host: str = LOOPBACK) -> str | None:
    """'standalone', 'leader' or 'follower' once the server serves clients, else None.

    ``ruok`` answers ``imok`` before an ensemble has a quorum; ``srvr`` prints a ``Mode:``
    line only once the server really serves requests.
    """
    answer = zk_four_letter(port, "srvr", host)
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
        lines = [
            f"tickTime={self.tick_time}",
            f"dataDir={data}",
            f"clientPort={self.client_port}",
            f"clientPortAddress={LOOPBACK}",
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
                lines.append(f"server.{sid}={LOOPBACK}:{quorum}:{election}")
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
            "-cp", ZOOKEEPER_CLASSPATH,
            "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(config),
        ]
        self._proc, self.record = _spawn(self.name, argv, self.log_path, cwd=self.directory)

    def mode(self) -> str | None:
        return zk_mode(self.client_port)

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
        _reap(self._proc)

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

    def __post_init__(self) -> None:
        if self.servers:
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
        return ",".join(f"{LOOPBACK}:{s.client_port}" for s in self.servers)

    def ports(self) -> dict[str, int]:
        ports: dict[str, int] = {}
        for server in self.servers:
            ports.update(server.ports())
        return ports

    def start(self, timeout: float = 60.0) -> None:
        check_zookeeper_installed()
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


# --------------------------------------------------------------------------------------------
# RabbitMQ

AMQP_HEADER = b"AMQP\x00\x00\x09\x01"


def amqp_handshake(port: int, host: str = LOOPBACK, timeout: float = 1.0) -> bool:
    """True when the broker answers the AMQP 0-9-1 protocol header with Connection.Start."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(AMQP_HEADER)
            frame = sock.recv(7)
    except OSError:
        return False
    # A method frame (type 1) on channel 0: Connection.Start.
    return len(frame) == 7 and frame[0] == 1 and frame[1:3] == b"\x00\x00"


def check_rabbitmq_installed() -> None:
    if not (RABBITMQ_BIN / "rabbitmq-server").exists():
        raise MissingPackage("rabbitmq-server", str(RABBITMQ_BIN / "rabbitmq-server"))
    if shutil.which("erl") is None:
        raise MissingPackage("erlang-base", "erl")


def _find_epmd() -> str:
    found = shutil.which("epmd")
    if found:
        return found
    for candidate in sorted(Path("/usr/lib/erlang").glob("erts-*/bin/epmd")):
        return str(candidate)
    raise MissingPackage("erlang-base", "epmd")


@dataclass
class RabbitMQServer:
    """One RabbitMQ node with its own HOME (Erlang cookie), mnesia, logs, ports and epmd.

    The node listens on ``node_port`` (AMQP), ``dist_port`` (Erlang distribution) and a private
    epmd on ``epmd_port``, all on 127.0.0.1. ``consumer_timeout`` is set in the config file
    because the broker in Debian 12 (3.10) has no per-queue ``x-consumer-timeout``.
    """

    directory: Path
    node_port: int
    dist_port: int
    epmd_port: int
    nodename: str = ""
    consumer_timeout_ms: int = 30 * 60 * 1000
    #: The broker's VM (beam.smp), read from its pid file once it is ready.
    record: ProcessRecord | None = None
    #: The ``rabbitmq-server`` shell script, which stays the VM's parent while it runs.
    launcher: ProcessRecord | None = None
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.nodename:
            self.nodename = f"latchwork{self.node_port}@localhost"

    @classmethod
    def on_free_ports(cls, directory: Path, **kwargs: int | str) -> RabbitMQServer:
        node, dist, epmd = free_ports(3)
        return cls(directory, node, dist, epmd, **kwargs)  # type: ignore[arg-type]

    @property
    def log_path(self) -> Path:
        return self.directory / "log" / "console.log"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{LOOPBACK}:{self.node_port}/%2F"

    def url_for(self, vhost: str) -> str:
        from urllib.parse import quote

        return f"amqp://guest:guest@{LOOPBACK}:{self.node_port}/{quote(vhost, safe='')}"

    def ports(self) -> dict[str, int]:
        return {"rabbitmq amqp": self.node_port, "rabbitmq distribution": self.dist_port,
                "rabbitmq epmd": self.epmd_port}

    def env(self) -> dict[str, str]:
        d = self.directory
        loopback_dist = "-kernel inet_dist_use_interface {127,0,0,1}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update({
            "HOME": str(d / "home"),
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_NODE_IP_ADDRESS": LOOPBACK,
            "RABBITMQ_NODE_PORT": str(self.node_port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": LOOPBACK,
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_LOGS": str(d / "log" / "rabbit.log"),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(d / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(d / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(d / "rabbitmq.pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": loopback_dist,
            "RABBITMQ_CTL_ERL_ARGS": loopback_dist,
            # The CLI tools take a distribution port of their own from this range.
            "RABBITMQ_CTL_DIST_PORT_MIN": str(self.dist_port + 1),
            "RABBITMQ_CTL_DIST_PORT_MAX": str(self.dist_port + 40),
        })
        return env

    def write_config(self) -> None:
        d = self.directory
        for sub in ("home", "mnesia", "log"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = {LOOPBACK}:{self.node_port}\n"
            f"consumer_timeout = {self.consumer_timeout_ms}\n"
            "log.console = true\n"
            "log.console.level = info\n"
            "log.file = false\n"
            # Small machines: do not block publishers because the disk has "only" some GB free.
            "disk_free_limit.absolute = 50MB\n"
        )
        (d / "advanced.config").write_text("[].\n")
        (d / "rabbitmq-env.conf").write_text("")
        (d / "enabled_plugins").write_text("[].\n")

    def start(self) -> None:
        if self.is_running():
            raise DevServerError(f"rabbitmq is already running from {self.directory}")
        check_rabbitmq_installed()
        check_ports_free(self.ports())
        self.write_config()
        (self.directory / "rabbitmq.pid").unlink(missing_ok=True)
        self.record = None
        self._proc, self.launcher = _spawn(
            "rabbitmq-server", [str(RABBITMQ_BIN / "rabbitmq-server")], self.log_path,
            env=self.env(), cwd=self.directory,
        )

    def is_ready(self) -> bool:
        return amqp_handshake(self.node_port)

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.is_ready():
                self._record_vm()
                return
            if not self.is_running():
                self._reap()
                raise ServerNotReady(f"rabbitmq died while starting; log tail:\n"
                                     f"{tail(self.log_path)}")
            time.sleep(0.1)
        raise ServerNotReady(f"rabbitmq not answering AMQP after {timeout:.0f}s; log tail:\n"
                             f"{tail(self.log_path)}")

    def _record_vm(self) -> None:
        if self.record is not None and self.record.is_ours():
            return
        pid_file = self.directory / "rabbitmq.pid"
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError) as exc:
            raise ServerNotReady(f"rabbitmq answers but wrote no pid file at {pid_file}") from exc
        self.record = ProcessRecord.of("rabbitmq", pid)

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        """Run ``rabbitmqctl`` on this node; DevServerError carries its output on failure."""
        result = subprocess.run(
            [str(RABBITMQ_BIN / "rabbitmqctl"), "-n", self.nodename, *args],
            env=self.env(), capture_output=True, text=True, timeout=timeout, check=False,
            stdin=subprocess.DEVNULL,
        )
        if result.returncode != 0:
            raise DevServerError(f"rabbitmqctl {' '.join(args)} failed: "
                                 f"{(result.stderr or result.stdout).strip()}")
        return result.stdout

    def add_vhost(self, vhost: str) -> None:
        self.ctl("add_vhost", vhost)
        self.ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")

    def delete_vhost(self, vhost: str) -> None:
        self.ctl("delete_vhost", vhost)

    def stop_app(self) -> None:
        """Stop the RabbitMQ application (the Erlang node stays up): clients see the broker go."""
        self.ctl("stop_app")

    def start_app(self) -> None:
        self.ctl("start_app")
        self.wait_ready()

    def _reap(self) -> None:
        _reap(self._proc)

    def kill_epmd(self) -> None:
        """Stop the private epmd the node started (it outlives the node)."""
        try:
            epmd = _find_epmd()
        except MissingPackage:
            return
        env = {k: v for k, v in os.environ.items() if not k.startswith("ERL_")}
        subprocess.run([epmd, "-port", str(self.epmd_port), "-kill"], env=env,
                       capture_output=True, timeout=10, check=False, stdin=subprocess.DEVNULL)

    def _processes(self) -> list[ProcessRecord]:
        return [r for r in (self.record, self.launcher) if r is not None]

    def stop(self) -> None:
        """Graceful stop (SIGTERM to the VM, then its launcher's group), then the private epmd.

        The group covers a VM that was started but had not written its pid file yet.
        """
        if self.record is not None:
            self.record.stop(timeout=30.0)
        if self.launcher is not None:
            self.launcher.stop(timeout=30.0, group=True)
        self._reap()
        self.kill_epmd()

    def kill(self) -> None:
        """kill -9 of the VM and its launcher, for fault injection (epmd survives, as it would)."""
        if self.record is not None:
            self.record.signal(signal.SIGKILL)
        if self.launcher is not None:
            self.launcher.signal(signal.SIGKILL, group=True)
        for record in self._processes():
            record.wait_gone(10.0)
        self._reap()

    def is_running(self) -> bool:
        return any(r.is_ours() for r in self._processes())


# --------------------------------------------------------------------------------------------
# the set that ``latchwork dev`` starts

DEFAULT_ZK_PORT = 22181
DEFAULT_AMQP_PORT = 25673
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

    @classmethod
    def plan(cls, directory: Path, zk_size: int = 1, zk_port: int = DEFAULT_ZK_PORT,
             amqp_port: int = DEFAULT_AMQP_PORT, tick_time: int = 2000) -> DevEnvironment:
        directory = directory.resolve()
        clients = [zk_port + i for i in range(zk_size)]
        zookeeper = ZooKeeperCluster(directory / "zookeeper", zk_size, tick_time, clients)
        # Distribution and epmd ports sit next to the AMQP port so a user can predict them.
        rabbitmq = RabbitMQServer(directory / "rabbitmq", amqp_port, amqp_port + 1, amqp_port + 2,
                                  nodename=f"latchwork-dev{amqp_port}@localhost")
        return cls(directory, zookeeper, rabbitmq)

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
        return cls(directory, zookeeper, rabbitmq)

    # -- lifecycle ---------------------------------------------------------------------------

    def up(self, timeout: float = 90.0) -> None:
        existing = DevEnvironment.load(self.directory)
        if existing is not None and existing.any_running():
            raise DevServerError(f"servers are already running from {self.directory}; "
                                 f"run 'latchwork dev down --dir {self.directory}' first")
        check_zookeeper_installed()
        check_rabbitmq_installed()
        check_ports_free({**self.zookeeper.ports(), **self.rabbitmq.ports()})
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
        except BaseException:
            self.down()
            raise

    def down(self) -> None:
        self.rabbitmq.stop()
        self.zookeeper.stop()
        (self.directory / STATE_FILE).unlink(missing_ok=True)

    def any_running(self) -> bool:
        return self.rabbitmq.is_running() or any(s.is_running() for s in self.zookeeper.servers)

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
        return rows

    def exports(self) -> dict[str, str]:
        """Connection settings, named as :class:`runner.config.Settings` reads them."""
        return {"LATCHWORK_ZK_HOSTS": self.zookeeper.hosts, "LATCHWORK_AMQP_URL": self.rabbitmq.url}


def terminate_all(procs: Sequence[subprocess.Popen[Any]], timeout: float = 30.0) -> None:
    """SIGTERM every process still running (all at once), wait, and kill what is left."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
