"""The store as gremlinpython traversals, in the subset gremlite and Gremlin Server share.

Every query here sticks to the portable subset listed in docs/graph.md: no mergeV, hasNot,
dedup, range, group; no numeric ``P.gt/lt/between`` (gremlite returns nothing for them); edges
added only between ``as_`` labels; property writes with explicit ``Cardinality.single``. Lookups
are property equality or ``P.within`` on a property that only one kind of vertex has, which both
backends can answer from an index. Bulk writes chain many steps into one traversal (one round
trip per batch, not per row).

Vertex kinds and their properties (prefixes keep keys unique to a kind). What is looked up
is a property of its own; what only changes together is one JSON property, because every
property written costs the embedded graph a few SQL statements inside the single writer slot
(docs/graph.md, "Store format"):

* ``task``: task_id, task_type, task_payload (JSON), task_priority, task_created (time),
  task_unique, task_version (the guard of every change), task_fence (big: the fencing token of
  the owner allowed to write the task; every owner write is guarded by it inside its own
  traversal), task_queue ("open" while active and unfinished, else "closed": the
  unfinished-task scan reads only the "open" index entries, so its cost does not grow with
  finished tasks), task_state (JSON: status, active, finished, owner, updated (time), attempts
  (how many were started));
* ``attempt`` (edge ``has_attempt`` from its task, which is how a task's attempts are found):
  attempt_id, attempt_status, attempt_start (JSON: task, seq, executor, started, fence),
  attempt_end (JSON, once ended: ended, duration_ms, error, stack);
* ``ontology``: ontology_iri, ontology_version, ontology_checksum, ontology_loaded;
* ``class`` (edges ``subClassOf`` to its parents): class_iri, class_label, class_defined_by;
* ``avatar``: avatar_id, avatar_class, avatar_props (JSON), and ``aspect.<name>`` (JSON) per
  aspect.
"""

from __future__ import annotations

import dataclasses
import random
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from gremlin_python.process.graph_traversal import __
from gremlin_python.process.traversal import Cardinality, P

from runner.store import codec
from runner.store.errors import (
    AttemptAlreadyFinished,
    CommitConflict,
    InvalidValue,
    StaleFencingToken,
    TaskNotFound,
    UnknownStoreFormat,
)
from runner.store.graph import Graph
from runner.store.model import (
    Attempt,
    AttemptStatus,
    Avatar,
    Fence,
    LoadResult,
    Ontology,
    OntologyRecord,
    Task,
    TaskStatus,
)

# gremlite evaluates a traversal recursively, one Python frame per step, so a chained bulk
# traversal must stay well under the interpreter's recursion limit (1000): at most ~400 steps
BATCH = 100  # rows per bulk traversal (at most 4 steps per row)
EDGE_BATCH = 50  # edges per traversal (5 steps each)
ASPECT_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
X = TypeVar("X")


