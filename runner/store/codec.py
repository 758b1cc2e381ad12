"""Explicit encodings for values gremlite cannot hold (and a remote server need not guess).

* datetimes: UTC ISO-8601 with microseconds and a ``Z`` (fixed width, so they sort as strings);
* integers beyond 2**62 (fencing tokens are ZooKeeper zxids, up to 2**63): a 20-digit,
  zero-padded decimal string (sorts as strings too);
* lists and dicts: compact JSON strings.

gremlite fails on integers >= 2**62 and has no datetime or list type; see docs/graph.md.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from runner.errors import InvalidValue

_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def encode_time(value: datetime) -> str:
    if value.tzinfo is not UTC:
        if value.tzinfo is None:
            raise InvalidValue(f"naive datetime {value!r}: the store keeps UTC instants only")
        value = value.astimezone(UTC)
    if value.year < 1000:  # strftime's year is not padded to four digits (glibc)
        return value.strftime(_TIME_FORMAT)
    # the same text as strftime(_TIME_FORMAT), at 60% of its cost (a node under load encoded
    # 16 times a task: 4% of its CPU)
    return value.isoformat(timespec="microseconds")[:-6] + "Z"


def decode_time(value: str) -> datetime:
    if len(value) == 27 and value[-1] == "Z":  # ours: fromisoformat is ~10x strptime
        return datetime.fromisoformat(value)
    return datetime.strptime(value, _TIME_FORMAT).replace(tzinfo=UTC)


def encode_big(value: int) -> str:
    if not 0 <= value < 10**20:
        raise InvalidValue(f"{value} is outside the encodable range 0..10**20-1")
    return f"{value:020d}"


def decode_big(value: str) -> int:
    return int(value)


def encode_json(value: Any) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidValue(f"not JSON-serialisable: {exc}") from exc


def decode_json(value: str) -> Any:
    return json.loads(value)


def progress_json(done: int, total: int | None, message: str, at: datetime) -> str:
    """A handler's reported progress as its attempt stores it (``attempt_progress``)."""
    return encode_json({"done": done, "total": total, "message": message[:500],
                        "at": encode_time(at)})


def now() -> datetime:
    return datetime.now(UTC)
