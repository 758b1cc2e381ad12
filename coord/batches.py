"""Sequential batch transactions: a stream cut into gap-free batches that many workers process.

A *series* covers positions ``[0, end)`` of a stream (``end`` may be unknown at first). Workers
call :meth:`BatchCoordinator.start_batch`; it first hands out a batch to retry (aborted, or
IN_PROGRESS past its deadline), otherwise creates the next batch right after the last one, so the
batches always form a gap-free, non-overlapping sequence. A worker renews its batch's timeout
while it works, then finishes or aborts it. An aborted or timed-out batch is retried by whoever
asks next; after ``max_attempts`` failed attempts of one batch the series is FAILED with the
reasons. The last batch may be created open-ended (no end yet) and closed once, never reopened;
no batch is created after it until it is closed.

Every change is one compare-and-set of the series document through :class:`VersionedRegister`
(``series/<id>/state``): racing workers re-read and re-decide, so they never create overlapping
or missing batches, and a CAS repeated after a lost reply is recognised as the caller's own.
The whole history lives in that document, so :meth:`history` is one read. ZooKeeper caps a node
at ~1 MB, about 5,000 batches: size the batches so a series stays well below that
(:class:`SeriesTooLarge` is raised before the limit).

Failure behaviour: a worker killed -9 stops renewing; its batch passes its deadline and is
handed to the next caller (the old owner's later finish/renew raises :class:`BatchLost`).
Connection loss during a call raises :class:`~coord.errors.ConnectionLost` (retried inside for
up to 30 s first). Deadlines are wall-clock times: the nodes' clocks must be synchronised
(NTP) to well below the batch timeout.

Why one module: every change of a series is a pure ``decide(state) -> (new, result)`` applied
by one CAS in :meth:`BatchCoordinator._update`; the decisions and the one place they are
applied belong together (the series data itself is in :mod:`coord.series`).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from coord.errors import VersionConflict
from coord.register import VersionedRegister
from coord.series import (
    MAX_DOCUMENT_BYTES,
    Batch,
    BatchClosed,
    BatchError,
    BatchLost,
    BatchState,
    InvalidBatch,
    SeriesFailed,
    SeriesNotFound,
    SeriesState,
    SeriesStatus,
    SeriesTooLarge,
)
from coord.session import Session


class BatchCoordinator:
    """The batches of one series (``series/<series_id>/state`` under the cluster root).

    ``timeout``: seconds a batch stays IN_PROGRESS without a renewal. ``max_in_progress``:
    batches running at once, new and retried. ``max_retrying``: of those, how many may be retries
    (so a poison batch cannot occupy every worker). ``max_attempts``: attempts per batch before
    the series is FAILED.
    """

    def __init__(self, session: Session, series_id: str, *, timeout: float = 60.0,
                 max_in_progress: int = 8, max_retrying: int = 2, max_attempts: int = 3,
                 clock: Callable[[], float] = time.time) -> None:
        if not series_id or "/" in series_id:
            raise InvalidBatch(f"invalid series id {series_id!r}")
        if timeout <= 0 or max_in_progress < 1 or max_retrying < 1 or max_attempts < 1:
            raise InvalidBatch("timeout and limits must be positive")
        self.series_id = series_id
        self.timeout = timeout
        self.max_in_progress = max_in_progress
        self.max_retrying = max_retrying
        self.max_attempts = max_attempts
        self.clock = clock
        self.register = VersionedRegister(session, f"/series/{series_id}/state")

    # -- reads ------------------------------------------------------------------------------

    def status(self) -> SeriesStatus:
        value, _ = self.register.get()
        if value is None:
            raise SeriesNotFound(f"no series {self.series_id}")
        return SeriesStatus.from_json(value)

    def exists(self) -> bool:
        return self.register.get()[0] is not None

    def history(self) -> list[Batch]:
        """Every batch of the series in position order, with its attempts and errors."""
        return list(self.status().batches)

    # -- changes ----------------------------------------------------------------------------

    def create(self, end: int | None = None, meta: Mapping[str, Any] | None = None
               ) -> SeriesStatus:
        """Create the series (idempotent: an existing series is returned unchanged)."""
        if end is not None and end < 0:
            raise InvalidBatch(f"series end {end} < 0")
        value, _ = self.register.get()
        while value is None:
            doc = self._maybe_complete(SeriesStatus(self.series_id, SeriesState.OPEN, end,
                                                    self.clock(), meta=dict(meta or {})))
            try:
                self.register.compare_and_set(-1, doc.to_json())
                return doc
            except VersionConflict:
                value, _ = self.register.get()
        return SeriesStatus.from_json(value)

    def start_batch(self, owner: str, size: int | None) -> Batch | None:
        """A batch for ``owner`` to process, or None when there is nothing to start now.

        A retry comes first (lowest position first); otherwise a new batch of ``size``
        positions after the last one (``size=None``: open-ended, closed later with
        :meth:`close_batch` or :meth:`finish`). None means: every position is handed out, the
        last batch is open-ended and not closed, or a limit is reached; check
        :meth:`status` to tell a finished series from a busy one. Raises
        :class:`SeriesFailed` once the series failed.
        """
        if size is not None and size < 1:
            raise InvalidBatch(f"batch size {size} < 1")

        def decide(s: SeriesStatus) -> tuple[SeriesStatus | None, Batch | BatchError | None]:
            if s.state is SeriesState.FAILED:
                raise SeriesFailed(s.id, list(s.failure))
            if s.state is SeriesState.COMPLETED:
                return None, None
            now = self.clock()
            running = [b for b in s.batches
                       if b.state is BatchState.IN_PROGRESS and b.deadline > now]
            if len(running) >= self.max_in_progress:
                return None, None
            retryable = [b for b in s.batches if b.state is BatchState.ABORTED
                         or (b.state is BatchState.IN_PROGRESS and b.deadline <= now)]
            retrying = sum(1 for b in running if b.attempt > 1)
            if retryable and retrying < self.max_retrying:
                old = retryable[0]
                errors, failures = old.errors, old.failures
                if old.state is BatchState.IN_PROGRESS:  # timed out: that attempt failed
                    errors = (*errors, f"attempt {old.attempt} by {old.owner} timed out")
                    failures += 1
                if failures >= self.max_attempts:
                    failed = replace(old, state=BatchState.ABORTED, errors=errors,
                                     failures=failures)
                    s = self._fail(s, failed)
                    return s, SeriesFailed(s.id, list(s.failure))
                batch = replace(old, state=BatchState.IN_PROGRESS, owner=owner,
                                attempt=old.attempt + 1, deadline=now + self.timeout,
                                started_at=now, finished_at=None, rows=0, errors=errors,
                                failures=failures)
                return self._put(s, batch), batch
            last = s.batches[-1] if s.batches else None
            if last is not None and last.end is None:
                return None, None  # the open-ended batch must be closed first
            start = last.end if last is not None and last.end is not None else 0
            if s.end is not None and start >= s.end:
                return None, None
            end = None if size is None else start + size
            if s.end is not None:
                end = s.end if end is None else min(end, s.end)
            batch = Batch(s.id, len(s.batches), start, end, BatchState.IN_PROGRESS, owner, 1,
                          now + self.timeout, now)
            return replace(s, batches=(*s.batches, batch)), batch

        result: Batch | None = self._update(decide)
        return result

    def renew(self, batch: Batch) -> Batch:
        """Push the batch's deadline ``timeout`` seconds ahead; :class:`BatchLost` if not ours."""
        def decide(s: SeriesStatus) -> tuple[SeriesStatus | None, Batch]:
            current = self._owned(s, batch)
            renewed = replace(current, deadline=self.clock() + self.timeout)
            return self._put(s, renewed), renewed
        result: Batch = self._update(decide)
        return result

    def close_batch(self, batch: Batch, end: int, last: bool = False) -> Batch:
        """Give an open-ended batch its end, once; ``last``: the stream ends there too."""
        def decide(s: SeriesStatus) -> tuple[SeriesStatus | None, Batch]:
            current = self._owned(s, batch)
            closed = self._closed(current, end)
            s = self._put(s, closed)
            if last:
                s = self._set_end(s, closed)
            return s, closed
        result: Batch = self._update(decide)
        return result

    def finish(self, batch: Batch, rows: int = 0, end: int | None = None,
               last: bool = False) -> Batch:
        """Mark the batch FINISHED (closing it at ``end`` if it is open-ended)."""
        def decide(s: SeriesStatus) -> tuple[SeriesStatus | None, Batch]:
            current = self._owned(s, batch)
            if current.end is None:
                if end is None:
                    raise InvalidBatch(f"batch {batch.no} is open-ended: finish it with an end")
                current = self._closed(current, end)
            elif end is not None and end != current.end:
                raise BatchClosed(f"batch {batch.no} ends at {current.end}, not {end}")
            done = replace(current, state=BatchState.FINISHED, finished_at=self.clock(),
                           rows=rows)
            s = self._put(s, done)
            if last:
                s = self._set_end(s, done)
            return self._maybe_complete(s), done
        result: Batch = self._update(decide)
        return result

    def abort(self, batch: Batch, reason: str, count: bool = True) -> Batch:
        """Give the batch up; it is retried later, or the series FAILS after max_attempts
        failed attempts. ``count=False``: the attempt did not fail (its worker was cancelled,
        e.g. on shutdown); it is retried without counting against the limit."""
        def decide(s: SeriesStatus) -> tuple[SeriesStatus | None, Batch]:
            current = self._owned(s, batch)
            aborted = replace(current, state=BatchState.ABORTED, finished_at=self.clock(),
                              errors=(*current.errors,
                                      f"attempt {current.attempt} by {current.owner}: "
                                      f"{reason}"[:500]),
                              failures=current.failures + (1 if count else 0))
            if aborted.failures >= self.max_attempts:
                return self._fail(s, aborted), aborted
            return self._put(s, aborted), aborted
        result: Batch = self._update(decide)
        return result

    def set_end(self, end: int) -> SeriesStatus:
        """The stream's end became known: no batch beyond ``end`` is created.

        Refused (:class:`InvalidBatch`) while the last batch is open-ended or ends beyond ``end``.
        """
        def decide(s: SeriesStatus) -> tuple[SeriesStatus | None, SeriesStatus]:
            if s.end is not None:
                if s.end != end:
                    raise BatchClosed(f"series {s.id} ends at {s.end} already")
                return None, s
            if s.batches and s.batches[-1].end is None:
                raise InvalidBatch(f"series {s.id} has an open-ended batch: close it first")
            last_end = max((b.end or b.start for b in s.batches), default=0)
            if end < last_end:
                raise InvalidBatch(f"end {end} is before batch positions up to {last_end}")
            updated = self._maybe_complete(replace(s, end=end))
            return updated, updated
        result: SeriesStatus = self._update(decide)
        return result

    # -- internals --------------------------------------------------------------------------

    def _owned(self, s: SeriesStatus, batch: Batch) -> Batch:
        if s.state is SeriesState.FAILED:
            raise SeriesFailed(s.id, list(s.failure))
        if batch.no >= len(s.batches):
            raise BatchLost(f"series {s.id} has no batch {batch.no}")
        current = s.batches[batch.no]
        if (current.state is not BatchState.IN_PROGRESS or current.owner != batch.owner
                or current.attempt != batch.attempt):
            raise BatchLost(f"batch {batch.no} of {s.id} is no longer attempt {batch.attempt} "
                            f"of {batch.owner} (now {current.state.value}, attempt "
                            f"{current.attempt} of {current.owner})")
        return current

    @staticmethod
    def _closed(current: Batch, end: int) -> Batch:
        if current.end is not None:
            raise BatchClosed(f"batch {current.no} is closed at {current.end} already")
        if end < current.start:
            raise InvalidBatch(f"end {end} before the batch's start {current.start}")
        return replace(current, end=end)

    @staticmethod
    def _put(s: SeriesStatus, batch: Batch) -> SeriesStatus:
        batches = list(s.batches)
        batches[batch.no] = batch
        return replace(s, batches=tuple(batches))

    @staticmethod
    def _set_end(s: SeriesStatus, batch: Batch) -> SeriesStatus:
        if batch.no != len(s.batches) - 1:
            raise InvalidBatch(f"batch {batch.no} is not the last batch of {s.id}")
        if s.end is not None and s.end != batch.end:
            raise BatchClosed(f"series {s.id} ends at {s.end} already")
        return replace(s, end=batch.end)

    @staticmethod
    def _maybe_complete(s: SeriesStatus) -> SeriesStatus:
        if s.end is not None and s.covered >= s.end:
            return replace(s, state=SeriesState.COMPLETED)
        return s

    def _fail(self, s: SeriesStatus, batch: Batch) -> SeriesStatus:
        reasons = (*s.failure, f"batch {batch.no} [{batch.start}, {batch.end}) failed "
                               f"{batch.failures} times", *batch.errors[-self.max_attempts:])
        return replace(self._put(s, batch), state=SeriesState.FAILED, failure=reasons)

    def _update(self, decide: Callable[[SeriesStatus], tuple[SeriesStatus | None, Any]]) -> Any:
        """Read, decide, compare-and-set; on a conflict, re-read and decide again."""
        delay = 0.005
        while True:
            value, version = self.register.get()
            if value is None:
                raise SeriesNotFound(f"no series {self.series_id}")
            new, result = decide(SeriesStatus.from_json(value))
            if new is None:
                return result
            doc = new.to_json()
            if len(json.dumps(doc)) > MAX_DOCUMENT_BYTES:
                raise SeriesTooLarge(f"series {self.series_id} has {len(new.batches)} batches; "
                                     "its document would exceed ZooKeeper's node size")
            try:
                self.register.compare_and_set(version, doc)
            except VersionConflict:
                time.sleep(random.uniform(0, delay))
                delay = min(delay * 2, 0.2)
                continue
            if isinstance(result, BatchError):
                raise result  # a decision that is written first, then reported (series FAILED)
            return result


__all__ = [
    "BatchCoordinator",
    "Batch",
    "BatchClosed",
    "BatchError",
    "BatchLost",
    "BatchState",
    "InvalidBatch",
    "SeriesFailed",
    "SeriesNotFound",
    "SeriesState",
    "SeriesStatus",
    "SeriesTooLarge",
    "MAX_DOCUMENT_BYTES",
]
