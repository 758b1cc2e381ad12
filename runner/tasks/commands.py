"""Your own master-only commands and broadcasts: the :func:`command` and :func:`broadcast`
decorators, declared in the same modules as ``@task`` and loaded the same way.

::

    # mypkg/tasks.py
    from pydantic import BaseModel
    from runner.tasks import CommandContext, broadcast, command

    class ReindexPayload(BaseModel):
        account: str

    @command("billing.reindex", payload=ReindexPayload)
    def reindex(ctx: CommandContext, payload: ReindexPayload) -> dict:
        ctx.check()                      # still the master it started under, right before
        ...                              # the effect
        return {"reindexed": payload.account}   # the answer a waiting sender gets (JSON)

    @broadcast("billing.cache.flush", on_reconnect=lambda services: CACHE.clear())
    def flush(ctx: CommandContext, payload: dict) -> None:
        CACHE.clear()

A **command** (MASTER paradigm) is run by the master only: its id is claimed before the handler
runs (a second copy never runs alongside; one that arrives after is acked as a duplicate and its
sender gets the first one's answer), it is acked after the handler and the processed record, a
master that dies mid-way leaves it to the next master (redelivered). Undecodable, unknown and
invalid commands are dead-lettered with their reason (and a waiting sender is told). A
**broadcast** (MODEL paradigm) runs on every node connected when it is sent; a node that was
disconnected then misses it and runs the broadcast's ``on_reconnect(services)`` instead when its
connection is back.

The context (:class:`CommandContext`, messaging's ``HandlerContext``) gives ``message_id``,
``redelivered``, ``cancelled`` (an event set when this node stops being master, or stops),
``check()`` and, for commands, ``transaction()``: a ZooKeeper transaction that records the
processed id together with an effect, fenced by the master's leadership (an effect kept in
ZooKeeper then happens exactly once). ``services`` is the node's (``ctx.services.get(Session)``).

Failure behaviour at load: a name declared twice, or a name a built-in command uses, raises
:class:`~runner.errors.TaskLoadError` (``latchwork node start`` exits 2 with it in one line).
"""

from __future__ import annotations

import inspect
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from messaging import HandlerContext, HandlerRegistry, Paradigm
from messaging.envelope import COMMAND_PATTERN
from runner.tasks.context import Services
from runner.tasks.observer import Observer, notify_command

log = logging.getLogger("latchwork.commands")
F = TypeVar("F", bound=Callable[..., Any])

#: what a command or broadcast handler gets (the messaging layer's context)
CommandContext = HandlerContext


@dataclass(frozen=True)
class CommandDeclaration:
    """What :func:`command` and :func:`broadcast` record on a handler."""

    name: str
    paradigm: Paradigm  # MASTER: a command; MODEL: a broadcast
    payload: type[BaseModel] | None
    description: str
    on_reconnect: Callable[[Services], object] | None = None

    @property
    def kind(self) -> str:
        return "command" if self.paradigm is Paradigm.MASTER else "broadcast"

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "description": self.description,
                "payload_schema": (self.payload.model_json_schema()
                                   if self.payload is not None else {"type": "object"}),
                "on_reconnect": self.on_reconnect is not None}


def _mark(name: str, paradigm: Paradigm, payload: type[BaseModel] | None, description: str,
          on_reconnect: Callable[[Services], object] | None) -> Callable[[F], F]:
    if not re.match(COMMAND_PATTERN, name):
        raise ValueError(f"invalid command name {name!r}: a letter, then up to 99 letters, "
                         "digits or _ . : -")

    def mark(handler: F) -> F:
        text = description or inspect.cleandoc(handler.__doc__ or "").split("\n\n")[0]
        handler.__dict__["latchwork_command"] = CommandDeclaration(
            name, paradigm, payload, " ".join(text.split()), on_reconnect)
        return handler
    return mark


