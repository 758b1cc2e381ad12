"""The test run's servers and nodes end with the process that started them, however it ends.

A pytest process that is SIGTERMed or killed runs no finalizer: the ZooKeeper, RabbitMQ and
Gremlin servers and the node processes it started were left running, holding their ports and
a core (``timeout`` in front of pytest, a CI job cancelled, a worker of ``pytest -n`` whose
controller died). :func:`enable` (the pytest plugin calls it) starts one small guard process
per test process; every server :func:`~coord.testing.processes.spawn` starts and every
:class:`~coord.testing.nodeprocess.NodeProcess` is told to it (:func:`watch`) through a pipe.
When the pipe closes, which the kernel does when the test process ends in any way, the guard
SIGKILLs every process it was told of that is still the one it was told of (its PID and start
time: a reused PID is never hit), the servers with their process group. A test process that
ends normally has stopped them already: the guard then finds none of them and exits.

Left out: RabbitMQ's private ``epmd`` daemon (it detaches from the broker's group; the fixture's
stop kills it by its port), and ``latchwork dev up``'s servers, which are meant to outlive the
command (the guard is only enabled in test processes).

Usage (the guard itself): ``python -m coord.testing.guard``, the lines on its stdin.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

_lock = threading.Lock()
_guard: subprocess.Popen[str] | None = None
_enabled = False


def proc_start_ticks(pid: int) -> int | None:
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


def enable() -> None:
    """Guard every process watched from now on in this process (started lazily, once)."""
    global _enabled
    _enabled = True


def watch(pid: int, start_ticks: int, group: bool) -> None:
    """Tell the guard of a process this one started (``group``: it leads its process group,
    which is killed with it). Nothing when the guard is not enabled; a guard that cannot be
    started or told is not an error (the finalizers still stop what they started)."""
    global _guard
    if not _enabled:
        return
    with _lock:
        try:
            if _guard is None:
                _guard = subprocess.Popen(
                    [sys.executable, "-m", "coord.testing.guard"], stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                    start_new_session=True,  # a Ctrl-C in the terminal is not for it
                    cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                        os.path.abspath(__file__)))))
                atexit.register(_close)
            assert _guard.stdin is not None
            _guard.stdin.write(f"{pid} {start_ticks} {int(group)}\n")
            _guard.stdin.flush()
        except OSError:
            pass


def _close() -> None:
    """At this process's normal exit: the pipe closed (the guard ends what is left, which the
    finalizers have stopped already) and the guard waited for."""
    if _guard is not None and _guard.stdin is not None:
        try:
            _guard.stdin.close()
            _guard.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            pass


def _end(watched: list[tuple[int, int, bool]]) -> None:
    for pid, ticks, group in watched:
        if proc_start_ticks(pid) != ticks:
            continue  # stopped by its finalizer, or its PID taken by another process since
        try:
            if group:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watched = []
    for line in sys.stdin:
        pid, ticks, group = line.split()
        watched.append((int(pid), int(ticks), group == "1"))
    _end(watched)


if __name__ == "__main__":
    main()
