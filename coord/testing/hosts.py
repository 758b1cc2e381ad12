"""Hosts inside this machine: network namespaces on a bridge, one address each.

A cluster spread over several machines meets a network that a loopback proxy only imitates:
distinct addresses, links that go down, a host that can hear but not answer. This harness makes
that network here, as root: a Linux bridge in the root namespace (address ``.1``, so the test
process reaches every host), and per host a network namespace with a veth pair, one end on the
bridge, the other inside as ``eth0`` with the host's address (``10.231.N.0/24``, N picked free
per run) and its own loopback. A process runs on a host through ``ip netns exec`` (the same
process, the host's network): servers bind their host's address on their standard ports.

Faults, all done by the kernel's network stack, none by a proxy:

* :meth:`Host.cut`: the host's link down (its veth on the bridge): nothing in or out, sockets
  open, as a pulled cable or a dead switch port;
* :meth:`Host.cut_outgoing`: a one-way cut, blackhole routes inside the host to every other
  address: it still receives, but sends nothing (not even a TCP acknowledgement);
* :meth:`Host.degrade`: added latency and loss with ``tc netem``, where the kernel has it
  (:func:`netem_available`; Debian's cloud kernels often lack ``sch_netem``: the caller says so
  in one line and leaves those faults out).

Failure behaviour: not root, no ``ip``, or namespaces refused: :class:`HostsUnavailable` with
the reason in one line, before anything is made. :meth:`HostNetwork.close` deletes every
namespace and the bridge it made (the veths go with their namespaces), and only those.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from coord.testing.processes import DevServerError

#: the /16 the hosts' /24 is picked from (inside this machine's own namespaces only)
PREFIX = "10.231"


class HostsUnavailable(DevServerError):
    """This machine cannot make network namespaces (not root, no ``ip``, or refused)."""


def _ip(*args: str, netns: str | None = None,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["ip", *(["netns", "exec", netns, "ip"] if netns else []), *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False,
                            stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        raise HostsUnavailable(f"{' '.join(argv)}: {(result.stderr or result.stdout).strip()}")
    return result


def hosts_unavailable_reason() -> str | None:
    """Why this machine cannot make hosts, in one line; None when it can."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add): the hosts profile is not run"
    if shutil.which("ip") is None:
        return "no 'ip' command (Debian package iproute2): the hosts profile is not run"
    name = f"lwprobe{uuid.uuid4().hex[:6]}"
    made = _ip("netns", "add", name, check=False)
    if made.returncode != 0:
        return f"ip netns add refused: {made.stderr.strip()}: the hosts profile is not run"
    _ip("netns", "del", name, check=False)
    return None


@dataclass
class Host:
    """One host: a network namespace ``netns`` whose ``eth0`` has ``address``."""

    name: str
    address: str
    netns: str
    veth: str  # its end on the bridge, in the root namespace
    network: HostNetwork = field(repr=False)
    _blackholed: list[str] = field(default_factory=list, repr=False)

    def cut(self) -> None:
        """The link down: nothing in or out until :meth:`heal`."""
        _ip("link", "set", self.veth, "down")

    def heal(self) -> None:
        _ip("link", "set", self.veth, "up")
        self.heal_outgoing()

    def cut_outgoing(self, to: Sequence[Host] | None = None) -> None:
        """A one-way cut: every packet this host sends to ``to`` (default: every other host and
        the test process) is dropped by its own routing; what they send still arrives."""
        targets = [h.address for h in (to if to is not None else self.network.hosts)
                   if h is not self]
        if to is None:
            targets.append(self.network.gateway)
        for address in targets:
            _ip("route", "add", "blackhole", f"{address}/32", netns=self.netns)
            self._blackholed.append(address)

    def heal_outgoing(self) -> None:
        while self._blackholed:
            _ip("route", "del", "blackhole", f"{self._blackholed.pop()}/32", netns=self.netns,
                check=False)

    def degrade(self, delay_ms: int = 0, loss_percent: float = 0.0) -> None:
        """Latency and loss on everything this host sends (``tc netem``); raises
        :class:`HostsUnavailable` where the kernel has no netem."""
        spec = [*(["delay", f"{delay_ms}ms"] if delay_ms else []),
                *(["loss", f"{loss_percent}%"] if loss_percent else [])]
        result = subprocess.run(["ip", "netns", "exec", self.netns, "tc", "qdisc", "replace",
                                 "dev", "eth0", "root", "netem", *spec], capture_output=True,
                                text=True, timeout=30, check=False, stdin=subprocess.DEVNULL)
        if result.returncode != 0:
            raise HostsUnavailable(f"tc netem on {self.name}: {result.stderr.strip()}")

    def restore(self) -> None:
        subprocess.run(["ip", "netns", "exec", self.netns, "tc", "qdisc", "del", "dev", "eth0",
                        "root"], capture_output=True, timeout=30, check=False,
                       stdin=subprocess.DEVNULL)


@dataclass
class HostNetwork:
    """A bridge and the hosts on it; :meth:`close` removes them all."""

    hosts: list[Host] = field(default_factory=list)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:4])
    subnet: str = ""
    bridge: str = ""

    @property
    def gateway(self) -> str:
        """The test process's address on the bridge."""
        return f"{self.subnet}.1"

    def start(self) -> HostNetwork:
        reason = hosts_unavailable_reason()
        if reason is not None:
            raise HostsUnavailable(reason)
        taken = _ip("-4", "addr").stdout
        free = [n for n in range(1, 255) if f"{PREFIX}.{n}." not in taken]
        self.subnet = f"{PREFIX}.{random.choice(free)}"
        self.bridge = f"lwb{self.run_id}"
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        return self

    def add(self, name: str) -> Host:
        n = len(self.hosts) + 1
        netns, veth = f"lw{self.run_id}-{name}", f"lw{self.run_id}h{n}"
        address = f"{self.subnet}.{10 + n}"
        _ip("netns", "add", netns)
        host = Host(name, address, netns, veth, self)
        self.hosts.append(host)
        _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
        _ip("link", "set", f"{veth}p", "netns", netns)
        _ip("link", "set", veth, "master", self.bridge)
        _ip("link", "set", veth, "up")
        _ip("link", "set", f"{veth}p", "name", "eth0", netns=netns)
        _ip("addr", "add", f"{address}/24", "dev", "eth0", netns=netns)
        _ip("link", "set", "eth0", "up", netns=netns)
        _ip("link", "set", "lo", "up", netns=netns)
        return host

    def netem_available(self) -> bool:
        """Whether ``tc netem`` works here (tried on the first host, then removed)."""
        if not self.hosts or shutil.which("tc") is None:
            return False
        try:
            self.hosts[0].degrade(delay_ms=1)
        except HostsUnavailable:
            return False
        self.hosts[0].restore()
        return True

    def close(self) -> None:
        for host in self.hosts:
            _ip("netns", "del", host.netns, check=False)
        self.hosts = []
        if self.bridge:
            _ip("link", "del", self.bridge, check=False)
            self.bridge = ""

    def __enter__(self) -> HostNetwork:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
