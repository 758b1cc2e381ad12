"""ExactlyOnceHandler: several copies of one stateful handler run at once on the same input
queues, and the outputs are as if one copy had handled every input exactly once.

Every copy runs the same loop over one state register (``handlers/<name>/state``, a
:class:`~coord.register.VersionedRegister`), and every transition is one compare-and-set of it:

* HANDLING: read the next inputs after the recorded positions; run the user's
  ``handler(state, inputs) -> (state, outputs)`` (it may be non-deterministic: only the result
  of the copy whose CAS wins counts); CAS to PREPARING with the new state, the advanced
  positions and the outputs (or straight back to HANDLING when there are none);
* PREPARING / WRITING: the outputs are fixed; each is written at its own index
  (``out_next + k``) through an idempotent write (:meth:`~coord.queue.LockFreeQueue.push_at`,
  or a store write keyed by (queue, index)), then the CAS records ``written = k + 1``; the
  last one's CAS goes straight back to HANDLING with ``out_next`` advanced.

A copy that loses a CAS reloads the state and continues from there; a copy killed or frozen at
any point costs nothing but a follower's wait (:meth:`ExactlyOnceHandler.run`), because every
step is safe to repeat (the same output at the same index is a no-op). No step waits for a lock
or a session timeout. Only this handler's copies may write its outputs (the indexes are its own).

Failure behaviour: ZooKeeper errors surface from :meth:`step` as
:class:`~coord.errors.ConnectionLost` / :class:`~coord.errors.SessionExpired` (the copy stops
or retries, the others go on); a state that grows past ZooKeeper's node size raises
:class:`HandlerStateTooLarge` (keep the state small; outputs are written and dropped from it).
An input the handler refuses with :class:`~coord.stream_input.BadInput` becomes a dead letter
among the outputs (written once, in order, to ``<name>.dead``); anything else it raises stops
the step with :class:`~coord.stream_input.HandlerFailed`, nothing written
(:mod:`coord.stream_input`).

Why one module: the state machine (:meth:`ExactlyOnceHandler.step`) and the policy of when a
copy steps (:meth:`ExactlyOnceHandler.run`, ``stalled``) read and write one state document
(``by``, ``at``, ``next``, ``out_view``) and one copy's fields; split, each would reach into the
other's.
"""

from __future__ import annotations

import base64
import enum
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from coord.errors import CoordError, VersionConflict
from coord.liveness import Liveness
from coord.queue import LockFreeQueue
from coord.queuedata import QueueIndexExpired
from coord.register import VersionedRegister
from coord.session import Session
from coord.stream_input import StreamHandler, dead_letter, dead_queue, run_handler

MAX_STATE_BYTES = 800_000

#: how often a wait for input looks at its stop event
STOP_CHECK = 0.05
#: a follower's patience: PATIENCE_FACTOR times the delay it has seen the copy ahead take
#: (weighted STEP_WEIGHT to the newest), PATIENCE_FLOOR s at least, ``follower_idle`` at most
PATIENCE_FACTOR = 1.5
PATIENCE_FLOOR = 0.001
STEP_WEIGHT = 0.2
#: after a move a follower waits one learned step (SETTLE_MAX s at most) before it looks
SETTLE_MAX = 0.01


class Stop(Protocol):
    """What :meth:`ExactlyOnceHandler.run` stops on: a ``threading.Event`` or a task's token."""

    def is_set(self) -> bool: ...

    def wait(self, seconds: float) -> Any: ...


class Phase(enum.StrEnum):
    HANDLING = "HANDLING"
    PREPARING = "PREPARING"
    WRITING = "WRITING"


class HandlerStateTooLarge(CoordError):
    """The handler's state and pending outputs no longer fit in one ZooKeeper node."""


class Output(Protocol):
    """Where outputs go: ``write(index, value)`` must be idempotent per index. An output may
    also have ``view()`` (a small JSON value: where its writes stand, recorded in every state a
    copy writes) and ``adopt(view)`` (called with it by a copy that steps in), as
    :class:`QueueOutput` has."""

    def write(self, index: int, value: bytes) -> None: ...


class QueueOutput:
    """Outputs appended to a :class:`~coord.queue.LockFreeQueue` at the handler's indexes."""

    def __init__(self, queue: LockFreeQueue) -> None:
        self.queue = queue

    def write(self, index: int, value: bytes) -> None:
        self.queue.push_at(index, value)

    def view(self) -> list[int]:
        """Where this copy last saw the queue's end hint: recorded in every state it writes,
        so that a copy stepping in writes its first output in one round trip too."""
        return list(self.queue.end_view)

    def adopt(self, view: Any) -> None:
        if view:
            self.queue.see_end(int(view[0]), int(view[1]))


