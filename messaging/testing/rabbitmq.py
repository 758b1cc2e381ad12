"""RabbitMQ as a local process: one broker node with its own HOME, mnesia, logs and epmd.

Ready means the node answers the AMQP 0-9-1 header with Connection.Start. ``stop_app`` /
``start_app`` give a broker outage while the Erlang node stays. A missing ``rabbitmq-server`` or
Erlang raises :class:`~coord.testing.processes.MissingPackage`; a broker not ready in time raises
:class:`~coord.testing.processes.ServerNotReady` with its log tail.

Why one module: the broker's files, environment, ports and its ``rabbitmqctl`` control share
one node name and one directory layout (on loopback or in a host's network namespace); apart,
each part would rebuild that layout.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from coord.testing import guard
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

RABBITMQ_BIN = Path(os.environ.get("LATCHWORK_DEV_RABBITMQ_BIN", "/usr/lib/rabbitmq/bin"))


# --------------------------------------------------------------------------------------------
# RabbitMQ

AMQP_HEADER = b"AMQP\x00\x00\x09\x01"


def amqp_handshake(port: int, host: str = LOOPBACK, timeout: float = 1.0,
                   tls: ssl.SSLContext | None = None) -> bool:
    """True when the broker answers the AMQP 0-9-1 protocol header with Connection.Start
    (over TLS with ``tls``)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw, \
                (raw if tls is None else tls.wrap_socket(raw, server_hostname=host)) as sock:
            sock.sendall(AMQP_HEADER)
            frame = sock.recv(7)
    except OSError:  # ssl.SSLError included
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


class BrokerControl:
    """What the fixtures and faults do to a broker through ``rabbitmqctl``: shared by the local
    node (:class:`RabbitMQServer`) and the container (``messaging.testing.containers``)."""

    #: the user the tests connect as; every vhost made here grants it everything
    user: ClassVar[str] = "guest"

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        raise NotImplementedError

    def wait_ready(self, timeout: float = 60.0) -> None:
        raise NotImplementedError

    def add_vhost(self, vhost: str) -> None:
        self.ctl("add_vhost", vhost)
        self.ctl("set_permissions", "-p", vhost, self.user, ".*", ".*", ".*")

    def delete_vhost(self, vhost: str) -> None:
        self.ctl("delete_vhost", vhost)

    def stop_app(self) -> None:
        """Stop the RabbitMQ application (the Erlang node stays up): clients see the broker go."""
        self.ctl("stop_app")

    def start_app(self) -> None:
        self.ctl("start_app")
        self.wait_ready()


@dataclass
class RabbitMQServer(BrokerControl):
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
    #: a TLS listener on ``node_port`` instead of the plain one, clients required to present
    #: a certificate of ``tls.ca`` (the same files as ZooKeeper's; see coord.testing.tls)
    tls: ServerTls | None = None
    #: The broker's VM (beam.smp), read from its pid file once it is ready.
    record: ProcessRecord | None = None
    #: The ``rabbitmq-server`` shell script, which stays the VM's parent while it runs.
    launcher: ProcessRecord | None = None
    #: the address AMQP listens on; ``netns``: a host of its own (its epmd and distribution
    #: port stay on that host's loopback)
    host: str = LOOPBACK
    netns: str | None = None
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
    def broker_log(self) -> Path:
        """The broker's own log (``RABBITMQ_LOGS``): every connection opened and closed, with
        the client's name and vhost; written a moment after the event."""
        return self.directory / "log" / "rabbit.log"

    @property
    def scheme(self) -> str:
        return "amqp" if self.tls is None else "amqps"

    @property
    def url(self) -> str:
        return f"{self.scheme}://guest:guest@{self.host}:{self.node_port}/%2F"

    def url_for(self, vhost: str) -> str:
        from urllib.parse import quote

        return (f"{self.scheme}://guest:guest@{self.host}:{self.node_port}/"
                f"{quote(vhost, safe='')}")

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
            "RABBITMQ_NODE_IP_ADDRESS": self.host,
            "RABBITMQ_NODE_PORT": str(self.node_port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": LOOPBACK,
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_LOGS": str(self.broker_log),
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
        if self.tls is None:
            listener = f"listeners.tcp.default = {self.host}:{self.node_port}\n"
        else:  # TLS only: no plain listener at all
            listener = ("listeners.tcp = none\n"
                        f"listeners.ssl.default = {self.host}:{self.node_port}\n"
                        f"ssl_options.cacertfile = {self.tls.ca}\n"
                        f"ssl_options.certfile = {self.tls.server_cert}\n"
                        f"ssl_options.keyfile = {self.tls.server_key}\n"
                        "ssl_options.verify = verify_peer\n"
                        "ssl_options.fail_if_no_peer_cert = true\n")
        if self.host != LOOPBACK:  # on a host of its own: clients come from other addresses
            listener += "loopback_users.guest = false\n"
        (d / "rabbitmq.conf").write_text(
            listener +
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
        if self.netns is None:  # on a host of its own, the ports are its own
            check_ports_free(self.ports())
        self.write_config()
        (self.directory / "rabbitmq.pid").unlink(missing_ok=True)
        self.record = None
        self._proc, self.launcher = spawn(
            "rabbitmq-server", in_netns(self.netns, [str(RABBITMQ_BIN / "rabbitmq-server")]),
            self.log_path,
            env=self.env(), cwd=self.directory,
        )

    def is_ready(self) -> bool:
        return amqp_handshake(self.node_port, self.host,
                              tls=None if self.tls is None else self.tls.client_context())

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
        guard.watch(self.record.pid, self.record.start_ticks, group=False)

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.log_path, lines)

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        """Run ``rabbitmqctl`` on this node; DevServerError carries its output on failure."""
        result = subprocess.run(
            in_netns(self.netns, [str(RABBITMQ_BIN / "rabbitmqctl"), "-n", self.nodename, *args]),
            env=self.env(), capture_output=True, text=True, timeout=timeout, check=False,
            stdin=subprocess.DEVNULL,
        )
        if result.returncode != 0:
            raise DevServerError(f"rabbitmqctl {' '.join(args)} failed: "
                                 f"{(result.stderr or result.stdout).strip()}")
        return result.stdout

    def _reap(self) -> None:
        reap(self._proc)

    def kill_epmd(self) -> None:
        """Stop the private epmd the node started (it outlives the node)."""
        try:
            epmd = _find_epmd()
        except MissingPackage:
            return
        env = {k: v for k, v in os.environ.items() if not k.startswith("ERL_")}
        subprocess.run(in_netns(self.netns, [epmd, "-port", str(self.epmd_port), "-kill"]),
                       env=env,
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


