"""One received message and its ack state machine.

RECEIVED moves exactly once to ACKED, REJECTED (``basic_nack(requeue=False)``) or REQUEUED; a
second decision raises :class:`DeliveryAlreadySettled`. The decision is made in a worker thread
and carried out on the consumer's connection thread (``add_callback_threadsafe``). A decision on
a delivery whose channel has since been replaced is dropped, never sent with a stale tag: the
broker already requeued that message when the old channel closed.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from messaging.errors import DeliveryAlreadySettled


class DeliveryState(enum.StrEnum):
    RECEIVED = "received"
    ACKED = "acked"
    REJECTED = "rejected"
    REQUEUED = "requeued"


#: carries a decision to the connection thread: (delivery, new state)
Settler = Callable[["Delivery", DeliveryState], None]


@dataclass
class Delivery:
    body: bytes
    delivery_tag: int
    redelivered: bool
    properties: Any  # pika.BasicProperties
    queue: str
    generation: int  # the consumer's channel generation this tag belongs to
    settler: Settler
    state: DeliveryState = DeliveryState.RECEIVED
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def headers(self) -> dict[str, Any]:
        return dict(self.properties.headers or {})

    def ack(self) -> None:
        self._decide(DeliveryState.ACKED)

    def reject(self) -> None:
        """Dead-letter / drop: ``basic_nack(requeue=False)``."""
        self._decide(DeliveryState.REJECTED)

    def requeue(self) -> None:
        self._decide(DeliveryState.REQUEUED)

    def _decide(self, state: DeliveryState) -> None:
        with self._lock:
            if self.state is not DeliveryState.RECEIVED:
                raise DeliveryAlreadySettled(
                    f"delivery {self.delivery_tag} on {self.queue} is already {self.state.value}; "
                    f"cannot also be {state.value}")
            self.state = state
        self.settler(self, state)
