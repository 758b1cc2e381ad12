"""The example stream ``example.moving_average``, loaded only when asked for, like any stream of
yours: ``latchwork node start --tasks runner.tasks.features.example_stream``.

Readings ``{"t": seconds, "v": number}`` are pushed to the ``readings`` queue; each becomes one
``{"t", "avg", "size"}`` in the ``averages`` queue: the mean over the last 60 s of event time.
When the window grows past 10 readings the output also says ``"crossed": true`` (once per
crossing), and each crossing is recorded in the graph as an ``event`` vertex keyed by the
output's index (:func:`record_crossing`), so a repeated write counts once: the example of an
output that goes to two stores, exactly once.

Failure behaviour: a reading that is not JSON, lacks ``t`` or ``v``, or holds a non-finite
number is :class:`~coord.BadInput`: a dead letter in ``example.moving_average.dead``, the stream
goes on. The graph unreachable past its retries fails the step (the copy task retries it).
"""

from __future__ import annotations

import json
import math
from typing import Any

from coord import BadInput, LockFreeQueue, QueueOutput, Session
from coord.stream_input import StreamHandler
from runner.store import Store
from runner.tasks.context import TaskContext
from runner.tasks.features.streams import StreamRegistry, stream

EXAMPLE = "example.moving_average"
INITIAL = {"window": [], "over": False}


def _reading(queue: str, index: int, raw: bytes) -> tuple[float, float]:
    """A reading's (t, v); BadInput (a dead letter, the stream goes on) for anything else."""
    try:
        reading = json.loads(raw)
        t, v = float(reading["t"]), float(reading["v"])
    except (ValueError, TypeError, KeyError) as exc:
        raise BadInput(f"{queue}@{index}: not a reading {{\"t\": seconds, \"v\": number}}: "
                       f"{raw[:80]!r} ({exc!r})") from None
    if not (math.isfinite(t) and math.isfinite(v)):
        raise BadInput(f"{queue}@{index}: t and v must be finite numbers: {raw[:80]!r}")
    return t, v


def moving_average(window_s: float = 60.0, bound: int = 10) -> StreamHandler:
    """Readings in, one average out per reading, over the last ``window_s`` seconds of event
    time; ``"crossed": true`` when the window first grows past ``bound`` readings."""
    def handle(state: Any, inputs: list[tuple[str, int, bytes]]) -> tuple[Any, list[bytes]]:
        window: list[list[float]] = list((state or {}).get("window", []))
        over = bool((state or {}).get("over", False))
        outputs = []
        for queue, index, raw in inputs:
            t, v = _reading(queue, index, raw)
            window = [w for w in [*window, [t, v]] if w[0] > t - window_s]
            out: dict[str, Any] = {"t": t, "avg": round(sum(w[1] for w in window) / len(window),
                                                        6), "size": len(window)}
            if len(window) > bound and not over:
                out["crossed"] = True
            over = len(window) > bound
            outputs.append(json.dumps(out).encode())
        return {"window": window, "over": over}, outputs
    return handle


def record_crossing(store: Store, key: str) -> bool:
    """Record the crossing ``key`` once (an idempotent write keyed by it: an output written
    again changes nothing); False when it was there already."""
    def write(g: Any) -> bool:
        if g.V().has("event_key", key).id_().to_list():
            return False
        g.add_v("event").property("event_key", key).property("event_kind", EXAMPLE).iterate()
        return True
    written: bool = store.graph.write(write)
    return written


def crossings(store: Store) -> int:
    """How many crossings the example recorded."""
    return int(store.graph.read(lambda g: g.V().has("event_kind", EXAMPLE).count().next()))


class AveragesOutput(QueueOutput):
    """Every average to the ``averages`` queue at its index, and each crossing recorded in the
    graph, keyed by (queue, index) so a repeated write counts once."""

    def __init__(self, session: Session, store: Store) -> None:
        super().__init__(LockFreeQueue(session, "averages"))
        self.store = store

    def write(self, index: int, value: bytes) -> None:
        super().write(index, value)
        if json.loads(value).get("crossed"):
            record_crossing(self.store, f"averages:{index}")


def _averages(ctx: TaskContext) -> AveragesOutput:
    return AveragesOutput(ctx.services.get(Session), ctx.store)


example = stream(EXAMPLE, inputs=["readings"], writer=_averages, retained=["averages"],
                 initial_state=INITIAL,
                 description="moving average of `readings` over 60 s; crossings of 10 counted "
                             "in the graph")(moving_average())


def example_streams() -> StreamRegistry:
    """A stream registry holding the example alone (what a node that loaded this module has)."""
    streams = StreamRegistry()
    streams.define(example.__dict__["latchwork_stream"])
    return streams
