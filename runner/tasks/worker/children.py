"""A handler process as the node sees it (:mod:`runner.tasks.worker.isolated`), a typed state
per stage: :class:`Child` (the process, its channel, the memory it shares with the node, how
many attempts it ran) holds a :class:`Busy` while it runs an attempt (that attempt's context
and type, and the keeper's marks for it), and none while it is idle: a new attempt starts
from fresh marks, never from the last one's."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Protocol

from runner.errors import HandlerCrashed
from runner.tasks.context import TaskContext
from runner.tasks.registry import TaskType
from runner.tasks.worker.channel import Channel

PAGE = os.sysconf("SC_PAGE_SIZE")


class Shared(Protocol):
    """A value in memory shared with the child (``multiprocessing.RawValue``)."""
    value: float


@dataclass(eq=False)
class Busy:
    """A child's attempt: its context and type, the token callback to forget, and the
    keeper's marks: when the attempt was first seen cancelled (``signalled``), when the child
    was sent SIGTERM for ignoring that (``termed``), when its RSS was last read, and why the
    keeper killed it (when it did)."""
    ctx: TaskContext
    kind: TaskType
    forget: Callable[[], None] | None = None
    signalled: float | None = None
    termed: float | None = None
    rss_at: float = 0.0
    killed_for: HandlerCrashed | None = None


@dataclass(eq=False)
class Child:
    """One handler process: ``flag`` a shared byte (0 running, 1 cancelled, 2 cancelled for a
    time limit), ``deadline`` a shared double (the session's deadline, CLOCK_MONOTONIC);
    ``successor_started`` with its last attempt, or when it left; ``busy`` while it runs an
    attempt."""
    proc: BaseProcess
    channel: Channel
    flag: Shared
    deadline: Shared
    runs: int = 0
    successor_started: bool = False
    busy: Busy | None = field(default=None)

    def rss_mib(self) -> float:
        try:
            with open(f"/proc/{self.proc.pid}/statm") as f:
                return int(f.read().split()[1]) * PAGE / 2**20
        except (OSError, IndexError, ValueError):
            return 0.0

    def signal(self, number: int) -> None:
        if self.proc.pid is None:
            return
        try:
            os.kill(self.proc.pid, number)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL and reap (never from the keeper: only the thread that ran it reads its
        exit status); none to a child known to have ended (its pid may be another's now)."""
        if self.proc.exitcode is None:
            self.signal(signal.SIGKILL)
        self.proc.join(5)
