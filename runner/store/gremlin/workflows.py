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

Failure behaviour: a graph out of reach raises ``StoreUnavailable``; a page cut off half-way
is written again by a resend (what is there is kept; what is missing added); a commit of a
workflow that is not ``open`` changes nothing and answers the workflow as it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gremlin_python.process.graph_traversal import __
from gremlin_python.process.traversal import Cardinality

from runner.errors import InvalidValue, TaskNotFound
from runner.store import codec
from runner.store.api import Graph
from runner.store.gremlin.releases import DEPENDS_ON
from runner.store.gremlin.rows import TASK_ROW, task_from_row
from runner.store.gremlin.steps import add_vertex, any_of
from runner.store.gremlin.tasks import GremlinTaskStore
from runner.store.gremlin.writes import matched_write, task_change
from runner.store.model import NewMember, Task, Workflow, WorkflowState
from runner.store.traversal import Row, Traversal

#: members read or activated per page
PAGE = 200


def workflow_from_row(row: Row) -> Workflow:
    state = codec.decode_json(str(row["wf_state"]))
    return Workflow(id=str(row["wf_id"]), key=str(state["key"]),
                    state=WorkflowState(str(row["wf_open"])), members=int(state["members"]),
                    created_at=codec.decode_time(state["created"]),
                    activated=bool(state.get("activated", False)),
                    digest=str(state.get("digest", "")))


def _state(wf: Workflow) -> str:
    return codec.encode_json({"key": wf.key, "members": wf.members,
                              "created": codec.encode_time(wf.created_at),
                              "activated": wf.activated, "digest": wf.digest})


class GremlinWorkflowStore:
    """Workflows on the graph (see the module)."""

    def __init__(self, graph: Graph, tasks: GremlinTaskStore) -> None:
        self.graph = graph
        self.tasks = tasks

    def begin(self, workflow_id: str, key: str, members: int, digest: str = "") -> Workflow:
        """The workflow ``workflow_id``, written ``open`` unless it exists (then as it is)."""
        wf = Workflow(workflow_id, key, WorkflowState.OPEN, members, codec.now(),
                      digest=digest)
        props = {"wf_id": wf.id, "wf_open": wf.state.value, "wf_state": _state(wf)}

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
                                                  and not m.task.awaits_commit):
                raise InvalidValue(f"task {m.task.id} is not a waiting member of workflow "
                                   f"{workflow_id}")
        stored = self.tasks.add_many([m.task for m in members], again=True)
        wanted = {(m.task.id, dep) for m in members for dep in m.depends_on}
        if wanted:
            have = set(self._edges([m.task.id for m in members if m.depends_on]))
            missing = sorted(wanted - have)

            def write(g: Traversal) -> None:
                for member, dep in missing:
                    g.V().has("task_id", member).as_("m").V().has("task_id", dep) \
                        .add_e(DEPENDS_ON).from_("m").iterate()
            if missing:
                self.graph.write(write)
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
        rows = self.graph.read(lambda g: g.V().has("task_wfwait", workflow_id).limit(limit)
                               .element_map(*TASK_ROW).to_list())
        done = 0
        for row in rows:
            task = task_from_row(row)
            change = task_change(task, None, {"awaits_commit": False})
            done += matched_write(self.graph, change.traverse)
        if not rows and not wf.activated:
            marked = dataclasses.replace(wf, activated=True)
            matched_write(self.graph, lambda g: g.V().has("wf_id", workflow_id)
                          .property(Cardinality.single, "wf_state", _state(marked)))
        return done

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
