"""A node's logging: every record carries the member id and, inside an attempt, the task and
attempt ids; ``text`` (one line per record) or ``json`` (one JSON object per line), to stderr or
a file.

The member id is set once per process (:func:`set_member`); the task and attempt ids are bound
for the duration of an attempt on the worker thread that runs it (:func:`attempt_context`), so
a handler's own log records carry them too. A log file that cannot be opened fails the start
with the reason (:func:`configure`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from pathlib import Path

_task: ContextVar[str | None] = ContextVar("latchwork_task", default=None)
_attempt: ContextVar[str | None] = ContextVar("latchwork_attempt", default=None)
_member: list[str | None] = [None]  # one per process, read by every thread

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def set_member(member_id: str | None) -> None:
    _member[0] = member_id


@contextmanager
def attempt_context(task_id: str, attempt_id: str) -> Iterator[None]:
    """Bind the task and attempt ids to the log records of this thread for the ``with``."""
    task_token, attempt_token = _task.set(task_id), _attempt.set(attempt_id)
    try:
        yield
    finally:
        _attempt.reset(attempt_token)
        _task.reset(task_token)


#: the stable names of the events operators watch: a JSON record of one carries ``"event"``,
#: so watching for them does not depend on the wording of a message
EVENTS = frozenset({
    "session.connected", "session.suspended", "session.lost",  # the node's ZooKeeper session
    "master.gained", "master.lost",  # this node became master, or stopped being it
    "attempt.started", "attempt.ended",  # an attempt of a task on this node (with "status")
    "lock.freed",  # the master freed the task lock of a member that is gone
})


def event(name: str, **fields: object) -> dict[str, object]:
    """The ``extra`` of a log call that records the event ``name`` (one of :data:`EVENTS`),
    with ``fields`` (e.g. ``status``) added to its JSON record."""
    if name not in EVENTS:
        raise ValueError(f"unknown log event {name!r}")
    return {"event": name, "event_fields": fields}


class ContextFilter(logging.Filter):
    """Adds ``member``, ``task`` and ``attempt`` to every record (None when unknown)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.member = _member[0]
        record.task = _task.get()
        record.attempt = _attempt.get()
        return True


class ReportedElsewhere(logging.Filter):
    """Leaves out what is reported elsewhere already: a record about an exception whose class
    says ``reported = True`` (a full graph: :class:`~runner.errors.StoreFull`, which the
    graph's storage alarm says once a minute) is dropped below ERROR, and an ERROR keeps its
    line but not the traceback. So a full disk is one warning a minute, not a line per
    refused write."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        args = record.args if isinstance(record.args, tuple) else ()
        if not any(getattr(v, "reported", False) is True for v in (exc, *args)):
            return True
        if record.levelno < logging.ERROR:
            return False
        record.exc_info, record.exc_text = None, None
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, member, task, attempt, the
    event's stable name and fields when the record is one of :data:`EVENTS`, and the
    exception's traceback as ``exc`` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname, "logger": record.name, "message": record.getMessage(),
            "member": getattr(record, "member", None), "task": getattr(record, "task", None),
            "attempt": getattr(record, "attempt", None),
        }
        name = getattr(record, "event", None)
        if name is not None:
            doc["event"] = name
            doc.update(getattr(record, "event_fields", {}))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def configure(level: str = "INFO", fmt: str = "text", file: Path | None = None) -> None:
    """Replace the root logger's handlers with one that writes ``fmt`` to ``file`` (stderr when
    None); raises OSError when the file cannot be opened."""
    handler: logging.Handler = (logging.FileHandler(file, encoding="utf-8") if file is not None
                                else logging.StreamHandler())
    handler.addFilter(ContextFilter())
    handler.addFilter(ReportedElsewhere())
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
