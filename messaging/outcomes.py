"""What happens to a message, as a type, and the headers a dead-lettered copy carries.

:class:`DeliveryOutcome` is reported to ``on_outcome`` hooks after each decision (handled,
duplicate, retried, dead-lettered, requeued; see :mod:`messaging.dispatch` for when each
happens).
"""

from __future__ import annotations

import enum
import traceback
from collections.abc import Callable
from typing import Any

from messaging.delivery import Delivery
from messaging.envelope import Envelope

RETRIES_HEADER = "x-latchwork-retries"
REASON_HEADER = "x-latchwork-reason"
DETAIL_HEADER = "x-latchwork-detail"


class DeliveryOutcome(enum.StrEnum):
    HANDLED = "handled"
    DUPLICATE = "duplicate"
    RETRIED = "retried"
    DEAD_LETTERED = "dead-lettered"
    REQUEUED = "requeued"


#: called with (delivery, envelope or None, outcome, detail) after each decision
OutcomeHook = Callable[[Delivery, Envelope | None, DeliveryOutcome, str], None]
#: called with (delivery, envelope) before a handler runs
ReceiveHook = Callable[[Delivery, Envelope], None]



def describe(exc: BaseException) -> str:
    """An exception with its traceback, for a dead-letter detail header."""
    return "".join(traceback.format_exception(exc)).strip()


def reply_too_large(command: str, size: int, limit: int) -> dict[str, Any]:
    """The answer sent (or read) instead of one over the message size limit (a node's or a
    client's). Not a refusal: what the request did stands, only its answer cannot travel."""
    return {"ok": False, "error": {
        "kind": "ReplyTooLarge", "code": "reply-too-large", "refused": False,
        "detail": f"the answer to {command} is {size} bytes, over the message limit of "
                  f"{limit}: what the request did stands; ask for less at once (a page)"}}
