"""Pure logic of messaging: envelope validation, the delivery state machine, registries."""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from messaging import (
    Delivery,
    DeliveryAlreadySettled,
    DeliveryState,
    Envelope,
    EnvelopeError,
    HandlerRegistry,
    InvalidEnvelope,
    Paradigm,
    RedeliveryPolicy,
    Topology,
    UndecodableMessage,
    UnknownCommand,
    decode,
)


def test_envelope_round_trip_keeps_every_field() -> None:
    env = Envelope(paradigm=Paradigm.MASTER, command="SYNCHRONIZE_MODEL", sender="h:1:x",
                   payload={"iri": "https://brickschema.org/schema/Brick", "n": [1, 2]})
    back = decode(env.encode())
    assert back == env
    assert isinstance(back.id, uuid.UUID) and back.created_at.tzinfo is not None


ID = b'"id": "5f0c4a52-3d7e-4c55-9a55-0d1c9ad4c3b1"'


@pytest.mark.parametrize("body, error, fragment", [
    (b"\xff\xfe garbage", UndecodableMessage, "UTF-8 JSON"),
    (b"{not json", UndecodableMessage, "UTF-8 JSON"),
    (b"[1, 2]", InvalidEnvelope, "not an object"),
    (b'{"paradigm": "MASTER", "command": "x", "sender": "s"}', InvalidEnvelope,
     "id: Field required"),
    (b'{"paradigm": "MASTER", "command": "x", "sender": "s", "v": 2, ' + ID + b"}",
     InvalidEnvelope, "v"),
    (b'{"paradigm": "NOPE", "command": "x", "sender": "s", ' + ID + b"}", InvalidEnvelope,
     "paradigm"),
    (b'{"paradigm": "MASTER", "command": "bad command!", "sender": "s", ' + ID + b"}",
     InvalidEnvelope, "command"),
    (b'{"paradigm": "MASTER", "command": "x", "sender": "s", "extra": 1, ' + ID + b"}",
     InvalidEnvelope, "extra"),
    (b'{"paradigm": "MASTER", "command": "x", "sender": "s", "id": "not-a-uuid"}',
     InvalidEnvelope, "id"),
    (b'{"paradigm": "MASTER", "command": "x", "sender": "s", ' + ID +
     b', "created_at": "2026-01-01T00:00:00"}', InvalidEnvelope, "created_at"),
])
def test_bad_bodies_raise_typed_errors_with_a_reason(body: bytes, error: type[EnvelopeError],
                                                     fragment: str) -> None:
    with pytest.raises(error) as info:
        decode(body)
    assert fragment in str(info.value)
    assert info.value.reason in ("undecodable", "invalid")


@given(st.binary(max_size=300))
def test_decode_never_leaks_a_foreign_exception(body: bytes) -> None:
    try:
        decode(body)
    except EnvelopeError:
        pass


@given(st.dictionaries(st.text(max_size=10), st.integers() | st.text(max_size=10), max_size=6))
def test_decode_of_random_json_objects_is_valid_or_typed(raw: dict[str, object]) -> None:
    try:
        env = decode(json.dumps(raw).encode())
    except InvalidEnvelope:
        return
    assert env.command


def _delivery(settled: list[DeliveryState]) -> Delivery:
    return Delivery(body=b"", delivery_tag=1, redelivered=False, properties=None, queue="q",
                    generation=0, settler=lambda d, s: settled.append(s))


@pytest.mark.parametrize("first, second", [("ack", "ack"), ("ack", "reject"),
                                           ("reject", "requeue"), ("requeue", "ack")])
def test_a_delivery_is_settled_once(first: str, second: str) -> None:
    settled: list[DeliveryState] = []
    delivery = _delivery(settled)
    getattr(delivery, first)()
    with pytest.raises(DeliveryAlreadySettled):
        getattr(delivery, second)()
    assert len(settled) == 1 and delivery.state is settled[0]


class Payload(BaseModel):
    seconds: float


def test_registry_routes_validates_and_refuses_unknown_commands() -> None:
    registry = HandlerRegistry(Paradigm.MASTER)
    registry.register("diag.sleep", lambda ctx, p: p.seconds, Payload)
    route = registry.resolve("diag.sleep")
    assert route.parse({"seconds": 2}).seconds == 2
    with pytest.raises(InvalidEnvelope, match="seconds"):
        route.parse({"seconds": "long"})
    with pytest.raises(UnknownCommand, match="nope") as info:
        registry.resolve("nope")
    assert info.value.reason == "unknown-command"
    with pytest.raises(ValueError, match="already"):
        registry.register("diag.sleep", lambda ctx, p: None)
    with pytest.raises(ValueError, match="invalid command"):
        registry.register("has space", lambda ctx, p: None)


def test_retry_policy_and_queue_names() -> None:
    policy = RedeliveryPolicy(max_retries=3, first_delay=1.0, factor=4.0, max_delay=10.0)
    assert [policy.delay(n) for n in (1, 2, 3)] == [1.0, 4.0, 10.0]
    topology = Topology("c1", retry=policy)
    assert topology.retry_queue(2) == "latchwork.c1.master.retry.4000"
    assert topology.model_queue("h:1:x") == "latchwork.c1.model.h:1:x"
    with pytest.raises(ValueError):
        RedeliveryPolicy(max_retries=-1)


def test_a_request_the_broker_nacks_is_a_typed_error_not_pikas() -> None:
    """Chaos (hosts, this session) had the client's command raise pika's NackError from
    ``basic_publish`` around a broker restart: untyped, it killed the sender's thread. It is
    :class:`PublishFailed` from the API client, and the client's ``BrokerUnreachable``
    (a ClientError: send it again). The broker's nack is played by a channel stub."""
    import pika.exceptions
    import pytest

    from messaging import ApiClient, PublishFailed, Topology
    from runner.client import _answered
    from runner.errors import BrokerUnreachable, RequestFailed, RequestRefused

    class Nacking:
        is_open = True

        def process_data_events(self, time_limit: float = 0) -> None:
            pass

        def basic_publish(self, *args: object, **kwargs: object) -> None:
            raise pika.exceptions.NackError([])

    api = ApiClient(connector=None, topology=Topology("c"))  # type: ignore[arg-type]
    api._connection = Nacking()  # type: ignore[assignment]
    api._channel = Nacking()
    with pytest.raises(PublishFailed, match="did not take it"):
        api.command("X", {}, wait=1.0)
    with pytest.raises(BrokerUnreachable, match="did not take it"), \
            _answered("X", RequestRefused, RequestFailed):
        api.command("X", {}, wait=1.0)
