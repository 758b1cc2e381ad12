"""Fuzzing the input boundaries: message bodies and envelopes through ``decode`` and a
consumer's routing (registry and payload validation), and task payloads through submission
validation. No input may crash them with anything but their typed errors, every rejection
carries a reason, and each input is handled in bounded time. (The real-broker path of the same
rejections is tested in test_messaging.py; these are pure functions, so no server is needed.)"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from messaging import EnvelopeError, HandlerRegistry, Paradigm, UnknownCommand, decode
from messaging.envelope import MAX_BODY
from runner.errors import InvalidPayload, TaskError
from runner.node.registries import default_registry

#: inputs per property: 2,000 in the suite (each property about 15 s); ``make fuzz`` runs
#: 50,000 (LATCHWORK_FUZZ_EXAMPLES), where a new generator or a changed decoder is tried hard
EXAMPLES = int(os.environ.get("LATCHWORK_FUZZ_EXAMPLES", "2000"))
PER_INPUT = 0.5  # seconds: far above what one input takes; a hang or blow-up fails

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                               max_size=4),
    max_leaves=12)

FIELDS = ("v", "id", "paradigm", "command", "created_at", "sender", "payload")
field_values = {
    "v": st.sampled_from([1, 2, "1", None]),
    "id": st.one_of(st.uuids().map(str), st.text(max_size=40)),
    "paradigm": st.sampled_from(["MASTER", "MODEL", "API", "master", ""]),
    "command": st.one_of(st.sampled_from(["SYNCHRONIZE_MODEL", "TRIGGER_SCAN", "nope"]),
                         st.text(max_size=30)),
    "created_at": st.sampled_from(["2026-11-22T10:00:00+00:00", "2026-11-22T10:00:00",
                                   "yesterday", 5]),
    "sender": st.text(max_size=30),
    "payload": json_values,
}


@st.composite
def envelopes(draw: st.DrawFn) -> bytes:
    """Mostly well-formed envelopes with fields dropped, mistyped or added."""
    doc: dict[str, Any] = {}
    for name in FIELDS:
        if draw(st.integers(0, 9)) > 0:  # keep most fields
            doc[name] = draw(field_values[name])
    if draw(st.booleans()):
        doc[draw(st.text(min_size=1, max_size=8))] = draw(json_values)
    return json.dumps(doc).encode()


bodies = st.one_of(st.binary(max_size=300), envelopes(),
                   json_values.map(lambda v: json.dumps(v).encode()))

master = HandlerRegistry(Paradigm.MASTER)
master.register("SYNCHRONIZE_MODEL", lambda ctx, p: None)
master.register("TRIGGER_SCAN", lambda ctx, p: None)


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(body=bodies, content_type=st.sampled_from([None, "application/json", "text/plain"]))
def test_any_body_is_decoded_and_routed_or_rejected_with_a_reason(
        body: bytes, content_type: str | None) -> None:
    started = time.monotonic()
    try:
        envelope = decode(body, content_type=content_type)
        route = master.resolve(envelope.command)
        route.parse(envelope.payload)
    except EnvelopeError as exc:
        assert exc.reason in ("invalid", "undecodable", "too-large") and str(exc)
    except UnknownCommand as exc:
        assert exc.reason == "unknown-command" and str(exc)
    else:
        assert "id" in json.loads(body) and content_type != "text/plain"
        assert isinstance(envelope.id, uuid.UUID)
    assert time.monotonic() - started < PER_INPUT


def test_a_body_over_the_limit_is_too_large_before_it_is_parsed() -> None:
    big = b"[" + b"1," * MAX_BODY + b"1]"
    started = time.monotonic()
    try:
        decode(big)
    except EnvelopeError as exc:
        assert exc.reason == "too-large"
    assert time.monotonic() - started < PER_INPUT
    deep = b"[" * 100_000 + b"]" * 100_000  # under no limit a parser recursion bomb
    try:
        decode(deep, max_bytes=len(deep))
    except EnvelopeError as exc:
        assert exc.reason in ("undecodable", "invalid")


registry = default_registry()
TYPES = registry.names()
payload_keys = st.sampled_from(["seconds", "sceonds", "message", "conflicts", "ref", "iri",
                                "checksum", "aspect", "generation", "worker", "x"])
payloads = st.dictionaries(payload_keys, json_values, max_size=4)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task_type=st.one_of(st.sampled_from(TYPES), st.text(max_size=20)), payload=payloads)
def test_any_task_payload_is_accepted_or_refused_naming_why(
        task_type: str, payload: dict[str, Any]) -> None:
    started = time.monotonic()
    try:
        registry.validate(task_type, payload)
    except InvalidPayload as exc:
        assert task_type in str(exc) and ":" in str(exc)
    except TaskError as exc:  # unknown type
        assert task_type not in TYPES and "unknown task type" in str(exc)
    else:
        assert not {"sceonds", "x"} & set(payload), "an unknown field was accepted"
    assert time.monotonic() - started < PER_INPUT
