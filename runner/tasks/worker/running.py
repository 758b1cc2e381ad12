"""The tasks a node is taking, running and ending, as typed stages, and how many workers it
has free.

A task goes through three stages on a node, each a value of its own:

* :class:`Slot`: the task registered here before its lock is tried (its lock, its slot
  booking, its cancellation token), so a session lost during the try or the claim still
  cancels it; it holds the :class:`Claimed` once the claim is written;
* :class:`Claimed`: the claim written: the task as claimed, its RUNNING attempt and the fencing
  token it was claimed with (its lock's);
* :class:`Ending`: the handler returned: what its attempt came to (an :data:`~.ends.End`),
  the store write it is made of and the observers to tell; the group commit writes it, tells
  them, releases the lock and tells the loop.

:class:`RunningSet` holds one member's slots: those running (each holds a worker) and those
ending (their end is being written: the worker is free already, the lock still held), and the
tasks its handlers declined (left to the other nodes for a while). Nothing here does I/O or
fails.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from coord import Booking, SessionState, TaskLock
from runner.store import Attempt, EndWrite, Task
from runner.tasks.context import CancelToken
from runner.tasks.outcomes import AttemptResult, Outcome
from runner.tasks.worker.ends import Audience, End, outcome_of, result_of, write_of


class AttemptSession(Protocol):
    """What running attempts needs of the node's ZooKeeper session (a
    :class:`coord.Session`; the task stub's own in :mod:`runner.testing.stub`): its state, its
    deadline (a ``CLOCK_MONOTONIC`` instant past which nothing it holds can be trusted), and
    ``confirm()``: whether it is valid now (a clock read; while SUSPENDED it waits, bounded by
    the deadline)."""

    @property
    def state(self) -> SessionState: ...

    @property
    def deadline(self) -> float: ...

    def confirm(self) -> bool: ...


@dataclass(frozen=True)
class Claimed:
    """A written claim: ``task`` as claimed (RUNNING, this member its owner), its RUNNING
    ``attempt``, and the ``token`` it was claimed with."""
    task: Task
    attempt: Attempt
    token: int


@dataclass(eq=False)
class Slot:
    """A task taken by this node, from before its lock is tried to its end written."""
    task: Task  # as listed (or as submitted)
    lock: TaskLock
    booking: Booking | None
    cancel: CancelToken
    #: the tasks after this one in its key's queue, as the claim read it (its first check)
    key_queue: list[Task] = field(default_factory=list)
    #: set once its end is written and its lock released (or it was let go unclaimed)
    done: threading.Event = field(default_factory=threading.Event)
    claim: Claimed | None = None

    @property
    def task_id(self) -> str:
        return self.task.id

    def reclaimed(self, claim: Claimed) -> Claimed:
        """The slot's task claimed again by its owner (a commit conflict's retry: a new claim
        with its new attempt, the old one closed); the claim."""
        self.claim = claim
        return claim


@dataclass(frozen=True)
class Ending:
    """What a slot's last attempt came to (``end``: :mod:`.ends`), with the store write it is
    made of (``write``: built when the handler returned, None when nothing is left to write)
    and the observers to tell once it is written (``audience``: None when they were told
    already, or none heard its start)."""
    slot: Slot
    claim: Claimed
    end: End
    write: EndWrite | None
    audience: Audience | None = None
    #: whether the worker waits for it to be written (an ordering key's chain, a booking
    #: kept): otherwise the worker is free when its handler returns
    waited: bool = False

    @classmethod
    def of(cls, slot: Slot, claim: Claimed, end: End,
           audience: Audience | None = None) -> Ending:
        return cls(slot, claim, end, write_of(end, claim.task, claim.attempt, claim.token),
                   audience)

    @property
    def outcome(self) -> Outcome:
        return outcome_of(self.end)

    @property
    def result(self) -> AttemptResult:
        return result_of(self.end)


class Admission(enum.Enum):
    """What became of a task a node accepted (:meth:`TaskLoop.accept`)."""

    STARTED = "started"  # written RUNNING here, with its attempt; its handler runs
    QUEUED = "queued"  # written WAITING; this node has a free worker and scans for it now
    ELSEWHERE = "elsewhere"  # written WAITING; this node cannot start it now: tell the others


@dataclass(frozen=True)
class Admitted:
    task: Task  # as written
    admission: Admission


class RunningSet:
    """The slots of one member, its ``workers`` and the tasks it declined.

    Claiming ahead: a task of a type whose handlers are short here (their moving mean, over
    at least twice the workers' worth of that type's handlers, under ``short`` seconds) may be
    claimed beyond the free workers, up to ``prefetch`` times the workers, while no handler has
    been running for longer than ``short``: it waits in the pool's queue for a worker. So the
    next batch is claimed while handlers run, and batches grow past the number of workers (one
    lock transaction and one store write for all of them). Each type is judged by its own
    handlers: a task of a type not seen here, or whose handlers are long, is claimed only for a
    free worker (:meth:`room`), so a node that has just drained short tasks does not sit on
    long ones another node could run. A long handler stops all claiming ahead at once.
    ``prefetch`` 0: never."""

    def __init__(self, workers: int, prefetch: float = 0.0, short: float = 0.05) -> None:
        self.workers = workers
        self.prefetch = prefetch
        self.short = short
        self._running: dict[str, Slot] = {}
        self._ending: dict[str, Slot] = {}
        self._started: dict[str, float] = {}  # handlers running now: when each began
        #: per task type: the moving mean of its handlers' durations, and how many it heard of
        self._means: dict[str, tuple[float, int]] = {}
        self._short_types: set[str] = set()  # the types that may be claimed ahead now
        #: tasks this node's handlers declined, and until when it leaves them to the others
        self._declined: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, slot: Slot) -> None:
        with self._lock:
            self._running[slot.task_id] = slot

    def begin(self, slot: Slot) -> None:
        """``slot``'s handler starts (a worker took it from the queue)."""
        with self._lock:
            self._started[slot.task_id] = time.monotonic()

    def returned(self, slot: Slot) -> None:
        """``slot``'s handler returned: its duration joins its type's moving mean."""
        with self._lock:
            began = self._started.pop(slot.task_id, None)
            if began is None:
                return
            took = time.monotonic() - began
            kind = slot.task.type
            mean, heard = self._means.get(kind, (took, 0))
            mean = 0.8 * mean + 0.2 * took if heard else took
            self._means[kind] = (mean, heard + 1)
            if mean < self.short and heard + 1 >= 2 * self.workers:
                self._short_types.add(kind)
            else:
                self._short_types.discard(kind)

    def working(self) -> int:
        """Handlers running now."""
        with self._lock:
            return len(self._started)

    def ahead(self) -> int:
        """How many tasks of a short type may be claimed beyond the workers now (see the
        class)."""
        with self._lock:
            return self._ahead()

    def _ahead(self) -> int:
        if not self.prefetch or not self._short_types:
            return 0
        now = time.monotonic()
        if any(now - began >= self.short for began in self._started.values()):
            return 0
        return int(self.workers * self.prefetch)

    def room(self, tasks: Sequence[Task]) -> int:
        """How many of ``tasks``, taken in order, this node may claim now: any for a free
        worker, and beyond them (:meth:`ahead`) only tasks of a short type; the count stops at
        the first task that may not be claimed."""
        with self._lock:
            idle = self.workers - len(self._running)
            ahead = self._ahead()
            n = 0
            for task in tasks:
                if n >= idle and (n >= idle + ahead or task.type not in self._short_types):
                    break
                n += 1
            return n

    def ending(self, slot: Slot) -> None:
        """``slot``'s handler returned: its worker is free, its end is being written."""
        with self._lock:
            if self._running.pop(slot.task_id, None) is not None:
                self._ending[slot.task_id] = slot

    def discard(self, slot: Slot) -> None:
        with self._lock:
            self._started.pop(slot.task_id, None)
            if self._running.get(slot.task_id) is slot:
                del self._running[slot.task_id]
            if self._ending.get(slot.task_id) is slot:
                del self._ending[slot.task_id]

    def __contains__(self, task_id: str) -> bool:
        with self._lock:
            return task_id in self._running or task_id in self._ending

    def get(self, task_id: str) -> Slot | None:
        with self._lock:
            return self._running.get(task_id) or self._ending.get(task_id)

    def snapshot(self) -> list[Slot]:
        """Every slot, running or ending."""
        with self._lock:
            return [*self._running.values(), *self._ending.values()]

    def free(self) -> int:
        """At most how many tasks this node may claim now: its workers not running a handler,
        and those it may claim ahead (:meth:`ahead`), less those claimed and waiting for a
        worker; which of them it may (:meth:`room`) depends on their types."""
        with self._lock:
            return self.workers + self._ahead() - len(self._running)

    def decline(self, task_id: str, seconds: float) -> None:
        """Leave ``task_id`` to the other nodes for ``seconds``."""
        with self._lock:
            self._declined[task_id] = time.monotonic() + seconds

    def declined(self, task_id: str) -> bool:
        with self._lock:
            return self._declined.get(task_id, 0.0) > time.monotonic()
