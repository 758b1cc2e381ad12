"""Late deletes: our own ephemeral nodes whose delete failed while their session lived.

A release retries through connection loss for a while (``retry_policy``), but it can still
fail: a ZooKeeper leader election longer than its retries, an error of the release itself.
Its caller cannot wait (a group commit, a worker freeing its slot), and the node must not stay:
a live session keeps an ephemeral node for as long as it lives, so a lock released by nobody
is held by a live member for ever (the master reaps only locks of members that are gone).

So the delete is handed here and tried again, with backoff, on one thread for the process,
until it is done or the session that made the node is gone (then the node went with it). A
delete of a node already gone is done (each ``remove`` treats NoNode as released)."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from coord.session import Session, SessionState

log = logging.getLogger(__name__)

#: the first try again after this many seconds; doubled each time, up to :data:`MAX_DELAY`
FIRST_DELAY = 0.2
MAX_DELAY = 5.0


@dataclass(order=True)
class _Due:
    at: float
    seq: int
    session: Session = field(compare=False)
    session_id: int | None = field(compare=False)
    remove: Callable[[], None] = field(compare=False)
    what: str = field(compare=False)
    delay: float = field(compare=False, default=FIRST_DELAY)


class _LateDeletes:
    def __init__(self) -> None:
        self._heap: list[_Due] = []
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, session: Session, session_id: int | None, remove: Callable[[], None],
            what: str) -> None:
        with self._cond:
            heapq.heappush(self._heap, _Due(time.monotonic() + FIRST_DELAY, next(self._seq),
                                            session, session_id, remove, what))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="coord-late-deletes")
                self._thread.start()
            self._cond.notify()

    def pending(self) -> int:
        with self._cond:
            return len(self._heap)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0].at > time.monotonic():
                    self._cond.wait(None if not self._heap
                                    else self._heap[0].at - time.monotonic())
                item = heapq.heappop(self._heap)
            self._try(item)

    def _try(self, item: _Due) -> None:
        session = item.session
        if session.expired(item.session_id):
            log.info("%s: went with its session 0x%x", item.what, item.session_id or 0)
            return
        if session.state is SessionState.CONNECTED:
            try:
                item.remove()
            except Exception as exc:
                log.info("%s: deleting it failed again (%s); trying again in %.1fs",
                         item.what, exc, item.delay)
            else:
                log.info("%s: released late", item.what)
                return
        with self._cond:
            item.at, item.seq = time.monotonic() + item.delay, next(self._seq)
            item.delay = min(MAX_DELAY, item.delay * 2)
            heapq.heappush(self._heap, item)
            self._cond.notify()


_late = _LateDeletes()


def delete_later(session: Session, session_id: int | None, remove: Callable[[], None],
                 what: str) -> None:
    """Try ``remove`` again later (see the module) while ``session_id`` is ``session``'s
    session; ``what`` names it in the log."""
    log.warning("%s: its delete failed; trying again while the session lives", what)
    _late.add(session, session_id, remove, what)


def late_deletes_pending() -> int:
    """Late deletes not done yet."""
    return _late.pending()
