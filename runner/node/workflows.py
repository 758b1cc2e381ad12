"""Workflows coming into a node (``workflow.submit``, ``workflow.show``): a page of members
written waiting, the last page's commit, and a workflow's report.

A page's members get the ids their workflow's key makes (:func:`runner.workflows.member_id`),
each validated as a submit is (its type known, its payload its model's), and are written
waiting (:meth:`~runner.store.api.WorkflowStore.add`: only what a sending before did not
write); the last page commits the workflow and activates its roots, then every node is told
to scan. A resend of a committed workflow's pages writes nothing and activates what is left.

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
import logging
from collections import Counter

from runner.errors import TaskError, WorkflowRefused
from runner.node import intake
from runner.node.intake import Intake
from runner.replies import (
    WorkflowCancelled,
    WorkflowMemberView,
    WorkflowReport,
    WorkflowView,
)
from runner.requests import REPORT_MEMBERS, WorkflowSubmit
from runner.store import NewMember, Task, TaskState, Workflow, WorkflowState, codec
from runner.templates import TaskTemplate
from runner.workflows import member_id, workflow_id

log = logging.getLogger("latchwork.node")
#: siblings (a group's members) past this many are one entry of a workflow's report
COLLAPSE = 50

def view(wf: Workflow) -> WorkflowView:
    return WorkflowView(id=wf.id, key=wf.key, state=wf.state.value, members=wf.members,
                        created_at=wf.created_at, activated=wf.activated)


def submit(node: Intake, req: WorkflowSubmit) -> WorkflowView:
    """Take one page of a workflow (see the module)."""
    wf_id = workflow_id(req.key)
    wf = node.store.workflows.begin(wf_id, req.key, req.total, req.digest, req.deadline)
    if wf.digest != req.digest or wf.members != req.total:
        raise WorkflowRefused(f"workflow key {req.key!r} is taken by another workflow ({wf.id}, "
                              f"{wf.members} members, submitted {wf.created_at.isoformat()}): "
                              "give this one a key of its own")
    if wf.state is WorkflowState.REMOVING:
        raise WorkflowRefused(f"workflow {wf_id} (key {req.key!r}) was left open too long and "
                              "is being removed: send it again in a moment")
    if wf.state is WorkflowState.OPEN and req.start == 0 and req.on_failure is not None:
        node.store.workflows.add(wf_id, [NewMember(dataclasses.replace(
            _task(node, req.on_failure, "its on_failure step"), id=member_id(wf_id, req.total),
            workflow=wf_id, pending=1, on_failure=True))])
    if wf.state is WorkflowState.OPEN and req.members:
        _write(node, wf_id, req)
    if req.commit:
        wf = node.store.workflows.commit(wf_id)
        if wf.state is not WorkflowState.RUNNING:  # the master's removal came first
            raise WorkflowRefused(f"workflow {wf_id} (key {req.key!r}) was left open too long "
                                  "and is being removed: send it again in a moment")
        activated = 0
        while (done := node.store.workflows.activate(wf_id)) > 0:
            activated += done
        wf = node.store.workflows.get(wf_id)
        if activated:
            now = codec.now()
            node.processor.trigger(now)
            node.bus.broadcast("TRIGGER_SCAN", {"workflow": wf_id,
                                                "behind": now.isoformat()})
        log.info("member %s: workflow %s (%s) committed: %d members, %d roots started",
                 node.member_id, wf_id, req.key, wf.members, activated)
    return view(wf)


def _write(node: Intake, wf_id: str, req: WorkflowSubmit) -> None:
    members: list[NewMember] = []
    for n, spec in enumerate(req.members, req.start):
        task = dataclasses.replace(_task(node, spec.task, f"member {n} of the workflow"),
                                   id=member_id(wf_id, n), workflow=wf_id,
                                   pending=len(set(spec.after)), awaits_commit=not spec.after)
        members.append(NewMember(task, tuple(sorted({member_id(wf_id, i)
                                                     for i in spec.after}))))
    stored = node.store.workflows.add(wf_id, members)
    for n, (mine, found) in enumerate(zip(members, stored, strict=True), req.start):
        if found.id != mine.task.id:
            raise WorkflowRefused(f"member {n} of the workflow: its unique key "
                                  f"{mine.task.unique_key!r} is held by task {found.id} "
                                  f"({found.type}, {found.stored_state().value}), outside "
                                  "the workflow")


def cancel(node: Intake, wf_id: str, by: str, reason: str | None) -> WorkflowCancelled:
    """Cancel every unfinished member (:func:`runner.node.intake.cancel` of each: a running
    one is stopped cluster-wide); what succeeded stays. Members still waiting keep waiting
    cancelled: nothing of the workflow starts again unless reactivated."""
    node.store.workflows.get(wf_id)  # task_not_found for an unknown workflow
    done = []
    for task in node.store.workflows.members(wf_id):
        if task.open:
            intake.cancel(node, task.id, by, reason or f"workflow {wf_id} cancelled")
            done.append(task.id)
    log.info("member %s: workflow %s: %d members cancelled by %s", node.member_id, wf_id,
             len(done), by)
    return WorkflowCancelled(id=wf_id, cancelled=done)


def _task(node: Intake, item: TaskTemplate, what: str) -> Task:
    """The task ``item`` describes, validated as a submit is (``what`` names it in an
    error)."""
    try:
        kind = node.registry.get(item.type)
        kind.parse(item.payload)
    except TaskError as exc:
        raise type(exc)(f"{what}: {exc}") from exc
    return node.store.tasks.new(
        item.type, item.payload, unique_key=item.unique_key,
        priority=kind.priority if item.priority is None else item.priority,
        run_at=item.when(), ordering_key=item.ordering_key,
        resources=[*kind.resources, *item.resources], timeout=item.timeout)


def state_of(task: Task, blocked: bool) -> str:
    """A member's state: its task's, ``blocked`` while it waits for a stopped one, or
    ``standby`` for an ``on_failure`` step that waits for a stop."""
    if task.on_failure and task.pending and task.open:
        return "standby"
    if blocked and task.open:
        return "blocked"
    return task.state(codec.now()).value


def report(node: Intake, wf_id: str) -> WorkflowReport:
    """The workflow and its members (see :class:`~runner.replies.WorkflowReport`)."""
    wf = node.store.workflows.get(wf_id)
    members = node.store.workflows.members(wf_id)
    deps = node.store.workflows.depends_on([t.id for t in members])
    by_id = {t.id: t for t in members}
    order = {member_id(wf_id, n): n for n in range(wf.members)}
    members.sort(key=lambda t: order.get(t.id, len(order)))
    blocked_by: dict[str, str] = {}
    for task in members:  # each after what it depends on: a dependency is decided first
        for dep in deps.get(task.id, ()):
            why = _stopped_error(node, by_id.get(dep), blocked_by)
            if why is not None and task.pending:
                blocked_by[task.id] = why
                break
    states = {t.id: state_of(t, t.id in blocked_by) for t in members}
    counts = Counter(states.values())
    # siblings (the same type, dependencies and dependants: a group's members) past COLLAPSE
    # are one entry with counts per state, and what depends on them names their first
    dependants: dict[str, list[str]] = {}
    for task_id, on in deps.items():
        for dep in on:
            dependants.setdefault(dep, []).append(task_id)
    siblings: dict[tuple[object, ...], list[Task]] = {}
    for task in members:
        siblings.setdefault((task.type, tuple(sorted(deps.get(task.id, ()))),
                             tuple(sorted(dependants.get(task.id, ())))), []).append(task)
    first = {t.id: kin[0].id for kin in siblings.values() if len(kin) > COLLAPSE for t in kin}
    views: list[WorkflowMemberView] = []
    listed = 0
    for task in members:
        if first.get(task.id, task.id) != task.id:
            continue
        listed += 1
        if len(views) >= REPORT_MEMBERS:
            continue
        on = sorted({first.get(d, d) for d in deps.get(task.id, ())})
        if task.id in first:
            kin = next(k for k in siblings.values() if k[0].id == task.id)
            views.append(WorkflowMemberView(
                id=task.id, type=task.type, state="group", attempts=sum(t.attempts for t in kin),
                depends_on=on, count=len(kin), counts=dict(Counter(states[t.id] for t in kin)),
                error=next((blocked_by.get(t.id) or _own_error(node, t) for t in kin
                            if states[t.id] in ("failed", "blocked")), None)))
            continue
        views.append(WorkflowMemberView(
            id=task.id, type=task.type, state=states[task.id], attempts=task.attempts,
            depends_on=on, pending=task.pending,
            error=blocked_by.get(task.id) or _own_error(node, task)))
    return WorkflowReport(workflow=view(wf), members=views, counts=dict(counts),
                          more=max(0, listed - len(views)))


def _stopped_error(node: Intake, dep: Task | None, blocked_by: dict[str, str]) -> str | None:
    """Why a member waiting for ``dep`` waits for ever: ``dep`` stopped (its error), or it is
    itself blocked; None while ``dep`` may still succeed."""
    if dep is None:
        return None
    if dep.id in blocked_by:
        return blocked_by[dep.id]
    if dep.stored_state() in (TaskState.FAILED, TaskState.CANCELLED):
        return f"{dep.type} {dep.id} {dep.stored_state().value}: {_own_error(node, dep) or ''}"
    return None


def _own_error(node: Intake, task: Task) -> str | None:
    if task.stored_state() not in (TaskState.FAILED, TaskState.CANCELLED):
        return None
    attempts = node.store.attempts.for_task(task.id)
    return (attempts[-1].error if attempts else None) or task.stop_reason

