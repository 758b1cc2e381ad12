"""The three paradigms' consumers: MASTER (only the master consumes, manual ack after the
work, processed log against redelivery), MODEL (every node, its own exclusive queue on the
fanout exchange) and API (request/reply, competing consumers on one durable queue).

Each adds its paradigm's rules to the policy of :mod:`messaging.dispatch` (which says what
happens to a message in every case): MASTER claims the id in the processed log before the
handler and records it before the ack, retries through delay queues and requeues what reaches a
node that is no longer master; API answers every request, errors included, with their codes.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from coord import LeaderLatch, SessionState
from messaging.connection import Connector
from messaging.consumer import Consumer
from messaging.delivery import Delivery
from messaging.envelope import Envelope, Paradigm
from messaging.errors import (
    INTERNAL_ERROR,
    BrokerUnavailable,
    PublishFailed,
)
from messaging.outcomes import RETRIES_HEADER, DeliveryOutcome, describe
from messaging.processed import Claim, ProcessedLog
from messaging.publisher import Publisher
from messaging.registry import HandlerContext, HandlerRegistry, Route
from messaging.topology import Topology

log = logging.getLogger("latchwork.messaging")


class MasterConsumer(Consumer):
    """Consumes the MASTER queue only while ``latch`` says this node leads.

    It starts consuming when leadership is gained and cancels its consumer as soon as it is
    lost (the latch drops leadership on SUSPENDED and LOST); running handlers see
    ``ctx.cancelled`` and, if they then fail, their message is requeued for the next master. A
    delivery that reaches a handler slot after leadership was lost is requeued, not handled.
    """

    paradigm = Paradigm.MASTER

    def __init__(self, connector: Connector, topology: Topology, registry: HandlerRegistry,
                 member_id: str, publisher: Publisher, latch: LeaderLatch,
                 processed: ProcessedLog, **kwargs: Any) -> None:
        super().__init__(connector, topology, registry, member_id, publisher, **kwargs)
        self.latch = latch
        self.processed = processed
        latch.add_listener(on_gain=self.wake, on_loss=self._leadership_lost)

    def _leadership_lost(self) -> None:
        self.wake()
        self.cancel_inflight()

    def queue(self) -> str:
        return self.topology.master_queue

    def wants_consuming(self) -> bool:
        return self.latch.is_leader

    def _processed_log(self) -> ProcessedLog | None:
        return self.processed

    def _fence(self) -> str | None:
        return self.latch.node

    def _validity(self, ctx: HandlerContext) -> Callable[[], bool]:
        """The same leadership (the election node the handler started under is still this
        latch's, the latch leads) on a connected session, and the consumer not stopping."""
        def valid() -> bool:
            return (not self._stop.is_set() and self.latch.is_leader
                    and self.latch.node == ctx.fence
                    and self.latch.session.state is SessionState.CONNECTED
                    and not self.latch.session.expired())
        return valid

    def before_handler(self, delivery: Delivery, envelope: Envelope) -> bool:
        """Claim the message id before its handler runs: a copy being handled elsewhere (or in
        another worker here) is waited for, then found processed and acked as a duplicate;
        never run in parallel. Requeued when leadership goes while waiting, or while the claim
        itself was on its way (a claim made on a later session than the leadership it was
        asked under is released, not run on)."""
        while True:
            if not self.latch.is_leader or self._stop.is_set():
                delivery.requeue()
                self._emit(delivery, envelope, DeliveryOutcome.REQUEUED, "not master")
                return False
            claim = self.processed.claim(envelope.id, self.member_id, envelope.command)
            if claim is Claim.CLAIMED:
                if self.latch.is_leader and not self._stop.is_set():
                    return True
                # the claim went through after leadership was lost (a claim blocked by a cut
                # link completes on the next session): give it back, the master runs it
                self.processed.release(envelope.id)
                delivery.requeue()
                self._emit(delivery, envelope, DeliveryOutcome.REQUEUED,
                           "leadership lost while claiming")
                return False
            if claim is Claim.DONE:
                # a copy sent again (a lost confirm, a retried send) gets the first one's
                # answer. A record without it was written by the handler's own transaction
                # while the handler still runs: its answer comes with the claim's release
                reply = self.processed.reply_of(envelope.id)
                if reply is None:
                    if not self.processed.wait_released(envelope.id, 1.0):
                        continue  # still running: ask again (leadership is checked first)
                    reply = self.processed.reply_of(envelope.id) or answer_lost(envelope)
                self.answer(delivery, envelope, reply)
                delivery.ack()
                log.info("member %s: MASTER message %s (%s) was already processed; acked",
                         self.member_id, envelope.id, envelope.command)
                self._emit(delivery, envelope, DeliveryOutcome.DUPLICATE, "already processed")
                return False
            log.info("member %s: MASTER message %s (%s) is being handled by another copy; "
                     "waiting", self.member_id, envelope.id, envelope.command)
            self.processed.wait_released(envelope.id, 1.0)

    def _invoke(self, delivery: Delivery, envelope: Envelope, route: Route, payload: Any,
                retries: int) -> None:
        try:
            super()._invoke(delivery, envelope, route, payload, retries)
        finally:
            # failed, retried, cancelled: the next copy may run (a recorded id released it)
            self.processed.release(envelope.id)

    def on_success(self, delivery: Delivery, envelope: Envelope, ctx: HandlerContext,
                   result: Any) -> None:
        """Record the id with the answer (kept for a copy sent again), answer a waiting
        sender, ack. An answer that is not JSON, or over :data:`MAX_ANSWER` bytes, is recorded
        and sent as an error (``answer-invalid``): the effect happened, only its answer
        cannot be carried."""
        reply = answer_of(result)
        self.processed.record(envelope.id, self.member_id, reply=reply)
        self.answer(delivery, envelope, reply)
        super().on_success(delivery, envelope, ctx, result)

    def on_failure(self, delivery: Delivery, envelope: Envelope, ctx: HandlerContext,
                   exc: BaseException) -> None:
        retry = ctx.retries + 1
        if retry > self.topology.retry.max_retries:
            self.dead_letter(delivery, envelope, "retries-exhausted",
                             f"after {ctx.retries} retries: {describe(exc)}")
            return
        headers = delivery.headers
        headers[RETRIES_HEADER] = retry
        headers["x-latchwork-last-error"] = repr(exc)[:1000]
        try:
            props = delivery.properties  # a waiting sender is answered by the last try
            self.publisher.publish("", self.topology.retry_queue(retry), delivery.body,
                                   headers=headers, message_id=str(envelope.id),
                                   reply_to=props.reply_to,
                                   correlation_id=props.correlation_id, deadline=10.0)
        except (BrokerUnavailable, PublishFailed) as pub:
            log.error("member %s: could not schedule retry of %s: %s", self.member_id,
                      envelope.id, pub)
            delivery.requeue()
            self._emit(delivery, envelope, DeliveryOutcome.REQUEUED,
                       f"retry scheduling failed: {pub}")
            return
        delivery.ack()
        self._emit(delivery, envelope, DeliveryOutcome.RETRIED,
                   f"retry {retry} in {self.topology.retry.delay(retry):g}s: {exc!r}")


#: the largest answer a MASTER command's handler may return (JSON bytes): it is kept in the
#: processed record (a znode) for a copy sent again
MAX_ANSWER = 64 * 1024


def answer_lost(envelope: Envelope) -> dict[str, Any]:
    """The answer to a copy of a command whose first run committed its transaction and then
    ended without recording an answer (its master died, or the handler failed after the
    commit): the effect happened once, its answer is gone (never a made-up result)."""
    return {"ok": False, "error": {
        "kind": "AnswerLost", "code": "answer-lost", "refused": False,
        "detail": f"{envelope.command} {envelope.id} ran once (its transaction committed), "
                  "but the run ended before it recorded an answer"}}


def answer_of(result: Any) -> dict[str, Any]:
    """A handler's return value as the reply its sender gets."""
    try:
        size = len(json.dumps(result))
    except (TypeError, ValueError) as exc:
        return {"ok": False, "error": {"kind": "AnswerInvalid", "code": "answer-invalid",
                                       "detail": f"the handler's answer is not JSON: {exc}",
                                       "refused": False}}
    if size > MAX_ANSWER:
        return {"ok": False, "error": {"kind": "AnswerInvalid", "code": "answer-invalid",
                                       "detail": f"the handler's answer is {size} bytes of "
                                                 f"JSON, over the limit of {MAX_ANSWER}",
                                       "refused": False}}
    return {"ok": True, "result": result}


class ModelConsumer(Consumer):
    """This node's exclusive queue on the MODEL fanout exchange.

    The queue lives as long as the connection: broadcasts sent while the node was disconnected
    are not delivered to it (MODEL commands concern live nodes; a reconnected node should
    refresh its caches, see ``connections_opened``).
    """

    paradigm = Paradigm.MODEL

    def __init__(self, *args: Any, on_reconnect: Callable[[], object] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_reconnect = on_reconnect

    def queue(self) -> str:
        return self.topology.model_queue(self.member_id)

    def on_connected(self) -> None:
        if self.connections_opened > 1 and self.on_reconnect is not None:
            threading.Thread(target=self._reconnected, name="model-reconnected",
                             daemon=True).start()

    def _reconnected(self) -> None:
        assert self.on_reconnect is not None
        try:
            self.on_reconnect()
        except Exception:
            log.exception("member %s: refreshing after the MODEL reconnect failed",
                          self.member_id)

    def declare(self, channel: Any) -> None:
        super().declare(channel)
        channel.queue_declare(self.queue(), exclusive=True, auto_delete=True)
        channel.queue_bind(self.queue(), self.topology.model_exchange)


class ApiResponder(Consumer):
    """Answers API requests (competing consumers on one durable queue).

    The reply goes to the request's ``reply_to`` with its ``correlation_id``: ``{"ok": true,
    "result": ...}`` or ``{"ok": false, "error": {"kind", "code", "detail", "refused"}}``:
    ``code`` is the exception's ``error_code`` attribute (a stable string the client decides
    on), ``internal_error`` for an exception without one, or the reason a refused request was
    dead-lettered for (``invalid``, ``unknown-command``, ``too-large``); ``refused`` is the
    exception's ``refused`` attribute (the caller asked wrongly), and true for a request
    dead-lettered. A request without ``reply_to`` is dead-lettered.
    """

    paradigm = Paradigm.API

    def queue(self) -> str:
        return self.topology.api_queue

    def before_handler(self, delivery: Delivery, envelope: Envelope) -> bool:
        if not delivery.properties.reply_to:
            self.dead_letter(delivery, envelope, "invalid", "API request without reply_to")
            return False
        return True

    def on_success(self, delivery: Delivery, envelope: Envelope, ctx: HandlerContext,
                   result: Any) -> None:
        self.answer(delivery, envelope, {"ok": True, "result": result})
        super().on_success(delivery, envelope, ctx, result)

    def on_failure(self, delivery: Delivery, envelope: Envelope, ctx: HandlerContext,
                   exc: BaseException) -> None:
        code = getattr(exc, "error_code", None)
        self.answer(delivery, envelope, {"ok": False, "error": {
            "kind": type(exc).__name__, "detail": str(exc),
            "code": code if isinstance(code, str) else INTERNAL_ERROR,
            "refused": getattr(exc, "refused", False) is True}})
        delivery.ack()
        self._emit(delivery, envelope, DeliveryOutcome.HANDLED, f"answered with error {exc!r}")
