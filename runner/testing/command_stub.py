"""Run your ``@command`` and ``@broadcast`` handlers in-process, for fast unit tests of their
logic: no RabbitMQ, no ZooKeeper, no node::

    from runner.testing.stub import CommandStub
    from mypkg.tasks import reindex                   # a function marked with @command

    def test_reindex_answers_and_records_once():
        with CommandStub() as stub:
            run = stub.send(reindex, {"account": "acme"})
            assert run.answer == {"ok": True, "result": {"reindexed": "acme"}}
            again = stub.send(reindex, {"account": "acme"}, message_id=run.message_id)
            assert again.outcome is DeliveryOutcome.DUPLICATE and again.answer == run.answer

The stub drives the consumers' own policy (:class:`~messaging.paradigms.MasterConsumer` for a
command, :class:`~messaging.paradigms.ModelConsumer` for a broadcast: decode, validate, claim
the id, run, record, answer, ack, retry, dead-letter) with the node's own wrapping of declared
handlers (their ``services``, the observers' ``after_command``), over an in-memory transport
(:mod:`messaging.testing.memory`):

* ``ctx.check()`` passes while the stub's node is master; ``send(..., lost_at_check=n)`` makes
  the n-th check find the mastership lost (the handler's ``HandlerCancelled``; the message is
  requeued for the next master), and ``stub.lose_mastership()``, called from a handler, loses it
  at that point (``ctx.cancelled`` is set);
* ``ctx.transaction()`` is a transaction with kazoo's semantics on an in-memory tree
  (``stub.tree``), fenced by the stub's election node: committed after the mastership was lost,
  it applies nothing (``messaging.fenced_out(results)``);
* the answer a waiting sender gets is ``run.answer``; a copy of a processed id
  (``send(..., message_id=...)``) is a duplicate answered with the first one's answer;
* a payload that does not validate, an unknown command, a :class:`~messaging.Reject` or retries
  spent are dead-lettered (``run.outcome``, ``run.detail``); another failure is a retry
  (``run.outcome`` RETRIED; ``send(..., retries=n)`` sends the n-th retry).

What it cannot show is the broker and the cluster: a master killed mid-way and the redelivery to
the next one, a lost connection. Those stay in the real-server tests.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from messaging import DeliveryOutcome, Envelope, HandlerContext, HandlerRegistry, Topology
from messaging.connection import Connector
from messaging.delivery import Delivery, DeliveryState
from messaging.envelope import Paradigm
from messaging.outcomes import RETRIES_HEADER
from messaging.paradigms import MasterConsumer, ModelConsumer
from messaging.testing.memory import (
    Decided,
    MemoryProcessedLog,
    MemoryTree,
    Published,
    RecordingPublisher,
    StubLatch,
    delivery,
)
from runner.tasks import Services
from runner.tasks.commands import CommandDeclaration, CommandRegistry
from runner.tasks.observer import Observer

#: where the stub's sender waits for answers
REPLY_TO = "stub.reply"


@dataclass
class CommandRun:
    """What became of one message the stub sent."""

    message_id: uuid.UUID
    outcome: DeliveryOutcome
    detail: str
    state: DeliveryState  # acked, rejected (dead-lettered) or requeued
    answer: dict[str, Any] | None  # what a waiting sender got (None: no answer)
    checks: int = 0  # how many times the handler called ctx.check()
    #: what the dispatcher published besides the answer (a dead letter, a retry's copy)
    published: list[Published] = field(default_factory=list)


class _Bus:
    """What ``CommandRegistry.install`` registers on: the two paradigms' registries."""

    def __init__(self) -> None:
        self.master = HandlerRegistry(Paradigm.MASTER)
        self.model = HandlerRegistry(Paradigm.MODEL)


class _Counted:
    """A consumer whose handlers' ``ctx.check()`` are counted; at the ``lost_at``-th the
    mastership is lost first (``lose``)."""

    lost_at: int | None = None
    checks = 0
    lose: Callable[[], None] = staticmethod(lambda: None)

    def _validity(self, ctx: HandlerContext) -> Callable[[], bool]:
        valid: Callable[[], bool] = super()._validity(ctx)  # type: ignore[misc]

        def counted() -> bool:
            self.checks += 1
            if self.lost_at is not None and self.checks >= self.lost_at:
                self.lose()
            return valid()
        return counted


class _Master(_Counted, MasterConsumer):
    pass


class _Model(_Counted, ModelConsumer):
    pass


