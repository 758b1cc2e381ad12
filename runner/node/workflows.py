"""Workflows at a node (``workflow.submit``, ``workflow.show``, ``workflow.cancel``): a page
taken into the store (:mod:`runner.tasks.flows`) and the scans woken once its commit activated
roots; a workflow's report (each member's state, ``blocked`` for one waiting for a stopped
member, a group's members past :data:`COLLAPSE` as one entry); a cancel of what is left.

Failure behaviour: as :mod:`runner.tasks.flows` says for a submit; an unknown workflow is
``task_not_found``; the store's errors propagate.
"""

from __future__ import annotations

import logging
from collections import Counter

from runner.node import intake
from runner.node.intake import Intake
from runner.replies import (
    WorkflowCancelled,
    WorkflowMemberView,
    WorkflowReport,
    WorkflowView,
)
from runner.requests import REPORT_MEMBERS, WorkflowSubmit
from runner.store import Store, Task, TaskState, Workflow, codec
from runner.tasks.flows import take_page
from runner.workflows import member_id

log = logging.getLogger("latchwork.node")
#: siblings (a group's members) past this many are one entry of a workflow's report
COLLAPSE = 50

def view(wf: Workflow) -> WorkflowView:
    return WorkflowView(id=wf.id, key=wf.key, state=wf.state.value, members=wf.members,
                        created_at=wf.created_at, activated=wf.activated)


def submit(node: Intake, req: WorkflowSubmit) -> WorkflowView:
    """Take one page of a workflow (:func:`runner.tasks.flows.take_page`); once its commit
    activated roots, every node is told to scan."""
    wf, activated = take_page(node.store, node.registry, req)
    if activated:
        now = codec.now()
        node.processor.trigger(now)
        node.bus.broadcast("TRIGGER_SCAN", {"workflow": wf.id, "behind": now.isoformat()})
    if req.commit:
        log.info("member %s: workflow %s (%s) committed: %d members, %d roots started",
                 node.member_id, wf.id, req.key, wf.members, activated)
    return view(wf)


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
                error=next((blocked_by.get(t.id) or _own_error(node.store, t) for t in kin
                            if states[t.id] in ("failed", "blocked")), None)))
            continue
        views.append(WorkflowMemberView(
            id=task.id, type=task.type, state=states[task.id], attempts=task.attempts,
            depends_on=on, pending=task.pending,
            error=blocked_by.get(task.id) or _own_error(node.store, task)))
    return WorkflowReport(workflow=view(wf), members=views, counts=dict(counts),
                          more=max(0, listed - len(views)))


def blocked(store: Store, task: Task, depth: int = 50) -> str | None:
    """Why ``task``, a member that waits for its dependencies, waits for ever: the error of
    the stopped member it waits for (directly, or through members that wait too, up to
    ``depth`` steps up); None while it may still start. One read per step."""
    if task.workflow is None or not task.open or not task.pending or depth == 0:
        return None
    deps = store.workflows.depends_on([task.id]).get(task.id, [])
    for dep_id in deps:
        dep = store.tasks.get(dep_id)
        if dep.stored_state() in (TaskState.FAILED, TaskState.CANCELLED):
            return f"{dep.type} {dep.id} {dep.stored_state().value}: {_own_error(store, dep) or ''}"
        why = blocked(store, dep, depth - 1)
        if why is not None:
            return why
    return None


def _stopped_error(node: Intake, dep: Task | None, blocked_by: dict[str, str]) -> str | None:
    """Why a member waiting for ``dep`` waits for ever: ``dep`` stopped (its error), or it is
    itself blocked; None while ``dep`` may still succeed."""
    if dep is None:
        return None
    if dep.id in blocked_by:
        return blocked_by[dep.id]
    if dep.stored_state() in (TaskState.FAILED, TaskState.CANCELLED):
        why = _own_error(node.store, dep) or ""
        return f"{dep.type} {dep.id} {dep.stored_state().value}: {why}"
    return None


def _own_error(store: Store, task: Task) -> str | None:
    if task.stored_state() not in (TaskState.FAILED, TaskState.CANCELLED):
        return None
    attempts = store.attempts.for_task(task.id)
    return (attempts[-1].error if attempts else None) or task.stop_reason

