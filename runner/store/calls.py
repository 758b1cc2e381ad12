"""How many reads and writes a graph ran, and how long they took (:class:`CallStats`): the
node's ``latchwork_store_*`` metrics and the profile of bench/bench_runner.py. Both graph
backends (:mod:`runner.store.embedded.graph`, :mod:`runner.store.server.graph`) keep one."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class CallStats:
    """How many reads and writes a graph ran and how long they took, outermost calls only (a
    write nested in a write is part of it): the node's ``latchwork_store_*`` metrics and the
    profile of bench/bench_runner.py. Thread-safe; costs two clock reads per call."""

    def __init__(self) -> None:
        self.counts = {"read": 0, "write": 0}
        self.seconds = {"read": 0.0, "write": 0.0}
        self._lock = threading.Lock()
        self._local = threading.local()

    @contextmanager
    def timed(self, kind: str) -> Iterator[None]:
        depth = getattr(self._local, "depth", 0)
        if depth:
            yield
            return
        self._local.depth = 1
        began = time.perf_counter()
        try:
            yield
        finally:
            took = time.perf_counter() - began
            self._local.depth = 0
            with self._lock:
                self.counts[kind] += 1
                self.seconds[kind] += took

    def snapshot(self) -> dict[str, float]:
        """``{"reads", "writes", "read_seconds", "write_seconds"}``."""
        with self._lock:
            return {"reads": self.counts["read"], "writes": self.counts["write"],
                    "read_seconds": self.seconds["read"], "write_seconds": self.seconds["write"]}
