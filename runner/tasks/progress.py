"""``ctx.progress(done, total, message)``: what a handler reports, written to its attempt.

Writes are throttled to one per ``interval`` seconds (the first report and a report of
``done >= total`` are written at once); a report made inside the interval is kept and written
by the next report after it or when the attempt ends (:meth:`ProgressReporter.flush`), so the
last value always wins. The value lives on the attempt (``task show``, ``task list`` and
``latchwork top`` read it), never on the task, so reporting moves no version or fence.

Failure behaviour: a write refused because the attempt has ended (someone else closed it)
cancels the handler's token; a store error is logged and the report dropped (the next one is
tried), never raised into the handler.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from runner.errors import StoreError
from runner.store import GraphStore
from runner.tasks.context import CancelToken

log = logging.getLogger("latchwork.tasks")


@dataclass(frozen=True)
class _Report:
    done: int
    total: int | None
    message: str


class ProgressReporter:
    def __init__(self, store: GraphStore, attempt_id: str, cancel: CancelToken,
                 interval: float = 1.0) -> None:
        self.store = store
        self.attempt_id = attempt_id
        self.cancel = cancel
        self.interval = interval
        self._lock = threading.Lock()
        self._written_at: float | None = None
        self._pending: _Report | None = None

    def report(self, done: int, total: int | None = None, message: str = "") -> None:
        if done < 0 or (total is not None and total < 0):
            raise ValueError(f"progress must not be negative: {done}/{total}")
        report = _Report(int(done), None if total is None else int(total), str(message))
        with self._lock:
            now = time.monotonic()
            final = report.total is not None and report.done >= report.total
            due = self._written_at is None or now - self._written_at >= self.interval
            if not (due or final):
                self._pending = report
                return
            self._pending = None
            self._written_at = now
        self._write(report)

    def flush(self) -> None:
        """Write the report kept back by the throttle, if any."""
        with self._lock:
            report, self._pending = self._pending, None
        if report is not None:
            self._write(report)

    def _write(self, report: _Report) -> None:
        try:
            written = self.store.attempts.progress(self.attempt_id, report.done, report.total,
                                                   report.message)
        except StoreError as exc:
            log.warning("attempt %s: progress not recorded: %s", self.attempt_id, exc)
            return
        if not written:
            self.cancel.cancel("its attempt was closed by someone else")
