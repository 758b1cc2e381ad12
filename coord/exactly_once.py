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
  or a store write keyed by (queue, index) for the heterogeneous case), then the CAS records
  ``written = k + 1``; after the last one, the CAS goes back to HANDLING with ``out_next``
  advanced.

A copy that loses a CAS reloads the state and continues from there; a copy that is killed or
frozen at any point costs nothing, because the others are at the same point and every step is
safe to repeat (the same output at the same index is a no-op). No step waits for a lock or a
session timeout. Outputs must be written only by this handler's copies (their indexes are the
handler's own count).

Failure behaviour: ZooKeeper errors surface from :meth:`step` as
:class:`~coord.errors.ConnectionLost` / :class:`~coord.errors.SessionExpired` (the copy stops
or retries, the others go on); a state that grows past ZooKeeper's node size raises
:class:`HandlerStateTooLarge` (keep the state small; outputs are written and dropped from it).
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
from coord.queue import LockFreeQueue, QueueIndexExpired
from coord.register import VersionedRegister
from coord.session import Session

MAX_STATE_BYTES = 800_000

#: ``handler(state, inputs) -> (state, outputs)``; inputs are ``(queue name, index, value)``
Handler = Callable[[Any, list[tuple[str, int, bytes]]], tuple[Any, list[bytes]]]


#: how often a wait for input looks at its stop event
STOP_CHECK = 0.05
#: a follower steps in when the state stood still with work waiting for PATIENCE_FACTOR times
#: the delay it has seen the copy ahead take (an average weighted STEP_WEIGHT to the newest),
#: PATIENCE_FLOOR seconds at least and ``follower_idle`` at most
PATIENCE_FACTOR = 1.5
PATIENCE_FLOOR = 0.001
STEP_WEIGHT = 0.2
#: a follower that saw the state move waits one learned step (SETTLE_MAX seconds at most)
#: before it looks again: its read then does not compete with the copy ahead's next move
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
    """Where outputs go: ``write(index, value)`` must be idempotent per index."""

    def write(self, index: int, value: bytes) -> None: ...


class QueueOutput:
    """Outputs appended to a :class:`~coord.queue.LockFreeQueue` at the handler's indexes."""

    def __init__(self, queue: LockFreeQueue) -> None:
        self.queue = queue

    def write(self, index: int, value: bytes) -> None:
        self.queue.push_at(index, value)


def _b64(values: Sequence[bytes]) -> list[str]:
    return [base64.b64encode(v).decode() for v in values]


