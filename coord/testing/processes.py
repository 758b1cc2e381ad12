"""Local server processes: records that never signal a reused PID, spawning and reaping.

Shared by :mod:`coord.testing.zookeeper`, :mod:`messaging.testing.rabbitmq` and
``latchwork dev``. Everything a server writes lives under one directory of the caller's.

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

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coord.testing import guard
from coord.testing.guard import proc_start_ticks as proc_start_ticks  # its home before

LOOPBACK = "127.0.0.1"



class FaultInjectionFailed(AssertionError):
    """The fault could not be injected, or the victim never noticed it."""


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


@dataclass(frozen=True)
class ProcessRecord:
    """A process we started, identified by PID *and* start time so that a reused PID is not ours."""

    name: str
    pid: int
    start_ticks: int

    @classmethod
    def of(cls, name: str, pid: int) -> ProcessRecord:
        ticks = proc_start_ticks(pid)
        if ticks is None:
            raise ServerNotReady(f"{name} (pid {pid}) exited at once")
        return cls(name, pid, ticks)

    def is_ours(self) -> bool:
        return proc_start_ticks(self.pid) == self.start_ticks

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


def in_netns(netns: str | None, argv: Sequence[str]) -> list[str]:
    """``argv`` run inside network namespace ``netns`` (``ip netns exec``: the same process,
    its network that of the namespace), or as it is when ``netns`` is None."""
    return ["ip", "netns", "exec", netns, *argv] if netns else list(argv)


def spawn(name: str, argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None,
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
        record = ProcessRecord.of(name, proc.pid)
    except ServerNotReady:
        proc.wait()
        raise ServerNotReady(f"{name} exited at once; log tail:\n{tail(log)}") from None
    guard.watch(record.pid, record.start_ticks, group=True)  # a session of its own
    return proc, record


def reap(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
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
