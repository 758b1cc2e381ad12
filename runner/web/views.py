"""What the console's pages compute from the client's views: the task list's query box, an
attempt timeline, ages and durations. Pure functions; no I/O.

The query box, in the style of Flower's: space-separated ``key:value`` terms, each a filter
the node answers from an index (``type:billing.sync state:stopped owner:<member>
key:<ordering key> resource:<name>``); a term without a key that is a task id opens that task.
A key given twice means any of its values (``type:a type:b``: a task of either type), except
``resource`` (one per query: each resource is an index of its own), which says so.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from runner.errors import WebQueryInvalid
from runner.replies import SHOWN, AttemptView, CheckpointValue, ResultValue, TaskView

#: the words a ``state:`` term takes (runner.store.model.TaskState; ``finished`` and
#: ``stopped``, the words before store format 5, too)
STATES = ("waiting", "delayed", "running", "succeeded", "failed", "cancelled", "skipped",
          "finished", "stopped")
#: query key -> the client's filter argument
KEYS = {"type": "type", "state": "state", "owner": "owner", "key": "ordering_key",
        "resource": "resource"}
STATUS_CLASS = {"RUNNING": "running", "SUCCEEDED": "ok", "FAILED": "failed",
                "CANCELLED_BY_SYSTEM": "system", "CANCELLED": "cancelled", "TIMED_OUT": "timedout"}


#: the query box holds a term the console does not know
QueryError = WebQueryInvalid


@dataclass
class Query:
    #: the client's filter argument -> its values (any of them)
    filters: dict[str, tuple[str, ...]] = field(default_factory=dict)
    resource: str | None = None  # one at most
    task_id: str | None = None

    def get(self, key: str) -> tuple[str, ...] | None:
        return self.filters.get(key)


def parse_query(text: str) -> Query:
    """``type:x state:y ...`` into filters (:class:`QueryError` naming a bad term)."""
    query = Query()
    for term in text.split():
        key, sep, value = term.partition(":")
        if not sep:
            try:
                uuid.UUID(term)
            except ValueError:
                raise QueryError(f"{term!r} is neither key:value nor a task id (keys: "
                                 f"{', '.join(KEYS)})") from None
            query.task_id = term
            continue
        if key not in KEYS:
            raise QueryError(f"unknown key {key!r} (keys: {', '.join(KEYS)})")
        if not value:
            raise QueryError(f"{key}: needs a value")
        if key == "state" and value not in STATES:
            raise QueryError(f"state:{value}: one of {', '.join(STATES)}")
        if key == "resource":
            if query.resource is not None and query.resource != value:
                raise QueryError("resource: give one (each resource is an index of its own, "
                                 "so a list is asked for one resource at a time)")
            query.resource = value
            continue
        had = query.filters.get(KEYS[key], ())
        query.filters[KEYS[key]] = tuple(dict.fromkeys((*had, value)))  # any of them
    return query


def task_state(task: TaskView) -> str:
    """The task's one state, as its reply says it (TaskView.state)."""
    return task.state


def age(since: datetime | None, now: datetime | None = None) -> str:
    if since is None:
        return ""
    seconds = max(0.0, ((now or datetime.now(UTC)) - since).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:.0f}s" if seconds >= 1 else f"{seconds * 1000:.0f}ms"


def checkpoint(task: TaskView, now: datetime | None = None) -> str:
    """What a page shows of a task's last checkpoint: its size and age ("" when none)."""
    cp = task.checkpoint
    if cp is None:
        return ""
    size = f"{cp.size} B" if cp.size < 1024 else f"{cp.size / 1024:.1f} KiB"
    return f"{size}, {age(cp.at, now)} ago (attempt {cp.seq})"


def shown_checkpoint(found: CheckpointValue | None) -> str | None:
    """A checkpoint's value as the task page shows it (:func:`shown_json`)."""
    if found is None or not found.present:
        return None
    return shown_json(found.value, found.size,
                      f"latchwork task show {found.task_id} --checkpoint --json")


def shown_result(found: ResultValue | None) -> str | None:
    """A task's result as its page shows it (:func:`shown_json`)."""
    if found is None or not found.present:
        return None
    return shown_json(found.value, found.size, f"latchwork task result {found.task_id} --json")


def shown_json(value: object, size: int, whole: str) -> str:
    """``value`` as a page shows it: its JSON, the first :data:`~runner.replies.SHOWN` bytes,
    said so when cut, naming the command (``whole``) that shows all of it."""
    text = json.dumps(value, indent=2, sort_keys=True)
    if len(text.encode()) <= SHOWN:
        return text
    return (text.encode()[:SHOWN].decode(errors="ignore")
            + f"\n... (the first {SHOWN // 1024} KiB of {size} bytes; `{whole}` shows all of it)")


def duration(ms: int | None) -> str:
    if ms is None:
        return ""
    return f"{ms / 1000:.1f} s" if ms >= 1000 else f"{ms} ms"


@dataclass(frozen=True)
class Bar:
    attempt: AttemptView
    left: float  # percent of the timeline
    width: float
    css: str


def timeline(attempts: list[AttemptView], now: datetime | None = None) -> list[Bar]:
    """One bar per attempt on a common time axis (the first start to the last end, or now for
    a running one); at least 0.5% wide, so an instant attempt still shows."""
    if not attempts:
        return []
    now = now or datetime.now(UTC)
    start = min(a.started_at for a in attempts)
    end = max((a.ended_at or now) for a in attempts)
    span = max((end - start).total_seconds(), 1e-3)
    bars = []
    for a in attempts:
        left = (a.started_at - start).total_seconds() / span * 100
        width = ((a.ended_at or now) - a.started_at).total_seconds() / span * 100
        bars.append(Bar(a, round(min(left, 99.5), 2), round(max(width, 0.5), 2),
                        STATUS_CLASS.get(a.status, "other")))
    return bars


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def schema_fields(schema: dict[str, Any] | None) -> list[tuple[str, str, bool]]:
    """(name, type, required) of a payload JSON schema's top-level fields."""
    if not schema:
        return []
    required = set(schema.get("required", []))
    return [(name, str(spec.get("type", spec.get("anyOf", "any"))), name in required)
            for name, spec in (schema.get("properties") or {}).items()]
