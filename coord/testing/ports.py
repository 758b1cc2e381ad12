"""Free loopback ports for local servers, picked so that parallel runs do not collide.

Ports are picked below the kernel's ephemeral range (a port found free by binding port 0 can be
handed to a client's outgoing connection before the server binds it, which CI saw as "already in
use"). :func:`check_ports_free` fails with :class:`PortInUse` before anything is started.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Mapping
from pathlib import Path

from coord.testing.processes import LOOPBACK, DevServerError, PortInUse

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

# Every port handed out by this process, never handed out again: two picks in a row see the
# same ports free (nothing is bound between them), so without this two blocks could overlap.
_HANDED_OUT: set[int] = set()


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
                _HANDED_OUT.update(ports)
                return ports
            raise DevServerError(f"no block of {block} ports below the ephemeral range")
        for _ in range(500):
            if len(picked) == count:
                break
            base = random.randrange(_PICK_FROM, high)
            if _HANDED_OUT.intersection(range(base, base + block)):
                continue
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
            _HANDED_OUT.update(range(base, base + block))
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


