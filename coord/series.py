"""The data of a batch series: its batches, states and errors (no I/O here).

A :class:`SeriesStatus` is the whole series document kept in ZooKeeper by
:class:`~coord.batches.BatchCoordinator`; a :class:`Batch` is one ``[start, end)`` range of the
stream with its owner, deadline, attempts and reasons. JSON in and out; a document that does not
fit in a ZooKeeper node raises :class:`SeriesTooLarge` before it is written.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from coord.errors import CoordError

MAX_DOCUMENT_BYTES = 900_000  # below ZooKeeper's default jute.maxbuffer (1 MB)


class BatchError(CoordError):
    """Root of the batch coordinator's errors."""


class SeriesNotFound(BatchError, LookupError):
    """No series with this id was created."""


class SeriesFailed(BatchError):
    """The series is FAILED: a batch failed ``max_attempts`` times. ``reasons`` lists why."""

    def __init__(self, series: str, reasons: list[str]) -> None:
        super().__init__(f"series {series} failed: " + "; ".join(reasons[-3:]))
        self.series = series
        self.reasons = reasons


class BatchLost(BatchError):
    """The batch is no longer this worker's (timed out and taken over, or already ended)."""


class BatchClosed(BatchError):
    """An open-ended batch was closed already; its end never changes."""


class InvalidBatch(BatchError, ValueError):
    """Positions that would leave a gap or an overlap, or a size below 1."""


class SeriesTooLarge(BatchError):
    """The series document would exceed ZooKeeper's node size; use larger batches."""


class BatchState(enum.StrEnum):
    IN_PROGRESS = "IN_PROGRESS"
    FINISHED = "FINISHED"
    ABORTED = "ABORTED"


class SeriesState(enum.StrEnum):
    OPEN = "OPEN"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


@dataclass(frozen=True)
class Batch:
    series: str
    no: int
    start: int
    end: int | None  # None: open-ended, not closed yet
    state: BatchState
    owner: str
    attempt: int  # 1 for the first attempt, +1 per retry
    deadline: float
    started_at: float
    finished_at: float | None = None
    rows: int = 0
    errors: tuple[str, ...] = ()
    failures: int = 0  # failed attempts (aborts that count, timeouts)

    @property
    def open_ended(self) -> bool:
        return self.end is None

    def to_json(self) -> dict[str, Any]:
        return {"no": self.no, "start": self.start, "end": self.end, "state": self.state.value,
                "owner": self.owner, "attempt": self.attempt, "deadline": self.deadline,
                "started_at": self.started_at, "finished_at": self.finished_at,
                "rows": self.rows, "errors": list(self.errors), "failures": self.failures}

    @classmethod
    def from_json(cls, series: str, d: Mapping[str, Any]) -> Batch:
        return cls(series=series, no=d["no"], start=d["start"], end=d["end"],
                   state=BatchState(d["state"]), owner=d["owner"], attempt=d["attempt"],
                   deadline=d["deadline"], started_at=d["started_at"],
                   finished_at=d["finished_at"], rows=d["rows"], errors=tuple(d["errors"]),
                   failures=d.get("failures", 0))


@dataclass(frozen=True)
class SeriesStatus:
    id: str
    state: SeriesState
    end: int | None  # the stream's end once known
    created_at: float
    batches: tuple[Batch, ...] = ()
    failure: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def finished(self) -> list[Batch]:
        return [b for b in self.batches if b.state is BatchState.FINISHED]

    @property
    def rows_done(self) -> int:
        return sum(b.rows for b in self.finished)

    @property
    def covered(self) -> int:
        """Positions ``[0, covered)`` are in finished batches (the finished prefix)."""
        pos = 0
        for b in self.batches:
            if b.state is not BatchState.FINISHED or b.end is None:
                break
            pos = b.end
        return pos

    def expected_batches(self, size: int) -> int | None:
        """Batches in total when the end is known and batches have ``size`` positions."""
        if self.end is None:
            return None
        return max(len(self.batches), -(-self.end // size)) if size > 0 else len(self.batches)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "state": self.state.value, "end": self.end,
                "created_at": self.created_at, "failure": list(self.failure),
                "meta": self.meta, "batches": [b.to_json() for b in self.batches]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SeriesStatus:
        return cls(id=d["id"], state=SeriesState(d["state"]), end=d["end"],
                   created_at=d["created_at"], failure=tuple(d["failure"]),
                   meta=dict(d["meta"]),
                   batches=tuple(Batch.from_json(d["id"], b) for b in d["batches"]))
