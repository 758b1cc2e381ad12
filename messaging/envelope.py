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
    content type other than JSON, a body that is not UTF-8 JSON, an envelope without ``id``
    (the idempotency key: a default would give every redelivery a new one), any field that
    does not validate or is unknown.
    """
    if len(body) > max_bytes:
        raise MessageTooLarge(f"body of {len(body)} bytes is over the limit of {max_bytes}")
    if content_type is not None and content_type.split(";")[0].strip().lower() != JSON_TYPE:
        raise InvalidEnvelope(f"content type {content_type!r} is not {JSON_TYPE}")
    try:
        raw = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise UndecodableMessage(f"body is not UTF-8 JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise InvalidEnvelope(f"body is JSON {type(raw).__name__}, not an object")
    if "id" not in raw:
        raise InvalidEnvelope("id: Field required (the message id is its idempotency key)")
    try:
        # JSON mode: uuid and datetime arrive as strings and are parsed strictly from them
        return Envelope.model_validate_json(body)
    except ValidationError as exc:
        raise InvalidEnvelope(summary(exc)) from exc


def summary(exc: ValidationError, limit: int = 5) -> str:
    """A pydantic error as one line: ``field.path: message; ...`` (the first ``limit``)."""
    parts = []
    for err in exc.errors()[:limit]:
        where = ".".join(str(p) for p in err["loc"]) or "(root)"
        parts.append(f"{where}: {err['msg']}")
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
