"""Fault injectors for tests: what happens to latchwork in production, made to happen on demand.

* :func:`expire_session`: the ZooKeeper server expires a client's session (as after a long GC
  pause or a partition), for real, and the call returns once the victim has seen LOST;
* :class:`NodeProcess`: a Python subprocess to kill -9, freeze with SIGSTOP and thaw with SIGCONT;
* :func:`broker_outage`: the RabbitMQ application stops and starts while its Erlang node stays;
* :func:`kill_ensemble_leader`: kill -9 of the ZooKeeper server that currently leads the ensemble.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient, KazooState

from runner.devservers import RabbitMQServer, ZooKeeperCluster, ZooKeeperServer


class FaultInjectionFailed(AssertionError):
    """The fault could not be injected, or the victim never noticed it."""


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


class NodeProcess:
    """A Python subprocess under test, to kill -9 or freeze.

    It is started with ``python -u <argv>``; it must print a line starting with ``READY`` (or the
    ``ready_prefix`` given to :meth:`start`) on stdout once it is ready. Every stdout line is
    kept (see :meth:`wait_for_line`); stderr goes to ``log_path``.
    """

    def __init__(self, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None,
                 name: str = "node") -> None:
        self.argv = [sys.executable, "-u", *argv]
        self.log_path = log_path
        self.env = dict(os.environ if env is None else env)
        self.name = name
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise FaultInjectionFailed(f"{self.name} was not started")
        return self._proc.pid

    def start(self, ready_timeout: float = 30.0, ready_prefix: str = "READY") -> str:
        """Start the process and return what it printed after ``ready_prefix``."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as stderr:  # the child keeps its own copy of the fd
            self._proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.PIPE, stderr=stderr, text=True,
                                          env=self.env)
        self._reader = threading.Thread(target=self._read, name=f"{self.name}-stdout", daemon=True)
        self._reader.start()
        line = self.wait_for_line(ready_prefix, ready_timeout)
        return line[len(ready_prefix):].strip()

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for_line(self, prefix: str, timeout: float) -> str:
        """The next stdout line starting with ``prefix``; earlier lines are kept in ``lines``."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise FaultInjectionFailed(
                    f"{self.name} printed no line starting with {prefix!r} within {timeout}s; "
                    f"stderr tail:\n{self.stderr_tail()}")
            try:
                line = self._queue.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                self._queue.put(None)  # keep the end marker for later callers
                raise FaultInjectionFailed(
                    f"{self.name} exited (code {self.returncode()}) before printing {prefix!r}; "
                    f"stderr tail:\n{self.stderr_tail()}")
            self.lines.append(line)
            if line.startswith(prefix):
                return line

    def wait_for_all(self, prefixes: Iterable[str], timeout: float) -> list[str]:
        """Wait until, for every prefix, some stdout line (seen before or now) starts with it.

        For lines whose order is not fixed (a worker pool handling several messages).
        """
        pending = set(prefixes)
        deadline = time.monotonic() + timeout
        found = []
        for line in [*self.lines, *self.drain()]:
            hit = next((p for p in pending if line.startswith(p)), None)
            if hit is not None:
                pending.discard(hit)
                found.append(line)
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise FaultInjectionFailed(
                    f"{self.name} printed no lines starting with {sorted(pending)} within "
                    f"{timeout}s; stderr tail:\n{self.stderr_tail()}")
            line = self.wait_for_line("", remaining)
            hit = next((p for p in pending if line.startswith(p)), None)
            if hit is not None:
                pending.discard(hit)
                found.append(line)
        return found

    def drain(self) -> list[str]:
        """Every stdout line printed so far that no wait consumed (also kept in ``lines``)."""
        new: list[str] = []
        while True:
            try:
                line = self._queue.get_nowait()
            except queue.Empty:
                return new
            if line is None:
                self._queue.put(None)
                return new
            self.lines.append(line)
            new.append(line)

    def stderr_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no stderr)"

    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def kill(self) -> None:
        """kill -9: no cleanup runs; the ZooKeeper session lives on until the server expires it."""
        self._signal(signal.SIGKILL)
        self.wait(10.0)

    def pause(self) -> None:
        """SIGSTOP: the process stops answering (heartbeats too), like a long GC pause."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait; returns the exit code (kills it if it ignores SIGTERM)."""
        self._signal(signal.SIGTERM)
        try:
            return self.wait(timeout)
        except FaultInjectionFailed:
            self.kill()
            raise

    def wait(self, timeout: float) -> int:
        assert self._proc is not None
        try:
            code = self._proc.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise FaultInjectionFailed(f"{self.name} still running after {timeout}s") from exc
        if self._reader is not None:
            self._reader.join(5.0)
        return code

    def _signal(self, sig: int) -> None:
        if self._proc is None or self._proc.poll() is not None:
            raise FaultInjectionFailed(f"{self.name} is not running")
        self._proc.send_signal(sig)

    def close(self) -> None:
        """Make sure the process is gone (thawed first, so a frozen one can die)."""
        if self.is_alive():
            try:
                self.resume()
                self.kill()
            except FaultInjectionFailed:
                pass
        if self._reader is not None:
            self._reader.join(5.0)
        if self._proc is not None and self._proc.stdout is not None:
            self._proc.stdout.close()

    def __enter__(self) -> NodeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def broker_outage(rabbitmq: RabbitMQServer) -> Iterator[None]:
    """Stop the RabbitMQ application for the body of the ``with``, then start it again.

    Clients lose their connections at once; durable queues and persistent messages survive.
    """
    rabbitmq.stop_app()
    try:
        yield
    finally:
        rabbitmq.start_app()


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


def wait_until(predicate: Callable[[], bool], timeout: float, step: float = 0.02) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` passes; returns its last value.

    For conditions no event announces (a znode appearing, a queue draining); prefer an event
    or a join when the code under test offers one.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def lose_first_set_reply(monkeypatch: Any, client: Any) -> dict[str, int]:
    """Make the next ``client.set`` reach the server but raise ConnectionLoss, as a reply lost
    on the wire would; later calls behave. Returns the call counter (``calls["n"]``)."""
    from kazoo.exceptions import ConnectionLoss
    real_set = client.set
    calls = {"n": 0}

    def set_then_lose_reply(*args: object, **kwargs: object) -> object:
        calls["n"] += 1
        result = real_set(*args, **kwargs)
        if calls["n"] == 1:
            raise ConnectionLoss("reply lost")
        return result

    monkeypatch.setattr(client, "set", set_then_lose_reply)
    return calls
