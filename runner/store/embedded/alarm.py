"""A graph file that cannot be written: what SQLite says then (:func:`unwritable`, which makes
it :class:`~runner.errors.StoreFull`), and :class:`StorageAlarm`, which says so in one warning
line a minute instead of one per refused write. Used by the embedded graph
(:mod:`runner.store.embedded.graph`); nothing here does I/O but its log lines.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path

from runner.errors import StoreFull

log = logging.getLogger("latchwork.store")


#: what SQLite says when the file cannot grow or be written: a full disk, a read-only file or
#: volume, a failing device
UNWRITABLE = ("database or disk is full", "disk i/o error", "readonly database",
              "unable to open database file")


def unwritable(path: Path, exc: sqlite3.Error) -> StoreFull | None:
    text = str(exc).lower()
    if not any(words in text for words in UNWRITABLE):
        return None
    return StoreFull(f"graph file {path}: the disk is full or the file unwritable ({exc}); "
                     "writes are refused until space is freed")


class StorageAlarm:
    """Says that the graph refuses writes for want of space in one warning line a minute
    (with how many were refused), not a line per refused write, and once more when a write
    succeeds again."""

    def __init__(self, path: Path, every: float = 60.0) -> None:
        self.path = path
        self.every = every
        self._lock = threading.Lock()
        self._refused = 0  # since the last line
        self._since: float | None = None  # monotonic time of the first refusal of this spell
        self._said = float("-inf")

    def refused(self, exc: StoreFull) -> None:
        now = time.monotonic()
        with self._lock:
            self._refused += 1
            if self._since is None:
                self._since = now
            if now - self._said < self.every:
                return
            count, self._refused, self._said = self._refused, 0, now
        log.warning("%s (%d write(s) refused since the last line; accepted work waits and is "
                    "retried, new writes answer store_full)", str(exc), count)

    def written(self) -> None:
        if self._since is None:  # the common case: one read of an attribute
            return
        with self._lock:
            since, self._since, self._said = self._since, None, float("-inf")
            self._refused = 0
        if since is not None:
            log.warning("graph file %s is writable again (after %.0fs)", self.path,
                        time.monotonic() - since)
