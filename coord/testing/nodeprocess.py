"""A Python subprocess under test, to kill -9, freeze with SIGSTOP and thaw with SIGCONT.

:class:`NodeProcess` starts ``python -u -m ...`` participants (a coord member, a messaging node, a
latchwork node) and reads their stdout lines; :func:`wait_until` polls a condition no event
announces. A participant that does not print its ready line in time fails the start with the
tail of its stderr.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from coord.testing import guard
from coord.testing.guard import proc_start_ticks
from coord.testing.processes import FaultInjectionFailed, in_netns


class NodeProcess:
    """A Python subprocess under test, to kill -9 or freeze.

    It is started with ``python -u <argv>``; it must print a line starting with ``READY`` (or the
    ``ready_prefix`` given to :meth:`start`) on stdout once it is ready. Every stdout line is
    kept (see :meth:`wait_for_line`); stderr goes to ``log_path``.
    """

    def __init__(self, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None,
                 name: str = "node", netns: str | None = None) -> None:
        #: ``netns``: run inside that network namespace (a host of its own: docs/testing.md)
        self.argv = in_netns(netns, [sys.executable, "-u", *argv])
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
        ticks = proc_start_ticks(self._proc.pid)
        if ticks is not None:  # killed with the test process, however it ends
            guard.watch(self._proc.pid, ticks, group=False)
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

    def terminate(self, timeout: float = 30.0,
                  on_timeout: Callable[[int], None] | None = None) -> int:
        """SIGTERM, then wait; returns the exit code (kills it if it ignores SIGTERM, after
        ``on_timeout(pid)``, e.g. a dump of its threads' stacks, when given)."""
        self._signal(signal.SIGTERM)
        try:
            return self.wait(timeout)
        except FaultInjectionFailed:
            if on_timeout is not None and self._proc is not None:
                on_timeout(self._proc.pid)
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