def _chunks(items: Sequence[X], size: int) -> Iterator[Sequence[X]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _set(t: Any, props: Mapping[str, Any]) -> Any:
    for key, value in props.items():
        t = t.property(Cardinality.single, key, value)
    return t


def _add(g: Any, label: str, props: Mapping[str, Any]) -> Any:
    t = g.add_v(label)
    for key, value in props.items():
        t = t.property(key, value)
    return t


# -- prepared writes ----------------------------------------------------------------------
# The store reads and checks first, outside any write transaction, and then writes one guarded
# traversal: the embedded graph's single writer slot is held only for the write, and a change
# that is no longer true (someone else wrote first) matches nothing. ``traverse(src)`` builds the
# guarded write from ``g`` or from a traversal (mid-traversal ``V()``), so several changes can
# go out as one traversal.

@dataclass(frozen=True)
class TaskChange:
    """A checked task update: what changed, and the task it leaves.

    The write is guarded by the version and by the fencing token the task carried when it was
    read, both inside the traversal: a task that moved on, or whose fence moved on (another
    owner claimed it, or someone closed its owner's attempt), matches nothing.
    """
    task_id: str
    expected_version: int
    expected_fence: int
    props: Mapping[str, Any]
    task: Task

    def traverse(self, src: Any) -> Any:
        return _set(src.V().has("task_id", self.task_id)
                    .has("task_version", self.expected_version)
                    .has("task_fence", codec.encode_big(self.expected_fence)), self.props)

    def write(self, g: Any) -> None:
        if not self.traverse(g).id_().to_list():
            raise CommitConflict(self.task_id, self.expected_version, None)


@dataclass(frozen=True)
class AttemptStart:
    """A RUNNING attempt to add to a task vertex."""
    props: Mapping[str, Any]
    attempt: Attempt

    def extend(self, at_task: Any) -> Any:
        """Add the attempt and its edge after a traversal that stands on the task vertex."""
        t = _add(at_task.as_("t"), "attempt", self.props).as_("a")
        return t.add_e("has_attempt").from_("t").to("a")


@dataclass(frozen=True)
class AttemptEnd:
    """The end of a RUNNING attempt, and the attempt it leaves."""
    attempt_id: str
    props: Mapping[str, Any]
    attempt: Attempt

    def traverse(self, src: Any) -> Any:
        return _set(src.V().has("attempt_id", self.attempt_id)
                    .has("attempt_status", AttemptStatus.RUNNING.value), self.props)

    def write(self, g: Any) -> None:
        if not self.traverse(g).id_().to_list():
            raise AttemptAlreadyFinished(f"attempt {self.attempt_id} was finished meanwhile")


def task_change(task: Task, fence_token: int | None, changes: Mapping[str, Any],
                new_attempt: bool = False, move_fence: bool = False) -> TaskChange:
    """The change of ``task`` as it was read (at ``task.version``), without reading it again:
    the guards of the write (version and fence, see :class:`TaskChange`) refuse it if the task
    moved on since.

    Who writes decides the fence rule:

    * an owner (``fence_token``) writes only while its token is not older than the task's
      (a newer token is a newer lock holder taking over: it is recorded);
    * anyone else (``fence_token`` None: the master, an operator) leaves the fence alone, or,
      when it closes the current owner's attempt (``move_fence``), moves it one past the
      owner's token: from then on that owner can write nothing on the task, while every later
      lock node (a later czxid) still can.

    ``new_attempt`` counts one more started attempt.
    """
    unknown = set(changes) - _TASK_CHANGES
    if unknown:
        raise InvalidValue(f"cannot change {sorted(unknown)} of a task")
    changes = dict(changes)
    if "status" in changes:
        changes["status"] = TaskStatus(changes["status"])
    fence = task.fence
    if fence_token is not None:
        if fence_token < task.fence:
            raise StaleFencingToken(task.id, fence_token, task.fence)
        fence = fence_token
    elif move_fence:
        fence = task.fence + 1
    fields = {**task.__dict__, **changes, "version": task.version + 1,
              "updated_at": codec.now(), "fence": fence,
              "attempts": task.attempts + (1 if new_attempt else 0)}
    old = task_props(task)
    new = task_props(Task(**fields))
    changed = {k: v for k, v in new.items() if k not in _TASK_FIXED and old.get(k) != v}
    return TaskChange(task.id, task.version, task.fence, changed, _task({**old, **changed}))


def fence_guard(g: Any, fence: Fence) -> None:
    """Inside a write: raise :class:`StaleFencingToken` unless ``fence`` is still the task's
    (one read in the write's own transaction on the embedded graph, so nothing can move the
    fence between this check and the write's other steps)."""
    if not (g.V().has("task_id", fence.task_id)
            .has("task_fence", codec.encode_big(fence.token)).id_().to_list()):
        raise StaleFencingToken(fence.task_id, fence.token, -1)


def attempt_start(task: Task, executor: str, fence_token: int) -> AttemptStart:
    """The RUNNING attempt that ``task`` (as the same write leaves it: its ``attempts`` already
    count this one) starts; its end, duration, error and stack are written when it ends."""
    attempt_id = str(uuid.uuid4())
    props = {
        "attempt_id": attempt_id, "attempt_status": AttemptStatus.RUNNING.value,
        "attempt_start": codec.encode_json({
            "task": task.id, "seq": task.attempts, "executor": executor,
            "started": codec.encode_time(codec.now()),
            "fence": codec.encode_big(fence_token)}),
    }
    return AttemptStart(props, _attempt(props))


def attempt_end(attempt: Attempt, status: AttemptStatus, error: str | None = None,
                stack_trace: str | None = None) -> AttemptEnd:
    """The end of ``attempt`` as it was read, without reading it again: the write is guarded
    by its RUNNING status."""
    status = AttemptStatus(status)
    if status is AttemptStatus.RUNNING:
        raise InvalidValue("finish() needs a final status")
    if attempt.status is not AttemptStatus.RUNNING:
        raise AttemptAlreadyFinished(f"attempt {attempt.id} is already {attempt.status.value}")
    ended = codec.now()
    doc: dict[str, Any] = {
        "ended": codec.encode_time(ended),
        "duration_ms": int((ended - attempt.started_at).total_seconds() * 1000),
    }
    if error:
        doc["error"] = error
    if stack_trace:
        doc["stack"] = stack_trace
    props = {"attempt_status": status.value, "attempt_end": codec.encode_json(doc)}
    ended_attempt = dataclasses.replace(
        attempt, status=status, ended_at=codec.decode_time(doc["ended"]),
        duration_ms=doc["duration_ms"], error=error or None, stack_trace=stack_trace or None)
    return AttemptEnd(attempt.id, props, ended_attempt)


# -- tasks ------------------------------------------------------------------------------------

_TASK_CHANGES = {"status", "finished", "active", "payload", "owner", "priority"}
_TASK_FIXED = ("task_id", "task_type", "task_created", "task_unique")


def task_props(task: Task) -> dict[str, Any]:
    props = {
        "task_id": task.id, "task_type": task.type,
        "task_payload": codec.encode_json(task.payload), "task_priority": task.priority,
        "task_created": codec.encode_time(task.created_at), "task_version": task.version,
        "task_queue": "open" if task.open else "closed",
        "task_state": codec.encode_json({
            "status": task.status.value, "active": task.active, "finished": task.finished,
            "owner": task.owner or "", "updated": codec.encode_time(task.updated_at),
            "attempts": task.attempts}),
        "task_fence": codec.encode_big(task.fence),
    }
    if task.unique_key is not None:
        props["task_unique"] = task.unique_key
    return props


def _task(row: Mapping[Any, Any]) -> Task:
    if "task_state" not in row or "task_fence" not in row:
        raise UnknownStoreFormat(
            f"task {row.get('task_id')!r} has no task_state: the graph was written by an "
            f"older latchwork; recreate it")
    state = codec.decode_json(row["task_state"])
    return Task(
        id=row["task_id"], type=row["task_type"],
        payload=codec.decode_json(row["task_payload"]), active=bool(state["active"]),
        status=TaskStatus(state["status"]), finished=bool(state["finished"]),
        priority=int(row["task_priority"]), created_at=codec.decode_time(row["task_created"]),
        updated_at=codec.decode_time(state["updated"]), version=int(row["task_version"]),
        fence=codec.decode_big(row["task_fence"]), unique_key=row.get("task_unique"),
        owner=state["owner"] or None, attempts=int(state["attempts"]))


def read_task(graph: Graph, task_id: str) -> Task:
    rows = graph.read(lambda g: g.V().has("task_id", task_id).element_map().to_list())
    if not rows:
        raise TaskNotFound(f"no task {task_id}")
    return _task(rows[0])


class GremlinTaskStore:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def create(self, type: str, payload: Mapping[str, Any] | None = None, *,
               unique_key: str | None = None, priority: int = 0) -> Task:
        if not type:
            raise InvalidValue("a task needs a type")
        created = codec.now()
        task = Task(id=str(uuid.uuid4()), type=type, payload=dict(payload or {}), active=True,
                    status=TaskStatus.WAITING, finished=False, priority=priority,
                    created_at=created, updated_at=created, version=0, fence=0,
                    unique_key=unique_key)
        props = task_props(task)

        def run(g: Any) -> Any:
            if unique_key is None:
                return _add(g, "task", props).element_map().next()
            # one traversal: find the task with this key or create it
            return (g.V().has("task_unique", unique_key).fold()
                    .coalesce(__.unfold(), _add(__, "task", props))
                    .element_map().next())

        return _task(self.graph.write(run))

    def get(self, task_id: str) -> Task:
        return read_task(self.graph, task_id)

    def unfinished(self) -> list[Task]:
        rows = self.graph.read(
            lambda g: g.V().has("task_queue", "open").element_map().to_list())
        tasks = [_task(row) for row in rows]
        tasks.sort(key=lambda t: (-t.priority, t.created_at, t.id))
        return tasks

    def versions(self, task_ids: Sequence[str]) -> dict[str, int]:
        """The current version of each task that exists (one read): a cheap freshness check
        of a listing before paying for a lock and a claim."""
        if not task_ids:
            return {}
        # element_map of two keys: half the cost of project().by().by() on gremlite
        rows = self.graph.read(
            lambda g: g.V().has("task_id", P.within(list(task_ids)))
            .element_map("task_id", "task_version").to_list())
        return {r["task_id"]: int(r["task_version"]) for r in rows}

    def all(self, type: str | None = None) -> list[Task]:
        """Every task (finished ones too), newest first; optionally of one type."""
        if type is None:
            rows = self.graph.read(lambda g: g.V().has_label("task").element_map().to_list())
        else:
            rows = self.graph.read(
                lambda g: g.V().has("task_type", type).element_map().to_list())
        tasks = [_task(row) for row in rows]
        tasks.sort(key=lambda t: (t.created_at, t.id), reverse=True)
        return tasks

    def update(self, task_id: str, expected_version: int, fence_token: int | None,
               **changes: Any) -> Task:
        change = self.prepare_update(task_id, expected_version, fence_token, changes)
        self.graph.write(change.write)
        return change.task

    def prepare_update(self, task_id: str, expected_version: int, fence_token: int | None,
                       changes: Mapping[str, Any]) -> TaskChange:
        """Read and check the task now (TaskNotFound, CommitConflict, StaleFencingToken);
        the returned change is written later, guarded by the version."""
        current = read_task(self.graph, task_id)
        if current.version != expected_version:
            raise CommitConflict(task_id, expected_version, current.version)
        return task_change(current, fence_token, changes)

    def modify(self, task_id: str, fence_token: int | None, changes: Mapping[str, Any],
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
        task = self.get(task_id)
        return task if task.active is active else self.modify(task_id, None, {"active": active})

    def deactivate(self, task_id: str) -> Task:
        """Stop the task (the task loop no longer picks it); kept forever, like every task.
        A running attempt is not touched here: see ``GraphStore.cancel``."""
        return self._flip(task_id, False)

    def reactivate(self, task_id: str) -> Task:
        return self._flip(task_id, True)


# -- attempts ---------------------------------------------------------------------------------

def _attempt(row: Mapping[Any, Any]) -> Attempt:
    if "attempt_start" not in row:
        raise UnknownStoreFormat(
            f"attempt {row.get('attempt_id')!r} has no attempt_start: the graph was written by "
            f"an older latchwork; recreate it")
    start = codec.decode_json(row["attempt_start"])
    end = codec.decode_json(row["attempt_end"]) if row.get("attempt_end") else {}
    return Attempt(
        id=row["attempt_id"], task_id=start["task"], seq=int(start["seq"]),
        status=AttemptStatus(row["attempt_status"]), executor=start["executor"],
        started_at=codec.decode_time(start["started"]), fence=codec.decode_big(start["fence"]),
        ended_at=codec.decode_time(end["ended"]) if end else None,
        duration_ms=int(end["duration_ms"]) if end else None,
        error=end.get("error") or None, stack_trace=end.get("stack") or None)


class _Unmatched(Exception):
    """A guarded write matched nothing: raised to roll its transaction back."""


def matched_write(graph: Graph, guarded: Callable[[Any], Any]) -> bool:
    """Write one guarded traversal; False, rolled back, when its guards matched nothing."""
    def write(g: Any) -> None:
        if not guarded(g).id_().to_list():
            raise _Unmatched

    try:
        graph.write(write)
    except _Unmatched:
        return False
    return True


def until_written(attempt: Callable[[], X | None], what: str, tries: int = 20) -> X:
    """The store's one re-read-and-write loop: ``attempt()`` reads what it needs, decides, and
    writes one guarded traversal; it returns None when the guards matched nothing (someone
    wrote first), and is then run again after a short random pause. Raises
    :class:`CommitConflict` after ``tries`` refusals in a row; any other store error
    (StaleFencingToken, TaskNotFound, ...) ends the loop at once."""
    for n in range(tries):
        result = attempt()
        if result is not None:
            return result
        time.sleep(random.uniform(0, min(0.1, 0.002 * 2 ** n)))
    raise CommitConflict(what, -1, None)


def write_start(graph: Graph, change: TaskChange, start: AttemptStart) -> bool:
    """Write ``change`` of the task and add ``start``'s attempt to it, as one guarded
    traversal; False, nothing written, when the task's version guard refused."""
    return matched_write(graph, lambda g: start.extend(change.traverse(g)))


class GremlinAttemptLog:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def start(self, task_id: str, executor: str, fence_token: int = 0) -> Attempt:
        """Write a RUNNING attempt (before the handler runs, so a crash still leaves it) and
        count it on its task, in one traversal guarded by the task's version (re-read and
        retried when the task moved on meanwhile)."""
        def once() -> Attempt | None:
            change = task_change(read_task(self.graph, task_id), None, {}, new_attempt=True)
            start = attempt_start(change.task, executor, fence_token)
            return start.attempt if write_start(self.graph, change, start) else None
        return until_written(once, task_id)

    def finish(self, attempt_id: str, status: AttemptStatus, error: str | None = None,
               stack_trace: str | None = None) -> Attempt:
        """Close a RUNNING attempt; a second finish raises :class:`AttemptAlreadyFinished`."""
        end = attempt_end(self.get(attempt_id), status, error, stack_trace)
        self.graph.write(end.write)
        return end.attempt

    def get(self, attempt_id: str) -> Attempt:
        rows = self.graph.read(
            lambda g: g.V().has("attempt_id", attempt_id).element_map().to_list())
        if not rows:
            raise TaskNotFound(f"no attempt {attempt_id}")
        return _attempt(rows[0])

    def for_task(self, task_id: str) -> list[Attempt]:
        rows = self.graph.read(
            lambda g: g.V().has("task_id", task_id).out("has_attempt").element_map().to_list())
        return sorted((_attempt(r) for r in rows), key=lambda a: a.seq)

    def running(self) -> list[Attempt]:
        rows = self.graph.read(
            lambda g: g.V().has("attempt_status", "RUNNING").element_map().to_list())
        return sorted((_attempt(r) for r in rows), key=lambda a: (a.task_id, a.seq))


# -- ontologies -------------------------------------------------------------------------------

def _ontology(row: Mapping[Any, Any], classes: int) -> OntologyRecord:
    return OntologyRecord(iri=row["ontology_iri"], version=row["ontology_version"],
                          checksum=row["ontology_checksum"],
                          loaded_at=codec.decode_time(row["ontology_loaded"]),
                          class_count=classes)


class GremlinOntologyStore:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def load(self, ontology: Ontology, fence: Fence | None = None) -> LoadResult:
        """Insert the ontology's classes and subClassOf edges; idempotent.

        Loading the same IRI and checksum again changes nothing. A new checksum updates the
        ontology vertex and adds what is missing. Parents in other ontologies get a class vertex
        without ``class_defined_by`` until their own ontology is loaded. With ``fence`` (a
        task's owner loading it) the whole load is refused with StaleFencingToken, nothing
        written, once the token is no longer the task's.
        """
        return self.graph.write(lambda g: self._load(g, ontology, fence))

    def _load(self, g: Any, onto: Ontology, fence: Fence | None) -> LoadResult:
        if fence is not None:
            fence_guard(g, fence)
        existing = g.V().has("ontology_iri", onto.iri).element_map().to_list()
        if existing and existing[0]["ontology_checksum"] == onto.checksum:
            return LoadResult(onto.iri, 0, 0, changed=False)
        meta = {"ontology_version": onto.version, "ontology_checksum": onto.checksum,
                "ontology_loaded": codec.encode_time(codec.now())}
        if existing:
            _set(g.V().has("ontology_iri", onto.iri), meta).iterate()
        else:
            _add(g, "ontology", {"ontology_iri": onto.iri, **meta}).iterate()

        defined = {c.iri: c for c in onto.classes}
        iris = sorted(set(defined) | {p for c in onto.classes for p in c.parents})
        known = self._class_ids(g, iris)
        missing = [iri for iri in iris if iri not in known]
        for chunk in _chunks(missing, BATCH):
            t = g
            for iri in chunk:
                cls = defined.get(iri)
                t = _add(t, "class", {
                    "class_iri": iri, "class_label": (cls.label if cls else None) or "",
                    "class_defined_by": onto.iri if cls else ""})
            t.iterate()
        if missing:
            known.update(self._class_ids(g, missing))
        # claim placeholders created earlier by other ontologies' references
        adopt = [iri for iri in defined if iri not in missing and not known[iri][1]]
        for chunk in _chunks(adopt, BATCH):
            t = g
            for iri in chunk:
                t = _set(t.V(known[iri][0]), {"class_defined_by": onto.iri,
                                              "class_label": defined[iri].label or ""})
            t.iterate()

        present = self._edges_from(g, sorted(defined))
        wanted = [(c.iri, p) for c in onto.classes for p in c.parents
                  if p not in present.get(c.iri, set())]
        for pairs in _chunks(wanted, EDGE_BATCH):
            t = g
            for n, (child, parent) in enumerate(pairs):
                t = (t.V(known[child][0]).as_(f"c{n}").V(known[parent][0]).as_(f"p{n}")
                     .add_e("subClassOf").from_(f"c{n}").to(f"p{n}"))
            t.iterate()
        return LoadResult(onto.iri, len(missing), len(wanted), changed=True)

    @staticmethod
    def _class_ids(g: Any, iris: Sequence[str]) -> dict[str, tuple[Any, str]]:
        found: dict[str, tuple[Any, str]] = {}
        for chunk in _chunks(iris, BATCH):
            rows = (g.V().has("class_iri", P.within(list(chunk)))
                    .project("iri", "id", "by").by("class_iri").by(__.id_())
                    .by("class_defined_by").to_list())
            for row in rows:
                found[row["iri"]] = (row["id"], row["by"])
        return found

    @staticmethod
    def _edges_from(g: Any, iris: Sequence[str]) -> dict[str, set[str]]:
        edges: dict[str, set[str]] = {}
        for chunk in _chunks(iris, BATCH):
            rows = (g.V().has("class_iri", P.within(list(chunk)))
                    .project("c", "ps").by("class_iri")
                    .by(__.out("subClassOf").values("class_iri").fold()).to_list())
            for row in rows:
                edges[row["c"]] = set(row["ps"])
        return edges

    def get(self, iri: str) -> OntologyRecord | None:
        def run(g: Any) -> tuple[list[Any], int]:
            rows = g.V().has("ontology_iri", iri).element_map().to_list()
            count = g.V().has("class_defined_by", iri).count().next() if rows else 0
            return rows, count

        rows, count = self.graph.read(run)
        return _ontology(rows[0], count) if rows else None

    def all(self) -> list[OntologyRecord]:
        def run(g: Any) -> list[OntologyRecord]:
            rows = g.V().has_label("ontology").element_map().to_list()
            return [_ontology(r, g.V().has("class_defined_by", r["ontology_iri"]).count()
                              .next()) for r in rows]

        return sorted(self.graph.read(run), key=lambda o: o.iri)

    def ancestors(self, class_iri: str) -> set[str]:
        """Every class reachable over subClassOf (not the class itself), cycle-safe."""
        def run(g: Any) -> set[str]:
            seen: set[str] = set()
            frontier = [class_iri]
            while frontier:
                parents: set[str] = set()
                for chunk in _chunks(frontier, BATCH):
                    parents.update(g.V().has("class_iri", P.within(list(chunk)))
                                   .out("subClassOf").values("class_iri").to_list())
                frontier = sorted(parents - seen - {class_iri})
                seen.update(frontier)
            return seen

        return self.graph.read(run)

    def subclass_edges(self) -> list[tuple[str, str]]:
        rows = self.graph.read(
            lambda g: g.E().has_label("subClassOf").project("c", "p")
            .by(__.out_v().values("class_iri")).by(__.in_v().values("class_iri")).to_list())
        return sorted((r["c"], r["p"]) for r in rows)


# -- avatars ----------------------------------------------------------------------------------

def aspect_key(aspect: str) -> str:
    if not ASPECT_NAME.match(aspect):
        raise InvalidValue(f"invalid aspect name {aspect!r} (lower case, digits, _ and -)")
    return f"aspect.{aspect}"


def _avatar(row: Mapping[Any, Any]) -> Avatar:
    aspects = {k[len("aspect."):]: codec.decode_json(v) for k, v in row.items()
               if isinstance(k, str) and k.startswith("aspect.")}
    return Avatar(id=row["avatar_id"], class_iri=row["avatar_class"],
                  properties=codec.decode_json(row["avatar_props"]), aspects=aspects)


class GremlinAvatarStore:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    @staticmethod
    def _ids(g: Any, avatar_ids: Sequence[str]) -> dict[str, Any]:
        rows = (g.V().has("avatar_id", P.within(list(avatar_ids)))
                .project("a", "id").by("avatar_id").by(__.id_()).to_list())
        return {r["a"]: r["id"] for r in rows}

    def upsert(self, avatars: Sequence[Avatar], fence: Fence | None = None) -> int:
        """Create or update avatars (class and properties; aspects are left alone). With
        ``fence``, each batch is refused (StaleFencingToken) once the token is stale."""
        by_id = {a.id: a for a in avatars}
        for chunk in _chunks(list(by_id), BATCH):
            def run(g: Any, chunk: Sequence[str] = chunk) -> None:
                if fence is not None:
                    fence_guard(g, fence)
                ids = self._ids(g, chunk)
                t = g
                for avatar_id in chunk:
                    a = by_id[avatar_id]
                    props = {"avatar_class": a.class_iri,
                             "avatar_props": codec.encode_json(a.properties)}
                    if avatar_id in ids:
                        t = _set(t.V(ids[avatar_id]), props)
                    else:
                        t = _add(t, "avatar", {"avatar_id": avatar_id, **props})
                t.iterate()
            self.graph.write(run)
        return len(by_id)

    def get(self, avatar_id: str) -> Avatar:
        rows = self.graph.read(
            lambda g: g.V().has("avatar_id", avatar_id).element_map().to_list())
        if not rows:
            raise TaskNotFound(f"no avatar {avatar_id}")
        return _avatar(rows[0])

    def upsert_aspect(self, aspect: str, values: Mapping[str, Any], encoded: bool = False,
                      fence: Fence | None = None) -> int:
        """Set one aspect on many avatars; returns how many avatars exist and were written.
        With ``fence``, each batch is refused (StaleFencingToken) once the token is stale.

        Per batch: one count of the batch's avatars (an index lookup), then one traversal
        chaining ``V().has('avatar_id', id).property(...)`` per avatar. A missing avatar would
        end such a chain (no traverser left), so a batch whose count falls short first looks up
        which avatars exist and chains only those.
        """
        key = aspect_key(aspect)
        if encoded:  # JSON text already (e.g. Spark's to_json): stored as is
            texts = {k: v for k, v in values.items() if isinstance(v, str)}
            if len(texts) != len(values):
                raise InvalidValue(f"aspect {aspect}: encoded values must be JSON strings")
        else:
            texts = {avatar_id: codec.encode_json(v) for avatar_id, v in values.items()}
        written = 0
        for chunk in _chunks(list(texts), BATCH):
            def run(g: Any, chunk: Sequence[str] = chunk) -> int:
                if fence is not None:
                    fence_guard(g, fence)
                present = list(chunk)
                found = int(g.V().has("avatar_id", P.within(present)).count().next())
                if found < len(present):
                    exists = set(g.V().has("avatar_id", P.within(present))
                                 .values("avatar_id").to_list())
                    present = [a for a in present if a in exists]
                if not present:
                    return 0
                t = g
                for avatar_id in present:
                    t = (t.V().has("avatar_id", avatar_id)
                         .property(Cardinality.single, key, texts[avatar_id]))
                t.iterate()
                return len(present)
            written += self.graph.write(run)
        return written

    def remove_aspect(self, aspect: str, avatar_ids: Iterable[str] | None = None,
                      fence: Fence | None = None) -> int:
        """Remove an aspect from the given avatars (all when None); returns how many had it.
        With ``fence``, each batch is refused (StaleFencingToken) once the token is stale."""
        key = aspect_key(aspect)
        if avatar_ids is None:
            def run(g: Any) -> int:
                if fence is not None:
                    fence_guard(g, fence)
                count = int(g.V().has(key).count().next())
                g.V().has(key).properties(key).drop().iterate()
                return count
            return self.graph.write(run)
        removed = 0
        ids = sorted(set(avatar_ids))
        for chunk in _chunks(ids, BATCH):
            def run_chunk(g: Any, chunk: Sequence[str] = chunk) -> int:
                if fence is not None:
                    fence_guard(g, fence)
                t = g.V().has("avatar_id", P.within(list(chunk))).has(key)
                count = int(t.count().next())
                g.V().has("avatar_id", P.within(list(chunk))).properties(key).drop().iterate()
                return count
            removed += self.graph.write(run_chunk)
        return removed

    def count(self) -> int:
        return int(self.graph.read(lambda g: g.V().has_label("avatar").count().next()))

    def scan(self, class_iris: Iterable[str] | None = None) -> Iterator[list[Avatar]]:
        """Avatars in pages: those of ``class_iris`` (all when None), one read per page of
        classes; each page is one consistent read, pages may see later writes."""
        if class_iris is None:
            rows = self.graph.read(
                lambda g: g.V().has_label("avatar").element_map().to_list())
            for chunk in _chunks(rows, 1000):
                yield [_avatar(r) for r in chunk]
            return
        for classes in _chunks(sorted(set(class_iris)), BATCH):
            def run(g: Any, classes: Sequence[str] = classes) -> list[Any]:
                return list(g.V().has("avatar_class", P.within(list(classes)))
                            .element_map().to_list())
            rows = self.graph.read(run)
            if rows:
                yield [_avatar(r) for r in rows]

    def with_aspect(self, aspect: str) -> dict[str, Any]:
        """``avatar id -> value`` of every avatar that has the aspect."""
        key = aspect_key(aspect)
        rows = self.graph.read(
            lambda g: g.V().has(key).project("a", "v").by("avatar_id").by(key).to_list())
        return {r["a"]: codec.decode_json(r["v"]) for r in rows}


