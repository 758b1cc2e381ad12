"""Streams as long-running tasks: N copies of a concurrent exactly-once handler on N nodes.

A stream (:class:`StreamDefinition`) names its input queues, where its outputs go and its
``handler(state, inputs) -> (state, outputs)`` (:mod:`coord.exactly_once`). Starting it with
``redundancy=N`` creates N ordinary tasks of type ``stream.copy`` (uniqueness keys
``stream:<name>:copy:<k>``, so a second start creates nothing). Each copy task runs one
:class:`~coord.exactly_once.ExactlyOnceHandler` until it is cancelled; the copies work on the
same state at once (the one place where several owners of the same work are wanted).

Distinct nodes: a copy registers ``streams/<name>/copies/<member>`` (ephemeral) before it runs;
a node that already runs a copy of the stream declines the task
(:class:`~runner.tasks.context.TaskDeclined`), so the task loop leaves it to the other nodes for
a while. N copies keep running as nodes die and join: a dead node's copy task is freed by the
master's reaper like any task and taken by a node without a copy; a joining node takes a copy
task that all others declined.

Progress: every copy reports the input positions and the output end (``ctx.progress``), shown
by ``task list``, ``task show`` and ``latchwork top``.

Failure behaviour: kill -9 or SIGSTOP of a copy costs nothing (the others go on, see
:mod:`coord.exactly_once`); the copy's own task is freed after its session expires. A session
loss cancels the copy's task like any other. A malformed input is a dead letter
(:mod:`coord.stream_input`); a copy that fails otherwise (its handler raised: ``HandlerFailed``,
or ZooKeeper or the graph out of reach past the calls' own retries) runs again after a backoff
(:data:`COPY_RETRY`), its error on the task meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from coord import (
    CoordError,
    ExactlyOnceHandler,
    LockFreeQueue,
    QueueOutput,
    Session,
    VersionedRegister,
    markers,
)
from coord.exactly_once import Output
from coord.stream_input import StreamHandler, dead_queue
from runner.errors import UnknownStream
from runner.requests import TaskSubmit
from runner.tasks.context import TaskContext, TaskDeclined
from runner.tasks.registry import TaskRegistry
from runner.tasks.retry import RetryPolicy

log = logging.getLogger("latchwork.streams")
COPY_TASK = "stream.copy"
#: a copy ahead waits on a watch of its next input up to this long (then reads again)
IDLE = 0.5
#: a follower steps in when the state has not moved this long with work waiting
FOLLOWER_IDLE = 0.2
#: a copy reports its positions as task progress this often
REPORT_EVERY = 1.0


@dataclass(frozen=True)
class StreamLiveness:
    """The address a node's stream copies publish their liveness beacon on (the
    ``stream_liveness_host`` setting; None: the loopback default)."""

    host: str | None = None


@dataclass(frozen=True)
class StreamDefinition:
    name: str
    inputs: tuple[str, ...]
    handler: StreamHandler
    output: str | None = None  # an output queue; or ``writer`` for another store
    writer: Callable[[TaskContext], Output] | None = None
    initial_state: Any = None
    batch: int = 100
    description: str = ""
    #: queues the ``writer`` fills, kept for the retention age like ``output``
    retained: tuple[str, ...] = ()


def stream(name: str, *, inputs: list[str] | tuple[str, ...], output: str | None = None,
           writer: Callable[[TaskContext], Output] | None = None,
           retained: list[str] | tuple[str, ...] = (), initial_state: Any = None,
           batch: int = 100, description: str = "") -> Callable[[StreamHandler], StreamHandler]:
    """Declare ``handler(state, inputs) -> (state, outputs)`` as the stream ``name``, from the
    queues ``inputs`` to the queue ``output`` (or through ``writer(ctx)``, an idempotent
    :class:`~coord.exactly_once.Output` of your own, which fills the queues ``retained``);
    loaded like ``@task`` types (``--tasks``, the ``tasks`` setting, the ``latchwork.tasks``
    entry points) and started with ``latchwork stream start NAME --redundancy N``."""
    if (output is None) == (writer is None):
        raise ValueError(f"stream {name}: give an output queue or a writer, one of them")

    def mark(handler: StreamHandler) -> StreamHandler:
        handler.__dict__["latchwork_stream"] = StreamDefinition(
            name, tuple(inputs), handler, output=output, writer=writer,
            initial_state=initial_state, batch=batch, retained=tuple(retained),
            description=description or (handler.__doc__ or "").strip())
        return handler
    return mark


class CopyPayload(BaseModel):
    stream: str = Field(min_length=1)
    copy_no: int = Field(ge=0)


class StreamRegistry:
    """The streams a node can run (those its ``--tasks`` modules declare)."""

    def __init__(self) -> None:
        self._streams: dict[str, StreamDefinition] = {}

    def define(self, definition: StreamDefinition) -> None:
        if definition.name in self._streams:
            raise ValueError(f"stream {definition.name!r} is already defined")
        if (definition.output is None) == (definition.writer is None):
            raise ValueError(f"stream {definition.name!r} needs an output queue or a writer")
        self._streams[definition.name] = definition

    def get(self, name: str) -> StreamDefinition:
        try:
            return self._streams[name]
        except KeyError:
            raise UnknownStream(f"unknown stream {name!r} (known: "
                                f"{', '.join(sorted(self._streams)) or 'none'})") from None

    def names(self) -> list[str]:
        return sorted(self._streams)


class StreamRetention:
    """The master's pass over the streams' queues, every ``interval`` seconds: elements older
    than ``retention`` seconds are pruned from the inputs (never one that a stream reading the
    queue has not consumed yet, however old: a stopped stream keeps its backlog), the outputs
    and the dead letters. At most ``batch`` elements per queue a pass, so that a long history
    never holds up the master's other duties."""

    def __init__(self, session: Session, streams: StreamRegistry, member_id: str,
                 retention: float, interval: float = 600.0, batch: int = 1000) -> None:
        self.session, self.streams, self.member_id = session, streams, member_id
        self.retention, self.interval, self.batch = retention, interval, batch
        self._next = 0.0

    def tick(self) -> int:
        if time.monotonic() < self._next:
            return 0
        self._next = time.monotonic() + self.interval
        below: dict[str, int] = {}  # a queue some stream reads: its lowest unread index
        kept: set[str] = set()
        for name in self.streams.names():
            definition = self.streams.get(name)
            state, _ = VersionedRegister(self.session, f"handlers/{name}/state").get()
            positions = (state or {}).get("positions", {})
            for queue in definition.inputs:
                below[queue] = min(below.get(queue, 1 << 62), int(positions.get(queue, 0)))
            kept.update(q for q in (definition.output, *definition.retained) if q)
            kept.add(dead_queue(name))
        removed = 0
        for queue in sorted(kept | set(below)):
            gone = LockFreeQueue(self.session, queue).prune(self.retention, below=below.get(queue),
                                                            limit=self.batch)
            if gone:
                log.info("member %s (master): pruned %d elements of stream queue %s older than "
                         "%gs", self.member_id, gone, queue, self.retention)
            removed += gone
        return removed


