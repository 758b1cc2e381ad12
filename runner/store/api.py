"""The store's port: the one typed surface the runner sees, whatever the graph.

The runner (tasks, node, CLI, web, pipeline) imports this module's names through
:mod:`runner.store` and never a driver: :class:`Store` is the whole of what it may ask of the
store, each part a protocol of its own (:class:`TaskStore`, :class:`AttemptLog`, ...), and
the values they answer are :mod:`runner.store.model`'s frozen records. An attempt's end
travels as one value, :class:`Conclusion`, with its write plan (:class:`AttemptEnd`) made
outside the write slot.

Two drivers implement the port over one shared Gremlin layer (:mod:`runner.store.gremlin`):
:mod:`runner.store.embedded` (gremlite on a SQLite file, with SQL written into gremlite's own
tables where traversals are too slow, checked at open) and :mod:`runner.store.server` (a
Gremlin Server over the wire). :func:`open_store` picks one from the location, the way
SQLAlchemy's ``create_engine`` picks a dialect from its URL; River's ``riverdriver`` is the
model for the split (docs/architecture.md, "The store").

Traversals cross the port in three places only, each typed by :class:`Traversal` (gremlinpython
ships no types): a handler's last effect (:meth:`Store.complete`), a fenced write
(:meth:`Store.fenced_write`) and a raw read or write of the graph (:class:`Graph`, for
diagnostics, examples and migrations).

Why one module: the port is read as one surface. Whoever adds a store operation finds every
part's protocol beside the :class:`Store` that holds them, and adds it once here (then once in
the shared Gremlin layer, and the contract suite runs it on both drivers).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Protocol, TypeVar

from runner.errors import StoreError
from runner.store.calls import CallStats
from runner.store.ends import Conclusion, EndWrite, EndWritten, LastEffect
from runner.store.model import (
    Attempt,
    AttemptStatus,
    Avatar,
    Checkpoint,
    CheckpointInfo,
    Fence,
    Incident,
    LoadResult,
    NewMember,
    Ontology,
    OntologyClass,
    OntologyRecord,
    Schedule,
    StoredResult,
    Task,
    TaskFilter,
    TaskPage,
    Tombstone,
    Workflow,
)
from runner.store.traversal import Traversal

T = TypeVar("T")


class Graph(Protocol):
    """The graph under a store: ``read(fn)`` runs ``fn(g)``; ``write(fn)`` runs it as one
    atomic step (a transaction, or one traversal on a server that runs one at a time)."""
    name: str
    stats: CallStats
    #: ``has(key, P.within(values))`` an index lookup here, not a scan of every vertex
    within_indexed: bool  # (TinkerGraph 3.5 scans: runner.store.gremlin.steps.any_of)

    def read(self, fn: Callable[[Traversal], T]) -> T: ...

    def write(self, fn: Callable[[Traversal], T]) -> T: ...

    def close(self) -> None: ...


class TaskStore(Protocol):
    def create(self, type: str, payload: Mapping[str, object] | None = None, *,
               unique_key: str | None = None, priority: int = 0,
               run_at: datetime | None = None, ordering_key: str | None = None,
               resources: Sequence[str] = ()) -> Task:
        """A new WAITING task, or the existing one with the same ``unique_key``."""
        ...

    def new(self, type: str, payload: Mapping[str, object] | None = None, *,
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

    def with_unique(self, keys: Sequence[str]) -> dict[str, Task]:
        """The tasks holding ``keys`` (uniqueness keys), by key (one read)."""

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
               **changes: object) -> Task:
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

    def heartbeat(self, attempt_id: str, details: object) -> bool:
        """Record a RUNNING attempt's last heartbeat details; False once it has ended."""

    def get(self, attempt_id: str) -> Attempt: ...

    def for_task(self, task_id: str) -> list[Attempt]: ...

    def running(self) -> list[Attempt]: ...

    def recent(self, limit: int = 10) -> list[Attempt]:
        """The attempts that ended last (today and yesterday), newest first."""

    def result(self, task_id: str) -> StoredResult | None:
        """What the handler of ``task_id``'s SUCCEEDED attempt returned (one read of that
        attempt's result, never of its other attempts' rows); None: no attempt of it
        succeeded with a result (it has not ended, it stopped, it returned None)."""

    def results(self, task_ids: Sequence[str]) -> dict[str, StoredResult]:
        """The results of several tasks (:meth:`result` of each) in one read, by task id;
        a task without one is left out. Callers page: a few hundred ids at a time."""


