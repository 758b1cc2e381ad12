"""What a consumer does with one delivery, on a worker thread: decode, validate, route, run the
handler, and decide (the message policy; the transport loop is :mod:`messaging.consumer`).

What happens to a message (``DeliveryOutcome``):

* handled: the handler returned; the message is acked (MASTER: after its id is recorded);
* duplicate: MASTER only, the id is in the processed log; acked without running the handler;
* retried: MASTER only, the handler raised :class:`Retry` or an unexpected error: a copy goes to
  the delay queue for that retry (confirmed) and the original is acked; after
  ``RedeliveryPolicy.max_retries`` the message is dead-lettered as ``retries-exhausted``;
* dead-lettered: undecodable, invalid, unknown command, :class:`Reject`, or out of retries: a
  copy with ``x-latchwork-reason``/``x-latchwork-detail`` headers goes to the dead-letter queue
  (confirmed), then the original is ``basic_nack(requeue=False)``-ed;
* requeued: the handler was cancelled (shutdown, lost leadership), or a MASTER delivery reached a
  node that is no longer master; the broker hands it to the next consumer.

If the broker is gone while a decision is being carried out, the decision is dropped and the
broker redelivers the message: nothing is lost, at worst handled again (hence the processed log).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from messaging.delivery import Delivery, DeliveryState
from messaging.envelope import Envelope, Paradigm, decode
from messaging.errors import (
    BrokerUnavailable,
    EnvelopeError,
    InvalidEnvelope,
    PublishFailed,
    Reject,
    Retry,
    UnknownCommand,
)
from messaging.outcomes import (
    DETAIL_HEADER,
    REASON_HEADER,
    RETRIES_HEADER,
    DeliveryOutcome,
    OutcomeHook,
    ReceiveHook,
    describe,
    reply_too_large,
)
from messaging.processed import ProcessedLog
from messaging.publisher import Publisher
from messaging.registry import HandlerContext, HandlerRegistry, Route
from messaging.topology import Topology

log = logging.getLogger("latchwork.messaging")


#: the most retries a ``x-latchwork-retries`` header may count (the policy's own maximum is
#: far lower: a larger count was not written by a node)
MAX_RETRIES_HEADER = 1000


def retries_of(delivery: Delivery) -> int:
    """The retry count a delivery carries (0 without the header). The header is read like the
    body: anything but a whole number in 0..:data:`MAX_RETRIES_HEADER` is
    :class:`InvalidEnvelope`, so a hand-made header is refused once, never looped on."""
    value = delivery.headers.get(RETRIES_HEADER)
    if value is None:
        return 0
    if type(value) is not int or not 0 <= value <= MAX_RETRIES_HEADER:
        raise InvalidEnvelope(f"header {RETRIES_HEADER} is {value!r:.60}, not a whole number "
                              f"from 0 to {MAX_RETRIES_HEADER}")
    return value


class Dispatcher:
    """The message policy of a consumer; :class:`~messaging.consumer.Consumer` adds the
    transport (a connection thread that feeds :meth:`_handle` from its worker pool)."""

    paradigm: Paradigm
    topology: Topology
    registry: HandlerRegistry
    member_id: str
    publisher: Publisher
    max_body: int
    on_receive: list[ReceiveHook]
    on_outcome: list[OutcomeHook]
    _lock: threading.Lock
    _stop: threading.Event
    _inflight: dict[int, HandlerContext | None]

    @property
    def name(self) -> str:
        return f"{self.paradigm.value.lower()}-consumer"

    # -- paradigm specifics -------------------------------------------------------------------
    def wants_consuming(self) -> bool:
        """Whether this consumer should hold its queue now (the master's: while it leads)."""
        return True

    def before_handler(self, delivery: Delivery, envelope: Envelope) -> bool:
        """False when the consumer settled the delivery itself (handler must not run)."""
        return True

    def on_success(self, delivery: Delivery, envelope: Envelope, ctx: HandlerContext,
                   result: Any) -> None:
        delivery.ack()
        self._emit(delivery, envelope, DeliveryOutcome.HANDLED, "")

    def on_failure(self, delivery: Delivery, envelope: Envelope, ctx: HandlerContext,
                   exc: BaseException) -> None:
        self.dead_letter(delivery, envelope, "handler-failed", describe(exc))

    # -- worker threads -----------------------------------------------------------------------
    def handle(self, delivery: Delivery) -> None:
        """Decide one delivery on the calling thread: what a worker of the consumer's pool
        runs for each; an in-memory transport calls it directly
        (:mod:`messaging.testing.memory`)."""
        with self._lock:
            self._inflight[id(delivery)] = None
        self._handle(delivery)

    def _handle(self, delivery: Delivery) -> None:
        envelope: Envelope | None = None
        try:
            try:
                envelope = decode(delivery.body, content_type=delivery.properties.content_type,
                                  max_bytes=self.max_body)
                if envelope.paradigm is not self.paradigm:
                    raise InvalidEnvelope(f"a {envelope.paradigm} message on the "
                                          f"{self.paradigm} queue")
                route = self.registry.resolve(envelope.command)
                payload = route.parse(envelope.payload)
                retries = retries_of(delivery)
            except (EnvelopeError, UnknownCommand) as exc:
                self.dead_letter(delivery, envelope, exc.reason, str(exc))
                return
            except Exception as exc:
                # reading a message is a pure function of its bytes: what fails here fails
                # on every delivery, so a requeue would loop. Refused once, with the bug's trace
                log.exception("member %s: %s could not read delivery %d; dead-lettering it",
                              self.member_id, self.name, delivery.delivery_tag)
                self.dead_letter(delivery, envelope, "invalid",
                                 f"the message could not be read: {exc!r}")
                return
            for hook in self.on_receive:
                hook(delivery, envelope)
            if not self.before_handler(delivery, envelope):
                return
            self._invoke(delivery, envelope, route, payload, retries)
        except Exception:
            log.exception("member %s: %s failed handling delivery %d", self.member_id,
                          self.name, delivery.delivery_tag)
            if delivery.state is DeliveryState.RECEIVED:
                delivery.requeue()
        finally:
            with self._lock:
                self._inflight.pop(id(delivery), None)

    def _invoke(self, delivery: Delivery, envelope: Envelope, route: Route, payload: Any,
                retries: int) -> None:
        ctx = HandlerContext(envelope=envelope, redelivered=delivery.redelivered,
                             retries=retries, member_id=self.member_id,
                             publisher=self.publisher, processed=self._processed_log(),
                             fence=self._fence())
        ctx.valid = self._validity(ctx)
        with self._lock:
            self._inflight[id(delivery)] = ctx
        if self._stop.is_set() or not self.wants_consuming():  # a loss before ctx existed
            ctx.cancelled.set()
        try:
            result = route.handler(ctx, payload)
        except Reject as exc:
            self.dead_letter(delivery, envelope, "rejected", str(exc) or "rejected by handler")
            return
        except Exception as exc:
            if ctx.cancelled.is_set():
                delivery.requeue()
                self._emit(delivery, envelope, DeliveryOutcome.REQUEUED, f"cancelled: {exc!r}")
                return
            # an error with a stable code is an expected refusal (bad input, a missing task):
            # one line; anything else is a bug worth its traceback
            code = getattr(exc, "error_code", None)
            expected = isinstance(exc, Retry) or isinstance(code, str)
            log.warning("member %s: %s handler %s failed on message %s: %r", self.member_id,
                        self.paradigm, envelope.command, envelope.id, exc,
                        exc_info=not expected)
            self.on_failure(delivery, envelope, ctx, exc)
            return
        self.on_success(delivery, envelope, ctx, result)

    def _processed_log(self) -> ProcessedLog | None:
        return None

    def _fence(self) -> str | None:
        """The znode a handler's ``ctx.transaction()`` checks (MASTER: the election node)."""
        return None

    def _validity(self, ctx: HandlerContext) -> Callable[[], bool]:
        """What ``ctx.check()`` asks besides the cancellation (MASTER: the same leadership)."""
        return lambda: not self._stop.is_set()

    def answer(self, delivery: Delivery, envelope: Envelope | None,
               reply: dict[str, Any]) -> None:
        """Send ``reply`` (``{"ok", "result"}`` or ``{"ok": false, "error"}``) to the sender
        waiting on the message's ``reply_to``, if any; a sender that gave up (its reply queue
        gone) costs nothing, and a broker that cannot take it is logged, not raised: the
        message's own fate is decided already."""
        props = delivery.properties
        if not props.reply_to:
            return
        command = envelope.command if envelope is not None else "error"
        answer = Envelope(paradigm=self.paradigm, command=command, sender=self.member_id,
                          payload=reply)
        size = len(answer.encode())
        if size > self.max_body:
            # the sender would drop it unread and wait in vain: say what happened instead
            log.warning("member %s: the answer to %s is %d bytes, over the limit of %d; "
                        "answering reply-too-large", self.member_id, command, size,
                        self.max_body)
            answer = Envelope(paradigm=self.paradigm, command=command, sender=self.member_id,
                              payload=reply_too_large(command, size, self.max_body))
        try:
            self.publisher.publish("", props.reply_to, answer, persistent=False,
                                   mandatory=False,
                                   correlation_id=props.correlation_id or props.message_id,
                                   deadline=10.0)
        except (BrokerUnavailable, PublishFailed) as exc:
            log.warning("member %s: could not answer the sender of %s: %s", self.member_id,
                        envelope.id if envelope is not None else "a message", exc)

    def _emit(self, delivery: Delivery, envelope: Envelope | None, outcome: DeliveryOutcome,
              detail: str) -> None:
        if outcome in (DeliveryOutcome.REQUEUED, DeliveryOutcome.RETRIED):
            # rare (leadership changes, failures) and what a lost message is traced by
            log.info("member %s: %s message %s (%s) %s: %s", self.member_id,
                     self.paradigm.value, envelope.id if envelope else "-",
                     envelope.command if envelope else "undecoded", outcome.value, detail)
        for hook in self.on_outcome:
            try:
                hook(delivery, envelope, outcome, detail)
            except Exception:
                log.exception("outcome hook failed")

    def dead_letter(self, delivery: Delivery, envelope: Envelope | None, reason: str,
                    detail: str) -> None:
        """Copy the message to the dead-letter queue with its reason, then reject it."""
        headers = delivery.headers
        headers.update({
            REASON_HEADER: reason, DETAIL_HEADER: detail[:4000],
            "x-latchwork-queue": delivery.queue, "x-latchwork-member": self.member_id,
            "x-latchwork-dead-at": datetime.now(UTC).isoformat(),
        })
        props = delivery.properties
        try:
            self.publisher.publish("", self.topology.dead_queue, delivery.body, headers=headers,
                                   correlation_id=props.correlation_id,
                                   reply_to=props.reply_to, message_id=props.message_id,
                                   deadline=10.0)
        except (BrokerUnavailable, PublishFailed) as exc:
            log.error("member %s: could not dead-letter delivery %d (%s: %s): %s; leaving it "
                      "to the broker", self.member_id, delivery.delivery_tag, reason, detail,
                      exc)
            delivery.requeue()
            self._emit(delivery, envelope, DeliveryOutcome.REQUEUED, f"dead-letter failed: {exc}")
            return
        delivery.reject()
        # a sender waiting for the answer learns why: a refusal, or the last failure
        exhausted = reason == "retries-exhausted"
        self.answer(delivery, envelope, {"ok": False, "error": {
            "kind": "HandlerFailed" if exhausted else reason, "code": reason,
            "detail": detail, "refused": not exhausted}})
        what = envelope.command if envelope is not None else "undecodable message"
        log.warning("member %s: dead-lettered %s from %s: %s: %s", self.member_id, what,
                    delivery.queue, reason, detail)
        self._emit(delivery, envelope, DeliveryOutcome.DEAD_LETTERED, f"{reason}: {detail}")


