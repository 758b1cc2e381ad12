"""RabbitMQ paradigms for latchwork: MASTER (unicast, master only), MODEL (fanout), API.

Start with :class:`MessageBus` (a node's registries, publisher and consumers) and
:class:`ApiClient` (request/reply from anywhere). Errors are in :mod:`messaging.errors`; what
happens to a message on each failure is in :mod:`messaging.paradigms`.
"""

from messaging.bus import ApiClient, MessageBus, declare_topology, send_master
from messaging.connection import Backoff, Connector
from messaging.consumer import Consumer
from messaging.deadletters import DeadLetter, DeadLetterNotFound, DeadLetterQueue
from messaging.delivery import Delivery, DeliveryState
from messaging.envelope import (
    MAX_BODY,
    Envelope,
    Paradigm,
    decode,
    parse_json,
    summary,
    validate_payload,
)
from messaging.errors import (
    BrokerRefused,
    BrokerUnavailable,
    DeliveryAlreadySettled,
    EnvelopeError,
    HandlerCancelled,
    HandlerOutcome,
    InvalidEnvelope,
    LifecycleError,
    MessageTooLarge,
    MessagingError,
    PublishFailed,
    Reject,
    RemoteError,
    RequestTimeout,
    Retry,
    UndecodableMessage,
    UnknownCommand,
)
from messaging.outcomes import DeliveryOutcome
from messaging.paradigms import ApiResponder, MasterConsumer, ModelConsumer
from messaging.processed import ProcessedLog, ZkProcessedLog, fenced_out
from messaging.publisher import Publisher
from messaging.registry import HandlerContext, HandlerRegistry
from messaging.topology import RedeliveryPolicy, Topology

__all__ = [
    "DeadLetter", "DeadLetterNotFound", "DeadLetterQueue",
    "MAX_BODY", "ApiClient", "ApiResponder", "Backoff", "BrokerRefused", "BrokerUnavailable",
    "Connector",
    "Consumer",
    "Delivery", "DeliveryAlreadySettled", "DeliveryState", "Envelope", "EnvelopeError",
    "HandlerCancelled", "HandlerContext", "HandlerOutcome", "HandlerRegistry",
    "InvalidEnvelope", "LifecycleError",
    "MasterConsumer", "MessageBus", "MessagingError", "ModelConsumer", "DeliveryOutcome",
    "Paradigm",
    "ProcessedLog", "PublishFailed", "Publisher", "Reject", "RemoteError", "RequestTimeout",
    "Retry", "RedeliveryPolicy", "Topology", "UndecodableMessage", "UnknownCommand",
    "MessageTooLarge", "ZkProcessedLog", "declare_topology", "decode", "fenced_out",
    "send_master",
    "parse_json", "summary", "validate_payload",
]