class WorkflowStore(Protocol):
    """Workflows: a workflow vertex, its members (tasks) and their ``depends_on`` edges
    (:mod:`runner.store.gremlin.workflows`). A member's success releases its dependants in its
    own end's write (:meth:`Store.conclude_many`), not here."""

    def begin(self, workflow_id: str, key: str, members: int, digest: str = "",
              deadline: datetime | None = None) -> Workflow:
        """The workflow, written ``open`` (nothing of it claimable) unless it exists."""

    def get(self, workflow_id: str) -> Workflow:
        """TaskNotFound for an unknown workflow."""

    def add(self, workflow_id: str, members: Sequence[NewMember]) -> list[Task]:
        """Write a page of members (each after what it depends on) and their edges, what is
        missing only; the members as stored."""

    def commit(self, workflow_id: str) -> Workflow:
        """``open`` -> ``running`` in one guarded write; the workflow as it is then."""

    def activate(self, workflow_id: str, limit: int = 200) -> int:
        """Make up to ``limit`` roots of a committed workflow claimable; how many were."""

    def members(self, workflow_id: str) -> list[Task]: ...

    def stale(self, opened_before: datetime) -> tuple[list[Workflow], list[Workflow]]:
        """The workflows left open since before ``opened_before``, and the committed ones whose
        roots were not all activated."""

    def remove(self, workflow_id: str) -> int:
        """Remove a workflow left open (its members and vertex); how many members went."""

    def due(self, now: datetime) -> list[Workflow]:
        """The running workflows whose deadline passed, not yet enforced."""

    def enforced(self, workflow_id: str) -> None:
        """The workflow's deadline was enforced."""

    def settle(self, limit: int = 100) -> list[str]:
        """Mark ``succeeded`` the running workflows every member of which finished."""

    def counts(self) -> dict[str, int]:
        """How many workflows are in each state."""

    def start_on_failure(self, workflow_id: str) -> bool:
        """Start the workflow's ``on_failure`` step; False when none or started already."""

    def depends_on(self, task_ids: Sequence[str]) -> dict[str, list[str]]:
        """What each of ``task_ids`` depends on (task ids)."""

    def spawn(self, fence: Fence, parent: Task, child: Task) -> Task:
        """Write ``child`` of ``parent`` (fenced by its running attempt), each of the parent's
        dependants then depending on it too; a child already there answered as it is."""

    def children(self, parent_id: str) -> list[Task]:
        """The children ``parent_id`` spawned."""


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

    def upsert_aspect(self, aspect: str, values: Mapping[str, object],
                      encoded: bool = False, fence: Fence | None = None) -> int: ...

    def remove_aspect(self, aspect: str, avatar_ids: Iterable[str] | None = None,
                      fence: Fence | None = None) -> int: ...

    def count(self) -> int: ...

    def scan(self, class_iris: Iterable[str] | None = None) -> Iterator[list[Avatar]]: ...

    def export_page(self, class_iris: Iterable[str], after: str | None, limit: int
                    ) -> tuple[list[tuple[str, str, str]], str | None]: ...

    def with_aspect(self, aspect: str) -> dict[str, object]: ...


class ScheduleStore(Protocol):
    def add(self, name: str, spec: Mapping[str, object]) -> Schedule:
        """A new schedule; :class:`~runner.errors.ScheduleExists` when the name is taken."""
        ...

    def get(self, name: str) -> Schedule: ...

    def all(self) -> list[Schedule]: ...

    def remove(self, name: str) -> None: ...

    def update(self, schedule: Schedule, *, paused: bool | None = None,
               last_fire: datetime | None = None) -> Schedule:
        """Guarded by the schedule's version: CommitConflict when it moved on."""
        ...


class IncidentStore(Protocol):
    def raise_(self, task_id: str, kind: str, occurrence: str, detail: str
               ) -> tuple[Incident, bool]:
        """The incident of (task, kind, occurrence), and whether this call raised it."""
        ...

    def open(self) -> list[Incident]: ...

    def undelivered(self) -> list[Incident]: ...

    def for_task(self, task_id: str) -> list[Incident]: ...

    def resolve(self, incident: Incident) -> bool: ...

    def delivered(self, incident: Incident, event: str) -> None: ...


class RetentionStore(Protocol):
    def end_days(self) -> list[str]: ...

    def finished_on(self, day: str) -> list[Task]: ...

    def remove(self, tasks: list[Task], where: str) -> None: ...

    def tombstone(self, task_id: str) -> Tombstone | None: ...


class CheckpointStore(Protocol):
    def commit(self, fence: Fence, seq: int, state: object) -> CheckpointInfo:
        """Fenced by the task's token and the attempt being RUNNING; durable on return."""
        ...

    def read(self, task_id: str) -> Checkpoint | None: ...


class SearchStore(Protocol):
    def page(self, where: TaskFilter, before: str | None = None, limit: int = 50
             ) -> TaskPage: ...

    def counts(self, where: TaskFilter) -> dict[str, int]: ...


