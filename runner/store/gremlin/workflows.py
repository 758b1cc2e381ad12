"""Workflows in the graph: a ``workflow`` vertex, its members (tasks with ``task_wf``) and their
``depends_on`` edges (from a dependant to each member it depends on).

* **Submit, all or nothing.** :meth:`GremlinWorkflowStore.begin` writes the workflow vertex
  ``open`` (found again by its id, made from the submit's idempotency key);
  :meth:`~GremlinWorkflowStore.add` writes its members in pages, each as a task that waits
  (``pending`` > 0, or a root's ``awaits_commit``: queue ``deps``, in no ready bucket), with
  their edges; :meth:`~GremlinWorkflowStore.commit` turns the vertex ``running`` in one guarded
  write; :meth:`~GremlinWorkflowStore.activate` then makes the roots claimable, a page at a time
  (each root's own guarded change). Before the commit nothing is claimable; a page written
  again (a resend) adds only what is missing, tasks and edges alike.
* **Readiness.** A member's ``pending`` counts its dependencies that have not succeeded. The
  end that writes a member's success decrements it on each of its dependants in the same
  guarded write (:func:`~runner.store.gremlin.releases.releases`: each dependant's change
  guarded by its version, so two ends on two nodes never both write from the same count: the
  second is refused and written again from a fresh read); several ends of one write that
  share a dependant take one change of it.
  At 0 its queue is its ready bucket (:mod:`runner.store.due`): the scan finds it.

* **Children.** :meth:`~GremlinWorkflowStore.spawn` writes a child a running handler makes
  (``ctx.spawn``), keyed by its parent and a key of the caller's, with a ``child_of`` edge;
  each of the parent's dependants then depends on the child too, in the same write.

Failure behaviour: a graph out of reach raises ``StoreUnavailable``; a page cut off half-way
is written again by a resend (what is there is kept; what is missing added); a commit of a
workflow that is not ``open`` changes nothing and answers the workflow as it is.

Why one module: a workflow's vertex, its members, their edges and the master's rounds over
them are one layout; split, each part would rebuild the others' lookups.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from datetime import datetime

from gremlin_python.process.graph_traversal import __
from gremlin_python.process.traversal import Cardinality

from runner.errors import AttemptAlreadyFinished, InvalidValue, TaskNotFound
from runner.store import codec
from runner.store.api import Graph
from runner.store.gremlin import batch
from runner.store.gremlin.guards import Write, fence_guard, finder
from runner.store.gremlin.plans import direct_of
from runner.store.gremlin.releases import DEPENDS_ON, dependants, on_failure
from runner.store.gremlin.rows import TASK_ROW, task_from_row, task_props
from runner.store.gremlin.steps import add_vertex, any_of
from runner.store.gremlin.tasks import GremlinTaskStore
from runner.store.gremlin.writes import matched_write, task_change, until_written
from runner.store.model import (
    AttemptStatus,
    Fence,
    NewMember,
    Task,
    Workflow,
    WorkflowState,
)
from runner.store.traversal import Row, Traversal

#: the edge from a spawned child to its parent
CHILD_OF = "child_of"
#: members read or activated per page
PAGE = 200


def edge_write(member: str, dep: str) -> Write:
    """The ``depends_on`` edge from ``member`` to ``dep`` as a guarded write (both there)."""
    w = Write()
    at = w.guard(finder(("task_id", member)))
    to = w.guard(finder(("task_id", dep)))
    w.change(lambda t: t.add_e(DEPENDS_ON).from_(at).to(to), ("edge", DEPENDS_ON, {}, at, to))
    return w


def _edge_from(label: str) -> Callable[[Traversal], Traversal]:
    """A change: a ``depends_on`` edge from the vertex ``label`` to the one spawned."""
    def change(t: Traversal) -> Traversal:
        return t.add_e(DEPENDS_ON).from_(label).to("spawned")
    return change


def workflow_from_row(row: Row) -> Workflow:
    state = codec.decode_json(str(row["wf_state"]))
    return Workflow(id=str(row["wf_id"]), key=str(state["key"]),
                    state=WorkflowState(str(row["wf_open"])), members=int(state["members"]),
                    created_at=codec.decode_time(state["created"]),
                    activated=bool(state.get("activated", False)),
                    digest=str(state.get("digest", "")),
                    deadline=codec.decode_time(state["deadline"]) if state.get("deadline")
                    else None)


def _state(wf: Workflow) -> str:
    return codec.encode_json({"key": wf.key, "members": wf.members,
                              "created": codec.encode_time(wf.created_at),
                              "activated": wf.activated, "digest": wf.digest,
                              "deadline": codec.encode_time(wf.deadline) if wf.deadline
                              else ""})


class GremlinWorkflowStore:
    """Workflows on the graph (see the module)."""

    def __init__(self, graph: Graph, tasks: GremlinTaskStore) -> None:
        self.graph = graph
        self.tasks = tasks
        self._settle_at = 0  # where the next settle() looks (the running ones in turn)

    def begin(self, workflow_id: str, key: str, members: int, digest: str = "",
              deadline: datetime | None = None) -> Workflow:
        """The workflow ``workflow_id``, written ``open`` unless it exists (then as it is)."""
        wf = Workflow(workflow_id, key, WorkflowState.OPEN, members, codec.now(),
                      digest=digest, deadline=deadline)
        # ``wf_roots``: "1" until every root was activated (the master finds those left);
        # ``wf_due``: "1" while its deadline is to be enforced
        props = {"wf_id": wf.id, "wf_open": wf.state.value, "wf_state": _state(wf),
                 "wf_roots": "1", "wf_due": "1" if deadline is not None else ""}

        def write(g: Traversal) -> list[Row]:
            return list(g.V().has("wf_id", workflow_id).fold().coalesce(
                __.unfold(), add_vertex(__, "workflow", props)).element_map().to_list())
        return workflow_from_row(self.graph.write(write)[0])

    def get(self, workflow_id: str) -> Workflow:
        rows = self.graph.read(lambda g: g.V().has("wf_id", workflow_id).element_map()
                               .to_list())
        if not rows:
            raise TaskNotFound(f"no workflow {workflow_id}")
        return workflow_from_row(rows[0])

    def add(self, workflow_id: str, members: Sequence[NewMember]) -> list[Task]:
        """Write a page of ``members`` (each after what it depends on: in this page or an
        earlier one) that are not there yet, and every edge of theirs that is missing; the
        members as stored (one holding a ``unique_key`` of a task outside the workflow: that
        task, which the caller refuses)."""
        for m in members:
            if m.task.workflow != workflow_id or (m.task.pending == 0
                                                  and not m.task.awaits_commit) or (
                    m.task.on_failure and (m.task.pending != 1 or m.depends_on)):
                raise InvalidValue(f"task {m.task.id} is not a waiting member of workflow "
                                   f"{workflow_id}")
        stored = self.tasks.add_many([m.task for m in members], again=True)
        wanted = {(m.task.id, dep) for m in members for dep in m.depends_on}
        if wanted:
            have = set(self._edges([m.task.id for m in members if m.depends_on]))
            missing = [edge_write(member, dep) for member, dep in sorted(wanted - have)]
            direct = direct_of(self.graph)
            if direct is not None:  # one transaction, by SQL (a join's 10,000 edges)
                batch.write_plans(direct, missing)
            else:
                for w in missing:
                    batch.matched(self.graph, w)
        return stored

    def _edges(self, dependants: Sequence[str]) -> list[tuple[str, str]]:
        """The ``(dependant, dependency)`` pairs of ``dependants``' edges (each once)."""
        if not dependants:
            return []
        rows = self.graph.read(
            lambda g: any_of(self.graph, g, "task_id", list(dependants)).as_("d")
            .out(DEPENDS_ON).project("d", "on").by(__.select("d").values("task_id"))
            .by(__.values("task_id")).to_list())
        return sorted({(str(r["d"]), str(r["on"])) for r in rows})

    def commit(self, workflow_id: str) -> Workflow:
        """Turn the workflow ``running`` (one guarded write: only from ``open``); the workflow
        as it is then."""
        current = self.get(workflow_id)
        if current.state is WorkflowState.OPEN:
            matched_write(self.graph, lambda g: g.V().has("wf_id", workflow_id)
                          .has("wf_open", WorkflowState.OPEN.value)
                          .property(Cardinality.single, "wf_open",
                                    WorkflowState.RUNNING.value))
        return self.get(workflow_id)

    def activate(self, workflow_id: str, limit: int = PAGE) -> int:
        """Make up to ``limit`` roots of a committed workflow claimable (each its own guarded
        change: ``awaits_commit`` off, its queue its ready bucket); how many were. Once none is
        left the workflow records that every root was (``activated``)."""
        wf = self.get(workflow_id)
        if wf.state is WorkflowState.OPEN:
            raise InvalidValue(f"workflow {workflow_id} is not committed: none of it may start")
        direct = direct_of(self.graph)
        rows = (direct.run(lambda plans, g: plans.rows(
                    plans.having("task_wfwait", [workflow_id], limit), TASK_ROW))
                if direct is not None else  # the embedded graph: SQL, not a traversal
                self.graph.read(lambda g: g.V().has("task_wfwait", workflow_id).limit(limit)
                                .element_map(*TASK_ROW).to_list()))
        writes = []
        for row in rows:
            w = Write()
            task_change(task_from_row(row), None, {"awaits_commit": False}).add_to(w)
            writes.append(w)
        done = (len(batch.write_plans(direct, writes)) if direct is not None and writes
                else sum(batch.matched(self.graph, w) for w in writes))
        if not rows and not wf.activated:
            marked = dataclasses.replace(wf, activated=True)
            matched_write(self.graph, lambda g: g.V().has("wf_id", workflow_id)
                          .property(Cardinality.single, "wf_state", _state(marked))
                          .property(Cardinality.single, "wf_roots", ""))
        return done

    def stale(self, opened_before: datetime) -> tuple[list[Workflow], list[Workflow]]:
        """What the master's round looks at (two index lookups): the workflows still ``open``
        (or being removed) that were begun before ``opened_before``, and the committed ones
        whose roots were not all activated."""
        rows = self.graph.read(lambda g: any_of(self.graph, g, "wf_open", [
            WorkflowState.OPEN.value, WorkflowState.REMOVING.value]).element_map().to_list())
        left = [w for w in map(workflow_from_row, rows) if w.created_at < opened_before]
        rows = self.graph.read(lambda g: g.V().has("wf_roots", "1").element_map().to_list())
        committed = [w for w in map(workflow_from_row, rows)
                     if w.state is WorkflowState.RUNNING]
        return left, committed

    def settle(self, limit: int = 100) -> list[str]:
        """Mark ``succeeded`` the running workflows every member of which finished (an
        ``on_failure`` step that never ran aside): ``limit`` of them a call, taken in turn
        (a workflow that stays blocked does not keep the others from being looked at), one
        lookup of a member that has not finished each. The ids marked."""
        ids = sorted(map(str, self.graph.read(
            lambda g: g.V().has("wf_open", WorkflowState.RUNNING.value).values("wf_id")
            .to_list())))
        start = self._settle_at if self._settle_at < len(ids) else 0
        window = ids[start:start + limit]
        self._settle_at = start + len(window)
        done = []
        for wf in window:
            if not self._left(wf) and self._mark(wf, WorkflowState.RUNNING,
                                                 WorkflowState.SUCCEEDED):
                done.append(wf)
        return done

    def _left(self, wf: str) -> bool:
        """Whether a member of ``wf`` has not finished (its standby on_failure step aside)."""
        return bool(self.graph.read(
            lambda g: g.V().has("task_wf", wf).not_(__.has("task_end_day"))
            .not_(__.has("task_wfonfail", wf)).limit(1).id_().to_list()))

    def _mark(self, wf: str, was: WorkflowState, now: WorkflowState) -> bool:
        """``wf`` from ``was`` to ``now`` in one guarded write; False when it was not ``was``."""
        return matched_write(self.graph, lambda g: g.V().has("wf_id", wf)
                             .has("wf_open", was.value)
                             .property(Cardinality.single, "wf_open", now.value))

    def counts(self) -> dict[str, int]:
        """How many workflows are in each state (an index lookup per state)."""
        return {state.value: self._count(state.value) for state in WorkflowState}

    def _count(self, state: str) -> int:
        return int(self.graph.read(lambda g: g.V().has("wf_open", state).count().next()))

    def due(self, now: datetime) -> list[Workflow]:
        """The committed workflows whose deadline passed and is not yet enforced (one index
        lookup)."""
        rows = self.graph.read(lambda g: g.V().has("wf_due", "1").element_map().to_list())
        return [w for w in map(workflow_from_row, rows) if w.state is WorkflowState.RUNNING
                and w.deadline is not None and w.deadline <= now]

    def start_on_failure(self, workflow_id: str) -> bool:
        """Start the workflow's ``on_failure`` step (the master, when its deadline stopped
        members); False when it has none or it started already."""
        changes = on_failure(self.graph, [workflow_id])
        return any(matched_write(self.graph, c.traverse) for c in changes)

    def enforced(self, workflow_id: str) -> None:
        """The workflow's deadline was enforced: the round looks at it no more."""
        matched_write(self.graph, lambda g: g.V().has("wf_id", workflow_id)
                      .property(Cardinality.single, "wf_due", ""))

    def remove(self, workflow_id: str) -> int:
        """Remove a workflow left ``open``: first marked ``removing`` (one guarded write, so a
        commit that comes now is refused), then its members with their edges, then its vertex;
        how many members went. One committed meanwhile is left alone (0)."""
        if self.get(workflow_id).state is WorkflowState.OPEN:
            matched_write(self.graph, lambda g: g.V().has("wf_id", workflow_id)
                          .has("wf_open", WorkflowState.OPEN.value)
                          .property(Cardinality.single, "wf_open",
                                    WorkflowState.REMOVING.value))
        if self.get(workflow_id).state is not WorkflowState.REMOVING:
            return 0
        gone = 0
        while True:
            ids = self.graph.read(lambda g: g.V().has("task_wf", workflow_id).limit(PAGE)
                                  .values("task_id").to_list())
            if not ids:
                break

            def drop(g: Traversal, ids: list[str] = ids) -> None:
                any_of(self.graph, g, "task_id", ids).drop().iterate()
            self.graph.write(drop)
            gone += len(ids)
        self.graph.write(lambda g: g.V().has("wf_id", workflow_id).drop().iterate())
        return gone

    def members(self, workflow_id: str) -> list[Task]:
        """Every member of the workflow (its ``task_wf`` index)."""
        rows = self.graph.read(lambda g: g.V().has("task_wf", workflow_id)
                               .element_map(*TASK_ROW).to_list())
        return sorted((task_from_row(r) for r in rows), key=lambda t: t.created_at)

    def depends_on(self, task_ids: Sequence[str]) -> dict[str, list[str]]:
        """What each of ``task_ids`` depends on (task ids), by dependant."""
        out: dict[str, list[str]] = {}
        for dependant, dep in self._edges(task_ids):
            out.setdefault(dependant, []).append(dep)
        return out

    def spawn(self, fence: Fence, parent: Task, child: Task) -> Task:
        """Write ``child`` (``tasks.new``, its id made from the parent's id and the caller's
        key) as a child of ``parent`` (a ``child_of`` edge), claimable at once, fenced by the
        parent's running attempt (``fence``): each of the parent's dependants then also depends
        on the child (an edge, and its count one more, in the same guarded write: it starts
        only once the parent and every child succeeded). A child already there (spawned by
        this attempt or an earlier one) is answered as it is, nothing written. The parent's
        attempt closed or its token superseded: ``AttemptAlreadyFinished`` /
        ``StaleFencingToken``, nothing written."""
        if fence.attempt_id is None:
            raise InvalidValue("a child is spawned by an attempt: its fence names none")
        child = dataclasses.replace(child, workflow=parent.workflow, pending=0,
                                    awaits_commit=False)
        props = task_props(child)

        def once() -> Task | None:
            direct = direct_of(self.graph)
            found = (direct.run(lambda plans, g: plans.rows(
                         plans.having("task_id", [child.id], 1), TASK_ROW))
                     if direct is not None else
                     self.graph.read(lambda g: g.V().has("task_id", child.id)
                                     .element_map(*TASK_ROW).to_list()))
            if found:
                return task_from_row(found[0])
            w = Write()
            w.guard(finder(("attempt_id", fence.attempt_id),
                           ("attempt_status", AttemptStatus.RUNNING.value)))
            at_parent = w.guard(finder(("task_id", parent.id),
                                       ("task_fence", codec.encode_big(fence.token))))
            waiting = [task_change(d, None, {"pending": d.pending + 1}).add_to
                       for d in dependants(self.graph, [parent.id])[0].values()
                       if not d.finished]
            labels = [add(w) for add in waiting]
            # each change with its data form: on the embedded graph the whole spawn is SQL
            w.change(lambda t: add_vertex(t, "task", props).as_("spawned"),
                     ("new", "task", props, "spawned"))
            w.change(lambda t: t.add_e(CHILD_OF).from_("spawned").to(at_parent),
                     ("edge", CHILD_OF, {}, "spawned", at_parent))
            for label in labels:
                w.change(_edge_from(label), ("edge", DEPENDS_ON, {}, label, "spawned"))
            if batch.matched(self.graph, w):
                return child
            status = self.graph.read(lambda g: g.V().has("attempt_id", fence.attempt_id)
                                     .values("attempt_status").to_list())
            if status and status[0] != AttemptStatus.RUNNING.value:
                raise AttemptAlreadyFinished(f"attempt {fence.attempt_id} is {status[0]}: "
                                             f"its child {child.id} was not spawned")
            self.graph.read(lambda g: fence_guard(g, fence))  # StaleFencingToken
            return None  # a dependant moved (another end, another spawn): again
        return until_written(once, child.id)

    def children(self, parent_id: str) -> list[Task]:
        """The children ``parent_id`` spawned (any attempt of it)."""
        rows = self.graph.read(lambda g: g.V().has("task_id", parent_id).in_(CHILD_OF)
                               .element_map(*TASK_ROW).to_list())
        return sorted((task_from_row(r) for r in rows), key=lambda t: t.created_at)
