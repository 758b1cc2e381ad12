"""``ctx.progress(done, total, message)``: what a handler reports, written to its attempt.

A report never waits for the store: the write goes to the node's progress writer (one thread
per node, :class:`ProgressWriter`), so a handler that reports pays nothing for it. Writes are
throttled to one per ``interval`` seconds (the first report and a report of ``done >= total``
are sent at once); a report made inside the interval is kept and sent by the next report after
it. When the handler returns, the last report not known to be written is handed to the
attempt's end (:meth:`ProgressReporter.close`), which writes it in the same write: the last
value always wins, and a report costs the end of its attempt no write of its own. The value
lives on the attempt (``task show``, ``task list`` and ``latchwork top`` read it), never on
the task, so reporting moves no version or fence.

Failure behaviour: a write refused because the attempt has ended (someone else closed it)
cancels the handler's token while it runs (once closed, a refusal means only that the end was
written first, and changes nothing); a store error is logged and the report dropped (the next
one, or the end, carries a later one), never raised into the handler.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

from runner.errors import StoreError
from runner.store import Store, codec
from runner.tasks.context import CancelToken

log = logging.getLogger("latchwork.tasks")


@dataclass(frozen=True)
class _Report:
    done: int
    total: int | None
    message: str
    at: datetime


class ProgressWriter:
    """The node's one thread that writes progress reports (oldest first)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="progress-writer")

    def send(self, reporter: ProgressReporter) -> None:
        try:
            self._pool.submit(reporter.write_latest)
        except RuntimeError:  # closed: the attempt's end carries the report
            pass

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class ProgressReporter:
    def __init__(self, store: Store, attempt_id: str, cancel: CancelToken,
                 interval: float = 1.0, writer: ProgressWriter | None = None) -> None:
        self.store = store
        self.attempt_id = attempt_id
        self.cancel = cancel
        self.interval = interval
        self.writer = writer
        self._lock = threading.Lock()
        self._sent_at: float | None = None
        self._latest: _Report | None = None  # the last report made
        self._sent: _Report | None = None  # the last one handed to the writer
        self._written: _Report | None = None  # the last one known written
        self._closed = False

    def report(self, done: int, total: int | None = None, message: str = "") -> None:
        if done < 0 or (total is not None and total < 0):
            raise ValueError(f"progress must not be negative: {done}/{total}")
        report = _Report(int(done), None if total is None else int(total), str(message),
                         codec.now())
        with self._lock:
            if self._closed:
                return
            self._latest = report
            now = time.monotonic()
            final = report.total is not None and report.done >= report.total
            due = self._sent_at is None or now - self._sent_at >= self.interval
            if not (due or final):
                return  # kept: the next report after it, or the end, sends it
            self._sent_at = now
            self._sent = report
        if self.writer is None:
            self.write_latest()
        else:
            self.writer.send(self)

    def write_latest(self) -> None:
        """Write the last report sent, unless a later write or the end has it already."""
        with self._lock:
            report = self._sent
            if report is None or report is self._written or self._closed:
                return
        try:
            written = self.store.attempts.progress(self.attempt_id, report.done, report.total,
                                                   report.message)
        except StoreError as exc:
            log.warning("attempt %s: progress not recorded: %s", self.attempt_id, exc)
            return
        with self._lock:
            if written:
                self._written = report
                return
            if self._closed:
                return  # the end was written first: it carries the last report
        self.cancel.cancel("its attempt was closed by someone else")

    def close(self) -> str | None:
        """The handler returned: no more writes; the last report not known written, as the
        attempt's end writes it (``progress_json``), or None."""
        with self._lock:
            self._closed = True
            report = self._latest
            if report is None or report is self._written:
                return None
        return codec.progress_json(report.done, report.total, report.message, report.at)