#: a claim written: the task as claimed and its RUNNING attempt
TaskClaim = tuple[Task, Attempt]



class Store(Protocol):
    """Everything the runner may ask of the store: its parts, and the owner's writes that span
    a task and its attempts (each one guarded write: a refused guard changes nothing).

    Errors (:mod:`runner.errors`): a version moved by another writer is
    :class:`~runner.errors.CommitConflict`; a fencing token no longer the task's
    :class:`~runner.errors.StaleFencingToken`; an attempt someone else closed
    :class:`~runner.errors.AttemptAlreadyFinished`; a resource another attempt claimed
    :class:`~runner.errors.ResourceTaken`; the graph out of reach
    :class:`~runner.errors.StoreUnavailable`."""

    tasks: TaskStore
    attempts: AttemptLog
    ontologies: OntologyStore
    avatars: AvatarStore
    schedules: ScheduleStore
    incidents: IncidentStore
    retention: RetentionStore
    #: the state long handlers commit and resume from (``ctx.checkpoint``, ``ctx.resume``)
    checkpoints: CheckpointStore
    #: an operator's filtered, paged, newest-first view (the web console's task list)
    search: SearchStore
    #: workflows: their vertices, members and edges
    workflows: WorkflowStore
    #: the graph itself, for what no part covers (diagnostics, examples, migrations)
    graph: Graph

    def claim(self, task: Task, fence_token: int, member_id: str) -> TaskClaim:
        """TaskClaim ``task`` as listed (RUNNING, owner, token) with its RUNNING attempt, in one
        write; a task listed RUNNING has its old owner's attempts closed ("superseded")."""
        ...

    def claim_many(self, claims: Sequence[tuple[Task, int]], member_id: str
                   ) -> list[TaskClaim | StoreError]:
        """:meth:`claim` of several tasks without resources in one write; each claim or its
        refusal, in order."""
        ...

    def create_claimed(self, task: Task, fence_token: int, member_id: str) -> TaskClaim:
        """Write a new task (``tasks.new``) already claimed, with its attempt, in one write."""
        ...

    def create_claimed_again(self, task: Task, fence_token: int, member_id: str
                             ) -> TaskClaim | None:
        """:meth:`create_claimed` unless a task with its id exists (None, nothing written)."""
        ...

    def conclude(self, c: Conclusion) -> Task:
        """Write one attempt's end and its task's change as its owner (see
        :meth:`conclude_many`)."""
        ...

    def conclude_many(self, conclusions: Sequence[Conclusion]) -> list[Task | StoreError]:
        """The ends of several attempts in one write; each task as written or the store's
        refusal of that end, in order. The graph out of reach raises for the whole batch."""
        ...

    def write_ends(self, writes: Sequence[EndWrite]) -> list[EndWritten | StoreError]:
        """The worker's one way to write what its attempts came to: each write as its kind
        says (conclusions together in one write; the others each in its own), answered in
        order with what it left or the store's refusal of it. The graph out of reach raises
        for the whole call (:class:`~runner.errors.StoreUnavailable`): what was written of it
        is recognised as its own when it is written again."""
        ...

    def release(self, task_id: str, fence_token: int, changes: Mapping[str, object]) -> Task:
        """Update the task as its owner when no attempt ends with it."""
        ...

    def close_attempts(self, task_id: str, status: AttemptStatus, error: str, *,
                       executor: str | None = None,
                       changes: Mapping[str, object] | None = None,
                       refuse_finished: bool = False) -> tuple[Task, list[Attempt]]:
        """Close RUNNING attempts as someone other than their owner, moving the fence past the
        owner when it is the task's, in one write."""
        ...

    def cancel(self, task_id: str, by: str, reason: str | None = None
               ) -> tuple[Task, list[Attempt]]:
        """An operator stops a task: inactive, its running attempt CANCELLED, its owner
        fenced off, in one write."""
        ...

    def complete(self, attempt: Attempt, task: Task, fence_token: int,
                 effect: LastEffect) -> Task:
        """A handler's last effect, its attempt SUCCEEDED and its task finished, as one
        guarded write."""
        ...

    def fenced_write(self, fence: Fence, fn: Callable[[Traversal], T]) -> T:
        """``fn(g)`` as one write refused unless ``fence`` is still the task's."""
        ...

    def clear(self) -> None:
        """Drop every vertex, then stamp the current format (a test's fresh start)."""

    def close(self) -> None: ...

    def __enter__(self) -> Store: ...

    def __exit__(self, *exc: object) -> None: ...


def location(graph: Graph) -> str:
    """Where a graph is, for messages: its file or its server's URL."""
    return str(getattr(graph, "path", None) or getattr(graph, "url", None) or graph.name)