class CommandStub:
    """Sends commands and broadcasts to their handlers, one at a time, in memory."""

    def __init__(self, *, member_id: str = "stub:0:test", services: Services | None = None,
                 observers: Sequence[Observer] = (), cluster: str = "stub") -> None:
        self.member_id = member_id
        self.services = services or Services()
        self.observers = list(observers)
        self.tree = MemoryTree()
        self.processed = MemoryProcessedLog(self.tree)
        self.latch = StubLatch(self.tree, member_id)
        self.publisher = RecordingPublisher()
        self.topology = Topology(cluster)
        self._handlers: dict[str, Callable[..., Any]] = {}  # the declared ones, by name
        self._bus = _Bus()
        self._outcomes: list[tuple[DeliveryOutcome, str]] = []
        connector = Connector("amqp://stub.invalid/")  # never connected
        hooks = [self._outcome]
        self._master = _Master(connector, self.topology, self._bus.master, member_id,
                               self.publisher, self.latch, self.processed, on_outcome=hooks)
        self._master.lose = self.latch.lose
        self._model = _Model(connector, self.topology, self._bus.model, member_id,
                             self.publisher, on_outcome=hooks)

    def _outcome(self, delivery: Delivery, envelope: Envelope | None, outcome: DeliveryOutcome,
                 detail: str) -> None:
        self._outcomes.append((outcome, detail))

    def _declared(self, handler: Callable[..., Any]) -> CommandDeclaration:
        declaration = getattr(handler, "latchwork_command", None)
        if not isinstance(declaration, CommandDeclaration):
            raise TypeError(f"{handler!r} is not marked with @command or @broadcast")
        known = self._handlers.get(declaration.name)
        if known is None:
            self._handlers[declaration.name] = handler
            single = CommandRegistry()  # the node's own wrapping, for this one handler
            single.declare(declaration, handler)
            single.install(self._bus, self.services, self.observers)
        elif known is not handler:
            raise ValueError(f"{declaration.kind} {declaration.name!r} is already declared "
                             f"by {known!r}")
        return declaration

    def lose_mastership(self) -> None:
        """This node stops being master now (its election node gone): a running command's
        ``ctx.cancelled`` is set, its next ``ctx.check()`` raises, and a transaction committed
        from now on applies nothing. The next :meth:`send` wins the mastership again."""
        self.latch.lose()

    def send(self, handler: Callable[..., Any], payload: Mapping[str, Any] | None = None, *,
             message_id: uuid.UUID | None = None, lost_at_check: int | None = None,
             retries: int = 0, command: str | None = None) -> CommandRun:
        """Send one message to ``handler`` (a function marked with ``@command`` or
        ``@broadcast``) with ``payload``, as a sender waiting for the answer would, and
        return what became of it. ``message_id``: the id of an earlier message (a copy sent
        again); ``retries``: the retry this delivery is; ``command``: send under another name
        (an unknown command is dead-lettered)."""
        declaration = self._declared(handler)
        master = declaration.paradigm is Paradigm.MASTER
        if lost_at_check is not None and not master:
            raise ValueError("lost_at_check is for commands: a broadcast has no master")
        envelope = Envelope(id=message_id or uuid.uuid4(), paradigm=declaration.paradigm,
                            command=command or declaration.name, sender="stub-sender",
                            payload=dict(payload or {}))
        self.latch.gain()
        consumer = self._master if master else self._model
        consumer.checks, consumer.lost_at = 0, lost_at_check
        queue = self.topology.master_queue if master else self.topology.model_queue(
            self.member_id)
        decided = Decided()
        headers = {RETRIES_HEADER: retries} if retries else {}
        seen, self._outcomes = len(self.publisher.published), []
        consumer.handle(delivery(envelope, queue, decided, reply_to=REPLY_TO, headers=headers))
        published = self.publisher.published[seen:]
        answers = [Envelope.model_validate_json(p.body).payload for p in published
                   if p.routing_key == REPLY_TO]
        outcome, detail = self._outcomes[-1] if self._outcomes else (
            DeliveryOutcome.REQUEUED, "the consumer failed handling it (see the log)")
        return CommandRun(envelope.id, outcome, detail,
                          decided.states[-1] if decided.states else DeliveryState.RECEIVED,
                          answers[-1] if answers else None, consumer.checks,
                          [p for p in published if p.routing_key != REPLY_TO])

    def close(self) -> None:
        for consumer in (self._master, self._model):
            consumer._pool.shutdown(wait=False)

    def __enter__(self) -> CommandStub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
