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
import random
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from coord.errors import CoordError, VersionConflict
from coord.queue import LockFreeQueue
from coord.register import VersionedRegister
from coord.session import Session

MAX_STATE_BYTES = 800_000

#: ``handler(state, inputs) -> (state, outputs)``; inputs are ``(queue name, index, value)``
Handler = Callable[[Any, list[tuple[str, int, bytes]]], tuple[Any, list[bytes]]]


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
                 batch: int = 100) -> None:
        self.name = name
        self.inputs = list(inputs)
        self.output = output
        self.handler = handler
        self.initial_state = initial_state
        self.batch = batch
        self.register = VersionedRegister(session, f"handlers/{name}/state")
        #: transitions this copy won and lost (for tests and operators)
        self.won = 0
        self.lost = 0

    def _initial(self) -> dict[str, Any]:
        return {"phase": Phase.HANDLING.value, "state": self.initial_state,
                "positions": {q.name: 0 for q in self.inputs}, "out_next": 0,
                "pending": [], "written": 0}

    def status(self) -> dict[str, Any]:
        doc, _ = self.register.get()
        return doc if doc is not None else self._initial()

    def _cas(self, version: int, doc: dict[str, Any]) -> bool:
        if len(json.dumps(doc)) > MAX_STATE_BYTES:
            raise HandlerStateTooLarge(f"handler {self.name}: state and pending outputs over "
                                       f"{MAX_STATE_BYTES} bytes")
        try:
            self.register.compare_and_set(version, doc)
        except VersionConflict:
            self.lost += 1
            return False
        self.won += 1
        return True

    def step(self) -> bool:
        """One transition; False when there was nothing to do (no new input)."""
        doc, version = self.register.get()
        if doc is None:
            doc, version = self._initial(), -1
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
            read = list(queue.read(start, self.batch))
            inputs.extend((queue.name, index, value) for index, value in read)
            positions[queue.name] = start + len(read)
        if not inputs:
            return False
        state, outputs = self.handler(doc["state"], inputs)
        phase = Phase.PREPARING if outputs else Phase.HANDLING
        self._cas(version, {**doc, "phase": phase.value, "state": state,
                            "positions": positions, "pending": _b64(outputs), "written": 0})
        return True

    def run(self, stop: threading.Event, idle: float = 0.05, yield_after_loss: float = 0.004
            ) -> None:
        """Step until ``stop`` is set, waiting ``idle`` seconds when there is no input. After a
        lost CAS a copy waits up to ``yield_after_loss`` seconds (random) before its next read:
        another copy is doing the work, and copies that all retry at once only slow each other
        down; a dead winner costs at most that much."""
        while not stop.is_set():
            lost = self.lost
            if not self.step():
                stop.wait(idle)
            elif self.lost > lost and yield_after_loss > 0:
                stop.wait(random.uniform(0, yield_after_loss))