def copies(session: Session, stream: str) -> dict[str, int]:
    """The members running a copy of ``stream``, and which copy each runs."""
    return {member: int(value["copy"])
            for member, value in markers.read(session, f"streams/{stream}/copies").items()}


def run_copy(ctx: TaskContext, payload: CopyPayload) -> None:
    """The ``stream.copy`` task: one copy of the stream's handler until cancelled."""
    streams = ctx.services.get(StreamRegistry)
    session = ctx.services.get(Session)
    definition = streams.get(payload.stream)
    copies_of = f"streams/{payload.stream}/copies"
    if not markers.place(session, copies_of, ctx.member_id,
                         {"copy": payload.copy_no, "task": ctx.task.id}):
        raise TaskDeclined(f"member {ctx.member_id} already runs a copy of stream "
                           f"{payload.stream}")
    try:
        inputs = [LockFreeQueue(session, name) for name in definition.inputs]
        output: Output
        if definition.writer is not None:
            output = definition.writer(ctx)
        else:
            assert definition.output is not None
            output = QueueOutput(LockFreeQueue(session, definition.output))
        handler = ExactlyOnceHandler(session, definition.name, inputs, output,
                                     definition.handler, definition.initial_state,
                                     definition.batch, copy_id=ctx.member_id,
                                     liveness=(ctx.services.find(StreamLiveness)
                                               or StreamLiveness()).host)
        reported = 0.0

        def report() -> None:
            nonlocal reported
            if time.monotonic() - reported < REPORT_EVERY:
                return
            status = handler.status()
            positions = ", ".join(f"{q}@{i}" for q, i in status["positions"].items())
            done = sum(int(i) for i in status["positions"].values())
            role = "ahead" if status.get("by") == ctx.member_id else "following"
            ctx.progress(done, None, f"copy {payload.copy_no}: in {positions}, "
                                     f"out {status['out_next']}, {status['phase']}, {role}")
            reported = time.monotonic()

        handler.run(ctx.cancel, idle=IDLE, follower_idle=FOLLOWER_IDLE, on_turn=report)
        ctx.cancel.raise_if_cancelled()
    finally:
        try:
            markers.remove(session, copies_of, ctx.member_id)
        except CoordError:  # unreachable: it is ephemeral, it goes with the session anyway
            pass


#: a copy that fails (its handler raised, ZooKeeper or the graph out of reach past the calls'
#: own retries) runs again after a backoff, 1 s doubling to a minute, like a stream processor's
#: restart strategy: a stream is meant to run on, and the failure shows on the task meanwhile
COPY_RETRY = RetryPolicy(max_attempts=100_000, backoff=1.0, multiplier=2.0, max_backoff=60.0)


def register_stream_tasks(registry: TaskRegistry) -> None:
    registry.register(COPY_TASK, run_copy, CopyPayload, retry=COPY_RETRY,
                      description="one copy of a concurrent exactly-once stream handler "
                                  "(started by `latchwork stream start`)")


def start(submit: Callable[[TaskSubmit], Any], streams: StreamRegistry, name: str,
          redundancy: int) -> list[str]:
    """Create the copy tasks of stream ``name`` (idempotent); their ids."""
    streams.get(name)
    return [submit(TaskSubmit(type=COPY_TASK, payload={"stream": name, "copy_no": k},
                              unique_key=f"stream:{name}:copy:{k}")).id
            for k in range(redundancy)]
