"""messaging's exceptions, one root, split by cause (``tests/test_layout.py`` checks that this
tree equals the classes; one lives with its module, named in brackets)::

    MessagingError
    ├── BrokerUnavailable         no connection to RabbitMQ within the deadline
    │   └── BrokerRefused         the broker refused the login (user, password, vhost)
    ├── PublishFailed             the broker nacked or could not route a confirmed publish
    ├── EnvelopeError             a message body is not a valid envelope (poison)
    │   ├── UndecodableMessage    not UTF-8 JSON
    │   ├── MessageTooLarge       over the consumer's body limit
    │   └── InvalidEnvelope       not JSON content, no id, or the schema or payload does not
    │                             validate (unknown fields included)
    ├── UnknownCommand            no handler is registered for the command (poison)
    ├── DeliveryAlreadySettled    a delivery was acked, rejected or requeued twice
    ├── RequestTimeout            an API request got no reply in time
    ├── RemoteError               the API responder (or the master) answered with an error
    ├── HandlerCancelled          ctx.check(): stopping, or no longer the master it started as
    └── DeadLetterNotFound        [messaging.deadletters] no dead letter has this id

    LifecycleError                start() twice, or use after close(): coord's one class
                                  (coord.errors), the same for every component of the project

    HandlerOutcome (control flow, raised by handlers; never logged as errors)
    ├── Retry                     transient failure: try again later, with backoff
    └── Reject                    poison: dead-letter now with this reason

pika's exceptions are translated at the boundary; callers never import pika to handle errors.
"""

from __future__ import annotations

from coord.errors import LifecycleError

__all__ = ["INTERNAL_ERROR", "BrokerRefused", "BrokerUnavailable", "DeliveryAlreadySettled",
           "EnvelopeError", "HandlerCancelled", "HandlerOutcome", "InvalidEnvelope",
           "LifecycleError",
           "MessageTooLarge", "MessagingError", "PublishFailed", "Reject", "RemoteError",
           "RequestTimeout", "Retry", "UndecodableMessage", "UnknownCommand"]

#: the code of an API error reply for an exception without an ``error_code`` attribute
INTERNAL_ERROR = "internal_error"


class MessagingError(Exception):
    """Root of every error raised by messaging."""


class BrokerUnavailable(MessagingError):
    """RabbitMQ could not be reached (or kept dropping the connection) until the deadline."""


class BrokerRefused(BrokerUnavailable):
    """RabbitMQ refused the login: a wrong user or password, or no permission on the vhost."""


class PublishFailed(MessagingError):
    """The broker refused a confirmed publish (nack) or could not route it (mandatory)."""


class EnvelopeError(MessagingError):
    """The body is not a valid envelope; ``reason`` is the dead-letter reason code."""

    reason = "invalid"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class UndecodableMessage(EnvelopeError):
    """The body is not UTF-8 JSON."""

    reason = "undecodable"


class MessageTooLarge(EnvelopeError):
    """The body is over the consumer's limit (``Consumer.max_body``)."""

    reason = "too-large"


class InvalidEnvelope(EnvelopeError):
    """The body is JSON but does not match the envelope schema or the command's payload model."""

    reason = "invalid"


class UnknownCommand(MessagingError):
    """No handler is registered for this command on this paradigm."""

    reason = "unknown-command"

    def __init__(self, paradigm: str, command: str) -> None:
        super().__init__(f"no {paradigm} handler for command {command!r}")
        self.paradigm = paradigm
        self.command = command


class DeliveryAlreadySettled(MessagingError):
    """A second ack/reject/requeue decision on one delivery."""


class RequestTimeout(MessagingError):
    """An API request got no reply within its timeout (no node answered)."""


class RemoteError(MessagingError):
    """The node that handled an API request answered with an error."""

    def __init__(self, kind: str, detail: str, code: str | None = None,
                 refused: bool = False) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind  # the exception's class name on the node: for people, not programs
        self.detail = detail
        #: the request itself was wrong (the node's exception declared ``refused``, or the
        #: node's messaging layer refused it): sending it again will not help
        self.refused = refused
        #: the stable code to decide on (the exception's ``error_code``, ``internal_error`` for
        #: one without, or the reason the request was refused); ``kind`` when the node is too
        #: old to send one
        self.code = code or kind


class HandlerCancelled(MessagingError):
    """``ctx.check()`` found the handler cancelled: the node is stopping or, for a MASTER
    handler, it is no longer the master it started under (leadership lost, session not
    connected). Raised before an effect, it requeues the message for the next master."""


class HandlerOutcome(Exception):
    """Raised by a handler to choose what happens to its message."""


class Retry(HandlerOutcome):
    """A transient failure: redeliver later through the delay queue (bounded)."""


class Reject(HandlerOutcome):
    """A poison message: dead-letter it now with this reason."""