def command(name: str, *, payload: type[BaseModel] | None = None,
            description: str = "") -> Callable[[F], F]:
    """Declare ``handler(ctx, payload) -> answer`` as the MASTER command ``name`` (see the
    module): ``payload`` its model (a payload that does not validate is dead-lettered
    ``invalid``), ``description`` what ``latchwork command list`` shows (the docstring's first
    paragraph when empty). The return value, JSON of at most 64 KiB, is the sender's answer."""
    return _mark(name, Paradigm.MASTER, payload, description, None)


def broadcast(name: str, *, payload: type[BaseModel] | None = None, description: str = "",
              on_reconnect: Callable[[Services], object] | None = None) -> Callable[[F], F]:
    """Declare ``handler(ctx, payload)`` as the broadcast ``name``, run on every connected
    node; ``on_reconnect(services)``: the catch-up a node runs when its connection comes back
    (broadcasts sent meanwhile were missed); without it they are simply missed."""
    return _mark(name, Paradigm.MODEL, payload, description, on_reconnect)


@dataclass(frozen=True)
class DeclaredCommand:
    declaration: CommandDeclaration
    handler: Callable[..., Any]
    builtin: bool


class Registries(Protocol):
    """Where declared handlers are registered: a :class:`~messaging.MessageBus`'s two
    registries (or the command stub's, :mod:`runner.testing.command_stub`)."""

    @property
    def master(self) -> HandlerRegistry: ...

    @property
    def model(self) -> HandlerRegistry: ...


class CommandRegistry:
    """The commands and broadcasts a node declares: its built-ins first, then its users'."""

    def __init__(self) -> None:
        self._commands: dict[str, DeclaredCommand] = {}

    def declare(self, declaration: CommandDeclaration, handler: Callable[..., Any], *,
                builtin: bool = False) -> None:
        """ValueError for a name declared already (a built-in's named as such)."""
        other = self._commands.get(declaration.name)
        if other is not None:
            whose = "a built-in command" if other.builtin else "already declared"
            raise ValueError(f"{declaration.kind} {declaration.name!r} is {whose}")
        self._commands[declaration.name] = DeclaredCommand(declaration, handler, builtin)

    def names(self) -> list[str]:
        return sorted(self._commands)

    def known(self, name: str) -> bool:
        return name in self._commands

    def describe(self) -> list[dict[str, Any]]:
        """Each one's name, kind, description, payload schema, whether it is a built-in."""
        return [{**c.declaration.describe(), "builtin": c.builtin}
                for _, c in sorted(self._commands.items())]

    def install(self, bus: Registries, services: Services,
                observers: Sequence[Observer] = ()) -> None:
        """Register every handler on the bus: commands on MASTER, broadcasts on MODEL; each
        run gets ``services`` and is timed for the observers' ``after_command``."""
        for name, declared in sorted(self._commands.items()):
            registry = bus.master if declared.declaration.paradigm is Paradigm.MASTER \
                else bus.model
            registry.register(name, _run(name, declared.handler, services, observers),
                              declared.declaration.payload)

    def reconnected(self, services: Services) -> None:
        """Run each broadcast's catch-up (its connection came back: broadcasts were missed);
        one that fails is logged and the others still run."""
        for name, declared in sorted(self._commands.items()):
            catch_up = declared.declaration.on_reconnect
            if catch_up is None:
                continue
            try:
                catch_up(services)
            except Exception:
                log.exception("the catch-up of broadcast %s failed after the reconnect", name)


def _run(name: str, handler: Callable[..., Any], services: Services,
         observers: Sequence[Observer]) -> Callable[[HandlerContext, Any], Any]:
    def run(ctx: HandlerContext, payload: Any) -> Any:
        ctx.services = services
        started = time.monotonic()
        result = "failed"
        try:
            answer = handler(ctx, payload)
            result = "ok"
            return answer
        except BaseException:
            result = "cancelled" if ctx.cancelled.is_set() else "failed"
            raise
        finally:
            notify_command(observers, name, time.monotonic() - started, result)
    return run
