"""Tasks as ``task`` vertices: create (unique key), read, list the open queue, version reads,
guarded modify, an operator's changes (deactivate, reactivate, skip) and the task written in
an older layout brought to today's. A missing task raises
:class:`~runner.errors.TaskNotFound`; a guard lost to another writer,
:class:`~runner.errors.CommitConflict`; an action a finished task cannot take,
:class:`~runner.errors.TaskFinished`.

Why one module: it is the task store port's one implementation (``runner.store.api.
TaskStore``), and each method is a read and a guarded write of the same vertex; the store's
split into one port and two drivers (the next issue) divides it by driver, not by method."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime

from gremlin_python.process.graph_traversal import __
from gremlin_python.process.traversal import Cardinality, P

from runner.errors import (
    CommitConflict,
    InvalidValue,
    StoreError,
    StoreUnavailable,
    TaskNotFound,
)
from runner.store import codec, due
from runner.store.api import Graph
from runner.store.format import FORMAT_KEY, FORMAT_KEY_VALUE
from runner.store.gremlin import batch, checkpoints, ready
from runner.store.gremlin.guards import Write
from runner.store.gremlin.releases import releases
from runner.store.gremlin.rows import (
    TASK_ROW,
    task_from_row,
    task_props,
)
from runner.store.gremlin.steps import (
    BATCH,
    add_vertex,
    any_of,
    chunks,
    get_or_add,
    set_props,
)
from runner.store.gremlin.writes import (
    TaskChange,
    finished_error,
    matched_write,
    task_change,
    until_written,
)
from runner.store.model import (
    Task,
    TaskStatus,
)
from runner.store.traversal import Props, Row, Traversal

#: tasks per traversal of a bulk create: within gremlite's recursion and a server's frame size
ADD_CHUNK = 40


class _Started(Exception):
    """The task a stop_unstarted meant to stop is running or ended already."""


def read_task(graph: Graph, task_id: str) -> Task:
    rows = graph.read(lambda g: g.V().has("task_id", task_id).element_map(*TASK_ROW).to_list())
    if not rows:
        raise TaskNotFound(f"no task {task_id}")
    return task_from_row(rows[0])


class GremlinTaskStore:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def create(self, type: str, payload: Mapping[str, object] | None = None, *,
               unique_key: str | None = None, priority: int = 0,
               run_at: datetime | None = None, ordering_key: str | None = None,
               resources: Sequence[str] = ()) -> Task:
        return self.add(self.new(type, payload, unique_key=unique_key, priority=priority,
                                 run_at=run_at, ordering_key=ordering_key, resources=resources))

    def new(self, type: str, payload: Mapping[str, object] | None = None, *,
            unique_key: str | None = None, priority: int = 0,
            run_at: datetime | None = None, ordering_key: str | None = None,
            resources: Sequence[str] = (), timeout: float | None = None) -> Task:
        """A new WAITING task with its id, checked and not written (:meth:`add` writes it;
        ``GraphStore.create_claimed`` writes it already claimed); ``timeout``: its own."""
        if not type:
            raise InvalidValue("a task needs a type")
        if run_at is not None and run_at.tzinfo is None:
            raise InvalidValue(f"run_at {run_at!r} has no time zone")
        if ordering_key is not None and not ordering_key:
            raise InvalidValue("an ordering key cannot be empty")
        if any(not r for r in resources):
            raise InvalidValue("a resource name cannot be empty")
        created = codec.now()
        return Task(id=str(uuid.uuid4()), type=type, payload=dict(payload or {}), active=True,
                    status=TaskStatus.WAITING, finished=False, priority=priority,
                    created_at=created, updated_at=created, version=0, fence=0,
                    unique_key=unique_key, run_at=run_at, ordering_key=ordering_key,
                    resources=tuple(sorted(set(resources))), timeout=timeout)

    def add(self, task: Task) -> Task:
        """Write ``task`` (from :meth:`new`); the task as stored: the existing one when a task
        with its ``unique_key`` exists already."""
        return self.add_many([task])[0]

    def add_many(self, tasks: Sequence[Task], *, again: bool = False) -> list[Task]:
        """Write ``tasks`` (from :meth:`new`), in order, as one write: on the embedded graph one
        transaction, by SQL (:func:`~runner.store.gremlin.batch.added`); on a Gremlin Server
        traversals of :data:`ADD_CHUNK` tasks, each a request (atomic, the page not). The tasks
        as stored: for a ``unique_key`` that exists already, that task; with ``again`` (ids a
        write of the same tasks may have used: a bulk submit's page sent again), for an id
        that exists already, that task, found or made in one traversal. A graph out of reach
        raises for the whole page (on a server, the traversals before it are written)."""
        if not tasks:
            return []
        props = [task_props(task) for task in tasks]

        def unique(task: Task) -> tuple[str, str] | None:  # what no other task may have yet
            if task.unique_key is not None:
                return "task_unique", task.unique_key
            return ("task_id", task.id) if again else None

        def branch(n: int) -> Traversal:
            key = unique(tasks[n])
            return (add_vertex(__, "task", props[n]) if key is None
                    else get_or_add(__, *key, "task", props[n])).element_map()

        def run(g: Traversal, ns: Sequence[int]) -> list[Row]:
            # ``fold``: one traverser even where an emptied graph lost the format vertex
            return list(g.V().has(FORMAT_KEY, FORMAT_KEY_VALUE).fold().union(
                *[branch(n) for n in ns]).to_list())

        made = batch.added(self.graph, [(p, unique(t)) for t, p in zip(tasks, props,
                                                                        strict=True)],
                           lambda g, n: run(g, [n])[0])
        if made is not None:  # the embedded graph, by SQL: a task written is as given
            return [t if row is None else task_from_row(row)
                    for t, row in zip(tasks, made, strict=True)]

        def chunks(g: Traversal) -> list[Row]:  # a Gremlin Server: ADD_CHUNK tasks a request
            return [row for at in range(0, len(tasks), ADD_CHUNK)
                    for row in run(g, range(at, min(at + ADD_CHUNK, len(tasks))))]

        rows = self.graph.write(chunks)
        if len(rows) != len(tasks):  # one traverser per branch, in order: anything else is a bug
            raise StoreUnavailable(f"a bulk create wrote {len(rows)} of {len(tasks)} tasks")
        return [task_from_row(row) for row in rows]

    def with_unique(self, keys: Sequence[str]) -> dict[str, Task]:
        """The tasks holding ``keys`` (uniqueness keys), by key; a key none holds is left
        out. One read from the ``task_unique`` index."""
        if not keys:
            return {}
        rows = self.graph.read(lambda g: any_of(self.graph, g, "task_unique", list(keys))
                               .element_map(*TASK_ROW).to_list())
        found = [task_from_row(r) for r in rows]
        return {t.unique_key: t for t in found if t.unique_key is not None}

    def get(self, task_id: str) -> Task:
        return read_task(self.graph, task_id)

    def unfinished(self) -> list[Task]:
        """Every open task that is ready or running (not those waiting in a time bucket),
        highest priority first, oldest first: a read of all of them (the task loop reads
        pages instead: :meth:`ready_page`)."""
        rows = self.graph.read(
            lambda g: g.V().has("task_lane", P.within(list(due.LANES))).element_map().to_list())
        tasks = [task_from_row(row) for row in rows]
        tasks.sort(key=lambda t: (-t.priority, t.created_at, t.id))
        return tasks

    def claimed(self) -> list[Task]:
        """The tasks RUNNING under some owner (an index lookup: as many as run now, and those
        whose owner left or let them go without an end)."""
        rows = self.graph.read(lambda g: g.V().has("task_queue", "running")
                               .element_map(*TASK_ROW).to_list())
        return [task_from_row(row) for row in rows]

    def lanes(self, among: Sequence[str] | None = None) -> list[str]:
        return ready.lanes(self.graph, among)

    def ready_page(self, lane: str, seconds: Sequence[str], limit: int,
                   shards: Sequence[str] | None = None) -> list[Task]:
        return ready.ready_page(self.graph, lane, seconds, limit, shards)

    def lane_seconds(self, lane: str) -> list[str]:
        return ready.lane_seconds(self.graph, lane)

    def with_key(self, ordering_key: str) -> list[Task]:
        """The unfinished tasks of ``ordering_key`` (stopped ones too), in submission order:
        the first is the only one that may run."""
        rows = self.graph.read(
            lambda g: g.V().has("task_okey_open", ordering_key).element_map().to_list())
        tasks = [task_from_row(row) for row in rows]
        tasks.sort(key=lambda t: (t.created_at, t.id))
        return tasks

    def stopped(self) -> list[Task]:
        """Tasks stopped before they finished (a failure, an operator), oldest first."""
        rows = self.graph.read(
            lambda g: g.V().has("task_stopped", "1").element_map().to_list())
        return sorted((task_from_row(r) for r in rows), key=lambda t: (t.created_at, t.id))

    def promote(self, buckets: Sequence[int]) -> int:
        """Move the tasks of these time buckets into their ready buckets (see
        :mod:`runner.store.due`: each by its lane and its ``run_at``); how many. Idempotent
        (each move is guarded by the task still being in its time bucket); changes no version
        (where a task waits is not part of its state)."""
        if not buckets:
            return 0
        names = [due.bucket_name(b) for b in buckets]
        rows = self.graph.read(lambda g: any_of(self.graph, g, "task_queue", names)
                               .element_map().to_list())
        moves = []
        now = codec.now()
        for row in rows:
            task = task_from_row(row)
            queue = due.ready_key(due.lane_of(task.priority), due.second(due.ready_at(task, now)))
            moves.append((task.id, row["task_queue"], queue, due.lane_of(task.priority)))
        moved = 0
        for chunk in chunks(moves, BATCH // 4):
            def write(g: Traversal, chunk: Sequence[tuple[str, str, str, str]] = chunk) -> int:
                done = 0
                for task_id, bucket, queue, lane in chunk:
                    done += len(g.V().has("task_id", task_id).has("task_queue", bucket)
                                .property(Cardinality.single, "task_queue", queue)
                                .property(Cardinality.single, "task_lane", lane)
                                .id_().to_list())
                return done
            moved += self.graph.write(write)
        return moved

    def versions(self, task_ids: Sequence[str]) -> dict[str, int]:
        """The current version of each task that exists (one read): a cheap freshness check
        of a listing before paying for a lock and a claim."""
        if not task_ids:
            return {}
        # element_map of two keys: half the cost of project().by().by() on gremlite
        rows = self.graph.read(
            lambda g: any_of(self.graph, g, "task_id", task_ids)
            .element_map("task_id", "task_version").to_list())
        return {r["task_id"]: int(r["task_version"]) for r in rows}

    def all(self, type: str | None = None) -> list[Task]:
        """Every task (finished ones too), newest first; optionally of one type."""
        if type is None:
            rows = self.graph.read(lambda g: g.V().has_label("task").element_map().to_list())
        else:
            rows = self.graph.read(
                lambda g: g.V().has("task_type", type).element_map().to_list())
        tasks = [task_from_row(row) for row in rows]
        tasks.sort(key=lambda t: (t.created_at, t.id), reverse=True)
        return tasks

    def update(self, task_id: str, expected_version: int, fence_token: int | None,
               **changes: object) -> Task:
        change = self.prepare_update(task_id, expected_version, fence_token, changes)
        self.graph.write(change.write)
        return change.task

    def prepare_update(self, task_id: str, expected_version: int, fence_token: int | None,
                       changes: Mapping[str, object]) -> TaskChange:
        """Read and check the task now (TaskNotFound, CommitConflict, StaleFencingToken);
        the returned change is written later, guarded by the version."""
        current = read_task(self.graph, task_id)
        if current.version != expected_version:
            raise CommitConflict(task_id, expected_version, current.version)
        return task_change(current, fence_token, changes)

    def modify(self, task_id: str, fence_token: int | None, changes: Mapping[str, object],
               move_fence: bool = False) -> Task:
        """Apply ``changes`` to the task as it now stands (re-read and written again while
        someone else writes first). ``fence_token``: an owner's write, refused with
        :class:`StaleFencingToken` once the token is no longer the task's."""
        def once() -> Task | None:
            change = task_change(read_task(self.graph, task_id), fence_token, changes,
                                 move_fence=move_fence)
            return change.task if matched_write(self.graph, change.traverse) else None
        return until_written(once, task_id)

    def _flip(self, task_id: str, active: bool) -> Task:
        def once() -> Task | None:
            task = read_task(self.graph, task_id)
            if task.finished:
                raise finished_error(task, "reactivated" if active else "deactivated")
            if task.active is active:
                return task  # nothing to change: the caller tells it by the same version
            change = task_change(task, None, {"active": active, "stop_reason": None})
            return change.task if matched_write(self.graph, change.traverse) else None
        return until_written(once, task_id)

    def stop_unstarted(self, task_id: str, reason: str) -> Task | None:
        """Deactivate the task, with ``reason``, only while it has never started: unfinished,
        active, waiting, no attempt yet. None when it started (or ended, or was stopped) first:
        a claim that gets in first wins, and a claim after this is refused (the task is
        inactive). A task whose attempt was interrupted has started: it runs again."""
        def once() -> Task | None:
            task = read_task(self.graph, task_id)
            if not task.open or task.status is not TaskStatus.WAITING or task.attempts:
                raise _Started
            change = task_change(task, None, {"active": False, "stop_reason": reason})
            return change.task if matched_write(self.graph, change.traverse) else None
        try:
            return until_written(once, task_id)
        except _Started:
            return None

    def move_old_layout(self, limit: int) -> tuple[list[Task], list[tuple[str, str]]]:
        """Tasks a node of a release before format 2 wrote open (``task_queue = "open"``: in
        no ready bucket, so no scan finds them), up to ``limit``, rewritten with today's
        layout (:func:`task_props`), each guarded by its version and its old queue. One equality
        lookup on an indexed property when there is none. (the moved tasks, (id, why) of those
        that cannot be read)."""
        rows = self.graph.read(lambda g: g.V().has("task_queue", "open").limit(limit)
                               .element_map().to_list())
        moved, unreadable = [], []
        for row in rows:
            task_id = str(row.get("task_id"))
            try:
                task = task_from_row(row)
            except (StoreError, KeyError, ValueError) as exc:
                unreadable.append((task_id, str(exc)))
                continue
            props = task_props(task)

            def guarded(g: Traversal, task_id: str = task_id, props: Props = props,
                        version: object = row["task_version"]) -> Traversal:
                return set_props(g.V().has("task_id", task_id).has("task_queue", "open")
                                 .has("task_version", version), props)
            if matched_write(self.graph, guarded):
                moved.append(task)
        return moved, unreadable

    def deactivate(self, task_id: str) -> Task:
        """Stop the task (the task loop no longer picks it); kept forever, like every task.
        A running attempt is not touched here: see ``GraphStore.cancel``."""
        return self._flip(task_id, False)

    def reactivate(self, task_id: str, fresh: bool = False) -> Task:
        """Make a stopped task active again; ``fresh``: also drop its last checkpoint in the
        same write (its next attempt starts from the beginning: ``ctx.resume`` is None),
        refused with :class:`InvalidValue` while an attempt runs it. A finished task (it
        succeeded, or was skipped) raises :class:`TaskFinished`, nothing written: a task
        succeeds once."""
        if not fresh:
            return self._flip(task_id, True)

        def once() -> Task | None:
            task = read_task(self.graph, task_id)
            if task.finished:
                raise finished_error(task, "reactivated")
            change = checkpoints.fresh_start(task)
            return change.task if matched_write(self.graph, change.traverse) else None
        return until_written(once, task_id)

    def skip(self, task_id: str) -> Task:
        """Finish a task that is not running without running it (an operator unblocking its
        ordering key): finished, marked skipped. A running or finished task is refused
        (:class:`InvalidValue`); a claim that gets in first wins, and the skip is refused."""
        def once() -> Task | None:
            task = read_task(self.graph, task_id)
            if task.finished:
                raise finished_error(task, "skipped")
            if task.status is TaskStatus.RUNNING:
                raise InvalidValue(f"task {task_id} is running on {task.owner}: cancel it "
                                   "first")
            change = task_change(task, None, {"finished": True, "skipped": True,
                                              "active": False})
            if task.workflow is None:
                return change.task if matched_write(self.graph, change.traverse) else None
            # a workflow member: its dependants go on without it (its result reads as absent),
            # released in the same write
            w = Write()
            change.add_to(w)
            for release in releases(self.graph, [task_id]):
                release.add_to(w)
            return change.task if batch.matched(self.graph, w) else None
        return until_written(once, task_id)


