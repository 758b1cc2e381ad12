"""The narrow ports the runner depends on; :mod:`runner.store.gremlin` implements them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from runner.store.model import (
    Attempt,
    AttemptStatus,
    Avatar,
    Fence,
    LoadResult,
    Ontology,
    OntologyClass,
    OntologyRecord,
    Task,
)


class TaskStore(Protocol):
    def create(self, type: str, payload: Mapping[str, Any] | None = None, *,
               unique_key: str | None = None, priority: int = 0,
               run_at: datetime | None = None, ordering_key: str | None = None,
               resources: Sequence[str] = ()) -> Task:
        """A new WAITING task, or the existing one with the same ``unique_key``."""
        ...

    def new(self, type: str, payload: Mapping[str, Any] | None = None, *,
            unique_key: str | None = None, priority: int = 0,
            run_at: datetime | None = None, ordering_key: str | None = None,
            resources: Sequence[str] = (), timeout: float | None = None) -> Task:
        """A new WAITING task with its id, checked (InvalidValue) and not written."""
        ...

    def add(self, task: Task) -> Task:
        """Write a task from :meth:`new`: the task as stored (the existing one when its
        ``unique_key`` is taken)."""
        ...

    def with_key(self, ordering_key: str) -> list[Task]:
        """The unfinished tasks of an ordering key, in submission order."""
        ...

    def stopped(self) -> list[Task]:
        """Tasks stopped before they finished, oldest first."""
        ...

    def move_old_layout(self, limit: int) -> tuple[list[Task], list[tuple[str, str]]]:
        """Open tasks an older release wrote in no ready bucket, brought to today's layout:
        (those moved, (id, why) of those that cannot be read)."""
        ...

    def promote(self, buckets: Sequence[int]) -> int:
        """Move the tasks of these time buckets into their ready buckets."""
        ...

    def get(self, task_id: str) -> Task: ...

    def unfinished(self) -> list[Task]:
        """Active, unfinished tasks, highest priority first, then oldest first."""
        ...

    def add_many(self, tasks: Sequence[Task], *, again: bool = False) -> list[Task]:
        """Write new tasks in one write; the tasks as stored, in order (``again``: a task
        whose id exists already is that task, not written twice)."""
        ...

    def claimed(self) -> list[Task]:
        """The tasks RUNNING under some owner."""
        ...

    def lanes(self, among: Sequence[str] | None = None) -> list[str]:
        """The lanes (priorities) that hold a ready or running task, highest first; ``among``:
        only these are asked about."""
        ...

    def ready_page(self, lane: str, seconds: Sequence[str], limit: int,
                   shards: Sequence[str] | None = None) -> list[Task]:
        """Up to ``limit`` WAITING tasks of ``lane`` that became ready in ``seconds``;
        ``shards``: only those of these shards (``task_shard``)."""
        ...

    def lane_seconds(self, lane: str) -> list[str]:
        """The seconds the WAITING tasks of ``lane`` became ready in, sorted."""
        ...

    def versions(self, task_ids: Sequence[str]) -> dict[str, int]:
        """The current version of each of these tasks that exists (one read)."""
        ...

    def all(self, type: str | None = None) -> list[Task]:
        """Every task, newest first (an operator's listing, not the task loop's scan)."""
        ...

    def update(self, task_id: str, expected_version: int, fence_token: int | None,
               **changes: Any) -> Task:
        """Apply ``changes`` if the task is still at ``expected_version`` and ``fence_token`` is
        not older than the task's; raises CommitConflict / StaleFencingToken otherwise."""
        ...

    def deactivate(self, task_id: str) -> Task: ...

    def reactivate(self, task_id: str, fresh: bool = False) -> Task: ...

    def stop_unstarted(self, task_id: str, reason: str) -> Task | None:
        """Deactivate a waiting task with ``reason``; None when it started first."""

    def skip(self, task_id: str) -> Task:
        """Finish a task that is not running, without running it."""
        ...


class AttemptLog(Protocol):
    def start(self, task_id: str, executor: str, fence_token: int = 0) -> Attempt: ...

    def finish(self, attempt_id: str, status: AttemptStatus, error: str | None = None,
               stack_trace: str | None = None, *, progress: str | None = None,
               ended: datetime | None = None) -> Attempt: ...

    def progress(self, attempt_id: str, done: int, total: int | None, message: str) -> bool:
        """Record a RUNNING attempt's progress; False once it has ended."""

    def heartbeat(self, attempt_id: str, details: Any) -> bool:
        """Record a RUNNING attempt's last heartbeat details; False once it has ended."""

    def get(self, attempt_id: str) -> Attempt: ...

    def for_task(self, task_id: str) -> list[Attempt]: ...

    def running(self) -> list[Attempt]: ...

    def recent(self, limit: int = 10) -> list[Attempt]:
        """The attempts that ended last (today and yesterday), newest first."""


class OntologyStore(Protocol):
    def load(self, ontology: Ontology, fence: Fence | None = None) -> LoadResult: ...

    def load_part(self, ontology: Ontology, part: Sequence[OntologyClass],
                  fence: Fence | None = None) -> LoadResult: ...

    def finish(self, ontology: Ontology, fence: Fence | None = None) -> None: ...

    def get(self, iri: str) -> OntologyRecord | None: ...

    def all(self) -> list[OntologyRecord]: ...

    def classes(self, iri: str) -> list[OntologyClass]:
        """The classes ``iri`` defines, with labels and parents, sorted by IRI."""

    def ancestors(self, class_iri: str) -> set[str]: ...

    def subclass_edges(self) -> list[tuple[str, str]]: ...


class AvatarStore(Protocol):
    def upsert(self, avatars: Sequence[Avatar], fence: Fence | None = None) -> int: ...

    def get(self, avatar_id: str) -> Avatar: ...

    def upsert_aspect(self, aspect: str, values: Mapping[str, Any],
                      encoded: bool = False, fence: Fence | None = None) -> int: ...

    def remove_aspect(self, aspect: str, avatar_ids: Iterable[str] | None = None,
                      fence: Fence | None = None) -> int: ...

    def count(self) -> int: ...

    def scan(self, class_iris: Iterable[str] | None = None) -> Iterator[list[Avatar]]: ...

    def export_page(self, class_iris: Iterable[str], after: str | None, limit: int
                    ) -> tuple[list[tuple[str, str, str]], str | None]: ...

    def with_aspect(self, aspect: str) -> dict[str, Any]: ...
