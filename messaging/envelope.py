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

from messaging.errors import InvalidEnvelope, UndecodableMessage

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


def decode(body: bytes) -> Envelope:
    """Parse and validate a message body; failures are typed poison errors."""
    try:
        raw = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UndecodableMessage(f"body is not UTF-8 JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise InvalidEnvelope(f"body is JSON {type(raw).__name__}, not an object")
    try:
        # JSON mode: uuid and datetime arrive as strings and are parsed strictly from them
        return Envelope.model_validate_json(body)
    except ValidationError as exc:
        raise InvalidEnvelope(_summary(exc)) from exc


def _summary(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "(root)"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)
