"""What a concurrent exactly-once handler's inputs can do wrong, and what the copies do then.

* A handler raises :class:`BadInput` for an input it cannot take (malformed: not the format it
  reads, a value out of range). The batch is run again input by input, and each input that
  raises it becomes a **dead letter**: a record of its queue, index and the reason, written
  exactly once, in order, to the handler's dead-letter queue ``<handler>.dead`` (a
  :class:`~coord.queue.LockFreeQueue`) through the same idempotent, indexed write as the
  outputs. The stream goes on without it; the input itself stays in its queue (until its
  retention age) for whoever mends and pushes it again. A handler that raises it must leave the
  state it was given unchanged (a pure handler does).
* Anything else a handler raises is a failure of the handler, not of the input: the step raises
  :class:`HandlerFailed`, naming the inputs, and writes nothing (the state stays where it was).
  The copy stops (the runner's copy task fails and is retried with its policy); the stream
  waits, visibly, until the handler is fixed.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

from coord.errors import CoordError

#: a dead letter's reason is cut to this many characters (it rides in the handler's state)
MAX_REASON = 1000

Inputs = list[tuple[str, int, bytes]]
#: ``handler(state, inputs) -> (state, outputs)``; inputs are ``(queue name, index, value)``
StreamHandler = Callable[[Any, Inputs], tuple[Any, list[bytes]]]


class BadInput(CoordError, ValueError):
    """Raised by a handler for an input it cannot take: it goes to the dead-letter queue."""


class HandlerFailed(CoordError):
    """The handler raised something other than :class:`BadInput`: the step wrote nothing."""


def dead_queue(handler: str) -> str:
    """The name of handler ``handler``'s dead-letter queue."""
    return f"{handler}.dead"


def _span(inputs: Inputs) -> str:
    return ", ".join(f"{q}@{i}" for q, i, _ in inputs)


def run_handler(name: str, handler: StreamHandler, state: Any, inputs: Inputs
                ) -> tuple[Any, list[Any]]:
    """``handler`` over ``inputs``: the new state and the pending items, each an output
    (base64 text) or a dead letter (``{"dead": {"queue", "index", "reason"}}``), in input
    order. Raises :class:`HandlerFailed` for anything but :class:`BadInput`."""
    def call(given: Any, batch: Inputs) -> tuple[Any, list[Any]]:
        try:
            new, outputs = handler(given, batch)
        except BadInput:
            raise
        except Exception as exc:
            raise HandlerFailed(f"handler {name} failed on inputs {_span(batch)}: "
                                f"{exc!r}") from exc
        return new, [base64.b64encode(v).decode() for v in outputs]

    try:
        return call(state, inputs)
    except BadInput:
        pass
    items: list[Any] = []
    for one in inputs:  # which of them: one at a time, from the state each leaves
        try:
            state, outputs = call(state, [one])
        except BadInput as exc:
            items.append({"dead": {"queue": one[0], "index": one[1],
                                   "reason": (str(exc) or type(exc).__name__)[:MAX_REASON]}})
            continue
        items.extend(outputs)
    return state, items


def dead_letter(name: str, item: dict[str, Any]) -> bytes:
    """What a dead letter's element holds: the input's place, the reason and the handler."""
    return json.dumps({**item["dead"], "handler": name}, sort_keys=True).encode()
