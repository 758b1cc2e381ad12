"""Taking a workflow's submit into the store: a page of members written waiting, the last
page's commit and its roots' activation (``workflow.submit``, and the node's own workflows: the
ontology sync's). The node wraps it (:mod:`runner.node.workflows`: the scans woken); a caller
with a store and a registry alone (a test, a tool) uses :func:`submit_flow`.

A page's members get the ids their workflow's key makes (:func:`runner.workflows.member_id`),
each validated as a submit is (its type known, its payload its model's), and are written
waiting (:meth:`~runner.store.api.WorkflowStore.add`: only what a sending before did not
write); the last page commits the workflow and activates its roots. A resend of a committed
workflow's pages writes nothing and activates what is left.

Failure behaviour: an unknown type or an invalid payload refuses the page naming the member's
index, before anything is written; a key already used by another workflow (another digest), or
a member whose ``unique_key`` a task outside the workflow holds, raises
:class:`~runner.errors.WorkflowRefused` naming it (nothing of the workflow is claimable: its
pages are removed by the master once it has been open for
:data:`~runner.tasks.master.workflows.OPEN_FOR`, or adopted by a resend with the same key); a
workflow the master is removing (left open too long) is refused until it is gone; the store's
errors propagate.
"""

from __future__ import annotations

import dataclasses

from runner.errors import TaskError, WorkflowRefused
from runner.requests import WorkflowSubmit, submitted, workflow_pages
from runner.store import NewMember, Store, Task, Workflow, WorkflowState
from runner.tasks.registry import TaskRegistry
from runner.templates import TaskTemplate
from runner.workflows import Flow, WorkflowRef, member_id, workflow_id


def take_page(store: Store, registry: TaskRegistry, req: WorkflowSubmit
              ) -> tuple[Workflow, int]:
    """Take one page of a workflow (see the module): the workflow as it is then, and how many
    roots the commit (on the last page) activated."""
    wf_id = workflow_id(req.key)
    wf = store.workflows.begin(wf_id, req.key, req.total, req.digest, req.deadline)
    if wf.digest != req.digest or wf.members != req.total:
        raise WorkflowRefused(f"workflow key {req.key!r} is taken by another workflow ({wf.id}, "
                              f"{wf.members} members, submitted {wf.created_at.isoformat()}): "
                              "give this one a key of its own")
    if wf.state is WorkflowState.REMOVING:
        raise WorkflowRefused(f"workflow {wf_id} (key {req.key!r}) was left open too long and "
                              "is being removed: send it again in a moment")
    if wf.state is WorkflowState.OPEN and req.start == 0 and req.on_failure is not None:
        store.workflows.add(wf_id, [NewMember(dataclasses.replace(
            _task(store, registry, req.on_failure, "its on_failure step"),
            id=member_id(wf_id, req.total), workflow=wf_id, pending=1, on_failure=True))])
    if wf.state is WorkflowState.OPEN and req.members:
        _write(store, registry, wf_id, req)
    if not req.commit:
        return wf, 0
    wf = store.workflows.commit(wf_id)
    if wf.state not in (WorkflowState.RUNNING, WorkflowState.SUCCEEDED):
        raise WorkflowRefused(f"workflow {wf_id} (key {req.key!r}) was left open too long "
                              "and is being removed: send it again in a moment")
    activated = 0
    while (done := store.workflows.activate(wf_id)) > 0:
        activated += done
    return store.workflows.get(wf_id), activated


def submit_flow(store: Store, registry: TaskRegistry, flow: Flow, key: str) -> WorkflowRef:
    """Every page of ``flow`` under ``key`` taken here (no scan is woken: the scans find the
    roots within their interval)."""
    pages = workflow_pages(flow, key)
    answer = None
    for req in pages:
        answer, _ = take_page(store, registry, req)
    assert answer is not None
    return submitted(pages[0], answer)


def _write(store: Store, registry: TaskRegistry, wf_id: str, req: WorkflowSubmit) -> None:
    members: list[NewMember] = []
    for n, spec in enumerate(req.members, req.start):
        task = dataclasses.replace(_task(store, registry, spec.task,
                                         f"member {n} of the workflow"),
                                   id=member_id(wf_id, n), workflow=wf_id,
                                   pending=len(set(spec.after)), awaits_commit=not spec.after)
        members.append(NewMember(task, tuple(sorted({member_id(wf_id, i)
                                                     for i in spec.after}))))
    stored = store.workflows.add(wf_id, members)
    for n, (mine, found) in enumerate(zip(members, stored, strict=True), req.start):
        if found.id != mine.task.id:
            raise WorkflowRefused(f"member {n} of the workflow: its unique key "
                                  f"{mine.task.unique_key!r} is held by task {found.id} "
                                  f"({found.type}, {found.stored_state().value}), outside "
                                  "the workflow")


def _task(store: Store, registry: TaskRegistry, item: TaskTemplate, what: str) -> Task:
    """The task ``item`` describes, validated as a submit is (``what`` names it in an
    error)."""
    try:
        kind = registry.get(item.type)
        kind.parse(item.payload)
    except TaskError as exc:
        raise type(exc)(f"{what}: {exc}") from exc
    return store.tasks.new(
        item.type, item.payload, unique_key=item.unique_key,
        priority=kind.priority if item.priority is None else item.priority,
        run_at=item.when(), ordering_key=item.ordering_key,
        resources=[*kind.resources, *item.resources], timeout=item.timeout)
