"""The message envelope: one versioned, strictly validated model for every paradigm.

On the wire an envelope is UTF-8 JSON::

    {"v": 1, "id": "<uuid4>", "paradigm": "MASTER", "command": "SYNCHRONIZE_MODEL",
     "created_at": "2026-11-21T10:00:00+00:00", "sender": "host:1234:abcd", "payload": {...}}

``id`` is also the idempotency key: a redelivered message keeps it. :func:`decode` raises
:class:`~messaging.errors.UndecodableMessage` or :class:`~messaging.errors.InvalidEnvelope`, both
poison (dead-lettered with the reason), never a pydantic or json error.
"""

from __future__ import annotations

import enum
import json
import math
import uuid
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from messaging.errors import InvalidEnvelope, MessageTooLarge, UndecodableMessage

SCHEMA_VERSION = 1  # the ``v`` field; bump with a migration when the shape changes
COMMAND_PATTERN = r"^[A-Za-z][A-Za-z0-9_.:-]{0,99}$"


class Paradigm(enum.StrEnum):
    MASTER = "MASTER"
    MODEL = "MODEL"
    API = "API"


class Envelope(BaseModel):
    """One message. Frozen; unknown fields are rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    v: Literal[1] = 1
    id: uuid.UUID = Field(default_factory=uuid.uuid4)
    paradigm: Paradigm
    command: str = Field(pattern=COMMAND_PATTERN)
    created_at: AwareDatetime = Field(default_factory=lambda: datetime.now(UTC))
    sender: str = Field(min_length=1, max_length=300)
    payload: dict[str, Any] = Field(default_factory=dict)

    def encode(self) -> bytes:
        return self.model_dump_json().encode()


MAX_BODY = 256 * 1024  # bytes; a larger body is dead-lettered as "too-large"
JSON_TYPE = "application/json"


def decode(body: bytes, *, content_type: str | None = None, max_bytes: int = MAX_BODY
           ) -> Envelope:
    """Parse and validate a message body; failures are typed poison errors.

    Refused, each with its reason: a body over ``max_bytes`` (:class:`MessageTooLarge`), a
    content type other than JSON, a body that is not UTF-8 JSON, a number JSON has not
    (``NaN``, ``Infinity``, a float past a double's range) or an integer over
    :data:`MAX_INT_DIGITS` digits (:class:`InvalidEnvelope`), an envelope without ``id``
    (the idempotency key: a default would give every redelivery a new one), any field that
    does not validate or is unknown.
    """
    if len(body) > max_bytes:
        raise MessageTooLarge(f"body of {len(body)} bytes is over the limit of {max_bytes}")
    if content_type is not None and content_type.split(";")[0].strip().lower() != JSON_TYPE:
        raise InvalidEnvelope(f"content type {content_type!r} is not {JSON_TYPE}")
    raw = parse_json(body)
    if not isinstance(raw, dict):
        raise InvalidEnvelope(f"body is JSON {type(raw).__name__}, not an object")
    if "id" not in raw:
        raise InvalidEnvelope("id: Field required (the message id is its idempotency key)")
    try:
        # JSON mode: uuid and datetime arrive as strings and are parsed strictly from them
        return Envelope.model_validate_json(body)
    except ValidationError as exc:
        raise InvalidEnvelope(summary(exc)) from exc


def parse_json(data: bytes | str) -> Any:
    """JSON as a message, a payload or a line of input may hold it, read strictly and never
    with an error other than :class:`UndecodableMessage` (not UTF-8 JSON) or
    :class:`InvalidEnvelope` (valid JSON latchwork does not take: nested deeper than
    :data:`MAX_DEPTH`, ``NaN``/``Infinity``, a float past a double, an integer over
    :data:`MAX_INT_DIGITS` digits). Python's own ``json.loads`` raises RecursionError or a
    bare ValueError for some of these, which a caller would not expect."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        value = json.loads(text, parse_int=_json_int, parse_float=_json_float,
                           parse_constant=_json_constant)
    except InvalidEnvelope:
        raise
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError, JSONDecodeError too
        raise UndecodableMessage(f"not valid JSON (it must be UTF-8 JSON): {exc}") from exc
    # counting brackets is C-fast; only a text with many of them is walked
    if text.count("[") + text.count("{") > MAX_DEPTH and depth(value) > MAX_DEPTH:
        raise InvalidEnvelope(f"JSON nested more than {MAX_DEPTH} levels deep")
    return value


#: the deepest nesting of arrays and objects a message or payload may have
MAX_DEPTH = 64


def depth(value: Any) -> int:
    """How deeply ``value``'s lists and dicts nest (0 for a scalar), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item \
            if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, level + 1) for child in children)
    return deepest


#: the longest integer a message may hold, in digits: Python's own limit for converting one
#: (``sys.get_int_max_str_digits``), which a longer one would hit wherever it is read or written
MAX_INT_DIGITS = 4300


def _json_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise InvalidEnvelope(f"a number of {digits} digits is over the limit of "
                              f"{MAX_INT_DIGITS}")
    return int(text)


def _json_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise InvalidEnvelope(f"the number {text[:40]} is too large for a double")
    return value


def _json_constant(name: str) -> float:
    """``NaN``, ``Infinity`` and ``-Infinity``: Python's json reads them, JSON has no such
    values."""
    raise InvalidEnvelope(f"{name} is not a JSON number")


#: pydantic's errors for a value that should have been a mapping ("a valid dictionary or
#: instance of ..."): on the wire and at the command line that is a JSON object
NOT_AN_OBJECT = frozenset({"dict_type", "model_type", "model_attributes_type"})
OBJECT_EXPECTED = "Input should be a JSON object"


def summary(exc: ValidationError, limit: int = 5) -> str:
    """A pydantic error as one line: ``field.path: message; ...`` (the first ``limit``); a
    mapping expected reads "a JSON object", as the docs say it."""
    parts = []
    for err in exc.errors()[:limit]:
        where = ".".join(str(p) for p in err["loc"]) or "(root)"
        message = OBJECT_EXPECTED if err["type"] in NOT_AN_OBJECT else err["msg"]
        parts.append(f"{where}: {message}")
    return "; ".join(parts)


_STRICT: dict[type[BaseModel], type[BaseModel]] = {}


def validate_payload(model: type[BaseModel], payload: Any) -> BaseModel:
    """Validate a payload against ``model``, refusing unknown fields unless the model says
    how to treat them (``extra="allow"`` or ``"forbid"`` in its config): a misspelt field
    (``{"sceonds": 2}``) is an error naming it, never silently ignored. Raises pydantic's
    ValidationError."""
    if model.model_config.get("extra") is None:
        strict = _STRICT.get(model)
        if strict is None:
            strict = _STRICT[model] = type(model.__name__, (model,), {
                "model_config": ConfigDict(**{**model.model_config, "extra": "forbid"})})
        model = strict
    return model.model_validate(payload)