class ExactlyOnceHandler:
    """One copy of the handler ``name`` (see the module); run as many as you like."""

    def __init__(self, session: Session, name: str, inputs: Sequence[LockFreeQueue],
                 output: Output, handler: StreamHandler, initial_state: Any = None,
                 batch: int = 100, copy_id: str | None = None,
                 liveness: str | None = None) -> None:
        self.name = name
        #: who this copy is, recorded as ``by`` in every state it writes (who is ahead)
        self.copy_id = copy_id or f"{socket.gethostname()}:{os.getpid()}"
        self.inputs = list(inputs)
        self.output = output
        self.handler = handler
        self.initial_state = initial_state
        self.batch = batch
        self.register = VersionedRegister(session, f"handlers/{name}/state")
        self.dead = LockFreeQueue(session, dead_queue(name))  # bad inputs' records
        #: transitions this copy won and lost (for tests and operators)
        self.won = 0
        self.lost = 0
        #: a follower's steps in, by what told it to: the copy ahead gone, or its patience
        self.stepped_in = {"gone": 0, "patience": 0}
        #: the state this copy wrote last, while no CAS of it has failed since (ahead)
        self._mine: tuple[dict[str, Any], int] | None = None
        #: the state the last step started from (its input positions are what to watch)
        self._last: dict[str, Any] = self._initial()
        self._wake = threading.Event()
        #: the delay this follower has seen the copy ahead take to move the state (learned)
        self._step = 1.0
        #: the state moved at the last look: the next look waits one such delay first
        self._settle = False
        #: the state a follower found standing still: its step starts from it
        self._stood: tuple[dict[str, Any], int] | None = None
        self.liveness = liveness  # the host of this copy's beacon (None: none; see run())
        self._live: Liveness | None = None
        self._poke = threading.Event()  # the state's watch or the liveness watch: look again

    def _initial(self) -> dict[str, Any]:
        return {"phase": Phase.HANDLING.value, "state": self.initial_state,
                "positions": {q.name: 0 for q in self.inputs}, "out_next": 0,
                "pending": [], "written": 0, "dead_next": 0, "by": None}

    def status(self) -> dict[str, Any]:
        doc, _ = self.register.get()
        return doc if doc is not None else self._initial()

    def _cas(self, version: int, doc: dict[str, Any]) -> bool:
        view = getattr(self.output, "view", None)
        doc = {**doc, "by": self.copy_id, "out_view": view() if view else None,
               **(self._live.stamp() if self._live else {"at": None, "next": None})}
        if len(json.dumps(doc)) > MAX_STATE_BYTES:
            raise HandlerStateTooLarge(f"handler {self.name}: state and pending outputs over "
                                       f"{MAX_STATE_BYTES} bytes")
        try:
            new_version = self.register.compare_and_set(version, doc)
        except VersionConflict:
            self.lost += 1
            self._mine = None
            return False
        self.won += 1
        if self._mine is None and self._live is not None:
            self._live.lead()
        self._mine = (doc, new_version)
        return True

    def step(self) -> bool:
        """One transition; False when there was nothing to do (no new input)."""
        stood, self._stood = self._stood, None
        if self._mine is not None:
            doc, version = self._mine
        elif stood is not None:
            doc, version = stood
        else:
            doc, version = self.register.get()
            if doc is None:
                doc, version = self._initial(), -1
        adopt = getattr(self.output, "adopt", None)
        if self._mine is None and adopt is not None:
            adopt(doc.get("out_view"))  # stepping in: the output as its last writer saw it
        self._last = doc
        phase = Phase(doc["phase"])
        if phase is Phase.HANDLING:
            return self._handle(doc, version)
        pending, written = doc["pending"], int(doc["written"])
        outs = sum(isinstance(item, str) for item in pending[:written])  # those before it
        out_next, dead_next = int(doc["out_next"]), int(doc.get("dead_next", 0))
        if written < len(pending):
            item = pending[written]
            if isinstance(item, str):
                self.output.write(out_next + outs, base64.b64decode(item))
            else:  # a dead letter (coord.stream_input)
                self.dead.push_at(dead_next + written - outs, dead_letter(self.name, item))
            if written + 1 < len(pending):
                self._cas(version, {**doc, "phase": Phase.WRITING.value, "written": written + 1})
                return True
        outs = sum(isinstance(item, str) for item in pending)
        self._cas(version, {**doc, "phase": Phase.HANDLING.value, "pending": [], "written": 0,
                            "out_next": out_next + outs,
                            "dead_next": dead_next + len(pending) - outs})
        return True

    def _handle(self, doc: dict[str, Any], version: int) -> bool:
        positions = dict(doc["positions"])
        inputs: list[tuple[str, int, bytes]] = []
        for queue in self.inputs:
            start = int(positions.get(queue.name, 0))
            try:
                read = list(queue.read(start, self.batch))
            except QueueIndexExpired:
                if self._mine is None:
                    raise
                self._mine = None  # a stale state of ours, far behind: read the real one
                return True
            inputs.extend((queue.name, index, value) for index, value in read)
            positions[queue.name] = start + len(read)
        if not inputs:
            return False
        state, pending = run_handler(self.name, self.handler, doc["state"], inputs)
        phase = Phase.PREPARING if pending else Phase.HANDLING
        self._cas(version, {**doc, "phase": phase.value, "state": state,
                            "positions": positions, "pending": pending, "written": 0})
        return True

    @property
    def ahead(self) -> bool:
        """Whether this copy wrote the state last and has lost no CAS since."""
        return self._mine is not None

    def _on_input(self, _event: object) -> None:
        self._wake.set()

    def await_input(self, stop: Stop, timeout: float) -> bool:
        """Wait until an input arrives after the positions of the last step's state (a
        ZooKeeper watch on each input's next slot), ``timeout`` at most, or ``stop``; whether
        one did."""
        self._wake.clear()
        positions = self._last["positions"]
        for queue in self.inputs:
            if queue.watch(int(positions.get(queue.name, 0)), self._on_input):
                return True
        deadline = time.monotonic() + timeout
        while not stop.is_set() and not self._wake.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._wake.wait(min(left, STOP_CHECK))
        return self._wake.is_set()

    def stalled(self, stop: Stop, follower_idle: float) -> bool:
        """A follower's watch: True when the state stood still with work waiting (an input
        after its positions, or outputs to write) past the follower's patience (the state
        node's watch tells of moves), or at once when the copy ahead is known gone."""
        if self._settle:  # it moved last time: let it make its next move before looking
            self._settle = False
            if not self._ahead_gone():
                self._poke.clear()
                self._poke.wait(min(self._step, follower_idle, SETTLE_MAX))
        moved = threading.Event()

        def on_move(_event: object) -> None:
            moved.set()
            self._poke.set()

        self._poke.clear()
        doc, version = self.register.get(watch=on_move)  # one read: both
        self._last = doc if doc is not None else self._initial()
        if self._live is not None:
            self._live.follow(self._last)
        if Phase(self._last["phase"]) is Phase.HANDLING \
                and not self.await_input(stop, follower_idle):
            return False
        since = time.monotonic()
        if moved.is_set():
            return False  # it moved meanwhile: the copy ahead is at work
        patience = min(follower_idle, max(PATIENCE_FLOOR, PATIENCE_FACTOR * self._step))
        deadline = since + patience
        while not moved.is_set() and not stop.is_set() and not self._ahead_gone():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if self._poke.wait(min(left, STOP_CHECK)):
                self._poke.clear()  # what it was for is checked above
        if moved.is_set():  # it moved: learn how long that takes, unless it died since (then
            if not self._ahead_gone():  # the next look, fresh, steps at once: not a lost CAS)
                self._step += STEP_WEIGHT * (time.monotonic() - since - self._step)
                self._settle = True
            return False
        if stop.is_set():
            return False
        # it stood still, or the copy ahead is gone: the step starts from the state as read
        # (a move whose event is still on its way only makes the step's CAS lose)
        self.stepped_in["gone" if self._ahead_gone() else "patience"] += 1
        self._stood = (self._last, version if doc is not None else -1)
        return True

    def _ahead_gone(self) -> bool:
        return self._live is not None and self._live.ahead_gone(self._last)

    def run(self, stop: Stop, idle: float = 0.05, follower_idle: float = 0.1,
            on_turn: Callable[[], None] | None = None) -> None:
        """Step until ``stop`` is set (a ``threading.Event`` or anything with ``is_set()`` and
        ``wait(seconds)``); ``on_turn`` is called after every turn (progress reports).

        * The copy that is ahead (its last CAS won) steps on from the state it wrote; with no
          input it waits on a watch of the next input slot (``idle`` seconds at most).
        * A follower (every copy at start, and one whose CAS lost) steps only when the state
          stood still with work waiting past its patience (:meth:`stalled`), and after a move
          waits one learned step (:data:`SETTLE_MAX` at most) before it looks again.
        * With ``liveness`` (a host) every state this copy writes names its beacon and the
          follower to step in first, and a follower keeps a connection to the copy ahead's
          beacon (:mod:`coord.liveness`): when that process ends (kill -9 included) the named
          follower steps in at once. A frozen or cut-off copy, or the others, wait their
          patience: a few times one transition, never a session timeout."""
        if self.liveness is not None:
            self._live = Liveness(self.liveness, self.copy_id, self._poke.set)
        try:
            self._loop(stop, idle, follower_idle, on_turn)
        finally:
            live, self._live = self._live, None
            if live is not None:
                live.close()

    def _loop(self, stop: Stop, idle: float, follower_idle: float,
              on_turn: Callable[[], None] | None) -> None:
        while not stop.is_set():
            if self._mine is None and self.won + self.lost > 0 \
                    and not self.stalled(stop, follower_idle):
                if on_turn is not None:
                    on_turn()
                continue
            if not self.step():
                self.await_input(stop, idle)
            if on_turn is not None:
                on_turn()
