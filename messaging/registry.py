"""Handler registries: per paradigm, a command maps to one typed handler.

A handler is ``handler(ctx, payload)``; when registered with a pydantic ``payload_model`` the
payload is validated into that model first (a failure is :class:`InvalidEnvelope`, poison). An
unregistered command raises :class:`UnknownCommand` (poison: dead-lettered with its reason).
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from messaging.envelope import COMMAND_PATTERN, Envelope, Paradigm, summary, validate_payload
from messaging.errors import HandlerCancelled, InvalidEnvelope, UnknownCommand

if TYPE_CHECKING:
    from messaging.processed import ProcessedLog
    from messaging.publisher import Publisher


@dataclass
class HandlerContext:
    """What a handler gets besides its payload."""

    envelope: Envelope
    redelivered: bool
    retries: int
    member_id: str
    publisher: Publisher
    #: set when the handler should stop early (node shutdown, MASTER leadership lost)
    cancelled: threading.Event = field(default_factory=threading.Event)
    processed: ProcessedLog | None = None  # MASTER only
    #: MASTER only: the master's election node when the handler started (see transaction())
    fence: str | None = None
    #: whether what the handler started under still stands (MASTER: the same leadership, the
    #: session connected); read by :meth:`check`
    valid: Callable[[], bool] | None = None
    #: what the application gives its handlers (the runner: its ``Services``)
    services: Any = None

    @property
    def message_id(self) -> uuid.UUID:
        return self.envelope.id

    def check(self) -> None:
        """Call right before an effect: raises :class:`HandlerCancelled` (and sets
        :attr:`cancelled`) when the node is stopping or, for a MASTER handler, this node is no
        longer the master the handler started under or its session is not connected. The
        message then goes back to the queue for the next master. No server call: it reads the
        latch's and the session's state."""
        if not self.cancelled.is_set() and (self.valid is None or self.valid()):
            return
        self.cancelled.set()
        what = "is no longer the master it started under" if self.fence is not None \
            else "is stopping"
        raise HandlerCancelled(f"member {self.member_id} {what}: {self.envelope.command} "
                               f"{self.message_id} goes back to the queue")

    def transaction(self) -> Any:
        """MASTER only: a ZooKeeper transaction that records this message as processed and
        checks that the leadership the handler started under still stands (its election node
        is ephemeral: gone with the session that won it). Add the effect's operations and
        commit: the effect happens once, and never from a master that was paused or cut off
        past its session and resumed on a new one (the commit's results then hold a
        ``NoNodeError`` for the fence, or a ``NodeExistsError`` for the record when another
        run recorded it first: nothing of it was applied)."""
        if self.processed is None:
            raise RuntimeError("ctx.transaction() is for MASTER handlers")
        return self.processed.transaction(self.message_id, self.member_id, fence=self.fence)


MessageHandler = Callable[[HandlerContext, Any], Any]


@dataclass(frozen=True)
class Route:
    command: str
    handler: MessageHandler
    payload_model: type[BaseModel] | None

    def parse(self, payload: dict[str, Any]) -> Any:
        if self.payload_model is None:
            return payload
        try:
            return validate_payload(self.payload_model, payload)
        except ValidationError as exc:
            raise InvalidEnvelope(f"payload of {self.command}: {summary(exc)}") from exc


class HandlerRegistry:
    def __init__(self, paradigm: Paradigm) -> None:
        self.paradigm = paradigm
        self._routes: dict[str, Route] = {}

    def register(self, command: str, handler: MessageHandler,
                 payload_model: type[BaseModel] | None = None) -> None:
        if not re.match(COMMAND_PATTERN, command):
            raise ValueError(f"invalid command name {command!r}")
        if command in self._routes:
            raise ValueError(f"{self.paradigm} command {command!r} is already registered")
        self._routes[command] = Route(command, handler, payload_model)

    def handler(self, command: str, payload_model: type[BaseModel] | None = None
                ) -> Callable[[MessageHandler], MessageHandler]:
        """Decorator form of :meth:`register`."""
        def wrap(fn: MessageHandler) -> MessageHandler:
            self.register(command, fn, payload_model)
            return fn
        return wrap

    def resolve(self, command: str) -> Route:
        try:
            return self._routes[command]
        except KeyError:
            raise UnknownCommand(self.paradigm.value, command) from None

    def commands(self) -> list[str]:
        return sorted(self._routes)