class ExactlyOnceHandler:
    """One copy of the handler ``name`` (see the module); run as many as you like."""

    def __init__(self, session: Session, name: str, inputs: Sequence[LockFreeQueue],
                 output: Output, handler: Handler, initial_state: Any = None,
                 batch: int = 100, copy_id: str | None = None) -> None:
        self.name = name
        #: who this copy is, recorded as ``by`` in every state it writes (who is ahead)
        self.copy_id = copy_id or f"{socket.gethostname()}:{os.getpid()}"
        self.inputs = list(inputs)
        self.output = output
        self.handler = handler
        self.initial_state = initial_state
        self.batch = batch
        self.register = VersionedRegister(session, f"handlers/{name}/state")
        #: transitions this copy won and lost (for tests and operators)
        self.won = 0
        self.lost = 0
        #: the state this copy wrote last, while no CAS of it has failed since: the copy that
        #: is ahead goes on from it without reading it back (a stale one only loses a CAS)
        self._mine: tuple[dict[str, Any], int] | None = None
        #: the state the last step started from (its input positions are what to watch)
        self._last: dict[str, Any] = self._initial()
        self._wake = threading.Event()
        #: how long this follower has seen the copy ahead take to move the state once work
        #: appeared (seconds; learned, starting high so the first waits are long)
        self._step = 1.0
        #: the state moved at the last look: the next look waits one such delay first, so
        #: that followers' reads do not compete with the copy ahead's next transition
        self._settle = False
        #: the state a follower found standing still (read with the watch that would have
        #: told it of a move): its step starts from it without reading it again
        self._stood: tuple[dict[str, Any], int] | None = None

    def _initial(self) -> dict[str, Any]:
        return {"phase": Phase.HANDLING.value, "state": self.initial_state,
                "positions": {q.name: 0 for q in self.inputs}, "out_next": 0,
                "pending": [], "written": 0, "by": None}

    def status(self) -> dict[str, Any]:
        doc, _ = self.register.get()
        return doc if doc is not None else self._initial()

    def _cas(self, version: int, doc: dict[str, Any]) -> bool:
        doc = {**doc, "by": self.copy_id}
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
        self._last = doc
        phase = Phase(doc["phase"])
        if phase is Phase.HANDLING:
            return self._handle(doc, version)
        pending = [base64.b64decode(v) for v in doc["pending"]]
        written = int(doc["written"])
        if written < len(pending):
            self.output.write(int(doc["out_next"]) + written, pending[written])
            self._cas(version, {**doc, "phase": Phase.WRITING.value, "written": written + 1})
            return True
        self._cas(version, {**doc, "phase": Phase.HANDLING.value, "pending": [], "written": 0,
                            "out_next": int(doc["out_next"]) + len(pending)})
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
        state, outputs = self.handler(doc["state"], inputs)
        phase = Phase.PREPARING if outputs else Phase.HANDLING
        self._cas(version, {**doc, "phase": phase.value, "state": state,
                            "positions": positions, "pending": _b64(outputs), "written": 0})
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
        """A follower's watch: True when the state stood still while there was work (an
        input after its positions, or outputs to write) for longer than the copy ahead takes
        to move it: a few times the delay this follower has seen between work appearing and
        the state moving (a watch on the state node tells it), ``follower_idle`` at most."""
        if self._settle:  # it moved last time: let it make its next move before looking
            self._settle = False
            stop.wait(min(self._step, follower_idle, SETTLE_MAX))
        moved = threading.Event()
        doc, version = self.register.get(watch=lambda _event: moved.set())  # one read: both
        self._last = doc if doc is not None else self._initial()
        if Phase(self._last["phase"]) is Phase.HANDLING \
                and not self.await_input(stop, follower_idle):
            return False
        since = time.monotonic()
        if moved.is_set():
            return False  # it moved meanwhile: the copy ahead is at work
        patience = min(follower_idle, max(PATIENCE_FLOOR, PATIENCE_FACTOR * self._step))
        deadline = since + patience
        while not moved.is_set() and not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            moved.wait(min(left, STOP_CHECK))
        if moved.is_set():  # the copy ahead moved it: learn how long that takes
            took = time.monotonic() - since
            self._step = (1 - STEP_WEIGHT) * self._step + STEP_WEIGHT * took
            self._settle = True
            return False
        if stop.is_set():
            return False
        # no word from the watch: it stood still. The step starts from the state as read (a
        # move whose event is still on its way only makes the step's CAS lose)
        self._stood = (self._last, version if doc is not None else -1)
        return True

    def run(self, stop: Stop, idle: float = 0.05, follower_idle: float = 0.1,
            on_turn: Callable[[], None] | None = None) -> None:
        """Step until ``stop`` is set (a ``threading.Event`` or anything with ``is_set()`` and
        ``wait(seconds)``); ``on_turn`` is called after every turn (progress reports).

        * The copy that is ahead (its last CAS won) steps on from the state it wrote; with no
          input it waits on a watch of the next input slot (``idle`` seconds at most).
        * A follower (every copy at start, and a copy that lost a CAS) does not step while the
          state moves: it waits for an input, then watches the state node, and steps only if
          the state stood still for a few times the delay it has seen the copy ahead take to
          move it (``follower_idle`` at most; :meth:`stalled`). After a move it waits one such
          delay (:data:`SETTLE_MAX` at most) before it looks again, so that its reads do not
          compete with the copy ahead's next transition. So the copies do not race on every
          transition, and a dead copy costs those short waits plus one transition, never a
          session timeout.
        * A copy whose CAS lost is a follower from then on: it goes straight back to watching
          (no extra wait: its patience already keeps it from racing the copy that won)."""
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
