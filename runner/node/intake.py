"""What comes into a node as tasks: a submit, a page of them, an operator's cancel. The node
(:class:`~runner.node.node.Node`) hands each here with itself (:class:`Intake`: the parts
these need), and answers what these return.

Failure behaviour: a payload its type's model refuses, or an unknown type, raises the task's
error before anything is written (for a page: naming the task's index); the store's and
ZooKeeper's errors propagate with nothing written.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import replace
from datetime import datetime
from typing import Protocol

from coord import Session, force_release
from coord.mailbox import post
from messaging import MessageBus
from runner.errors import TaskError
from runner.replies import Cancelled
from runner.requests import TaskSubmit, TaskSubmitMany, page_task_id, submit_task_id
from runner.store import Store, Task
from runner.store.due import ready_at
from runner.tasks import TaskRegistry, due
from runner.tasks.worker.loop import Admission, TaskLoop

log = logging.getLogger("latchwork.node")


class Intake(Protocol):
    """The parts of a started node that take tasks in."""

    @property
    def registry(self) -> TaskRegistry: ...

    @property
    def session(self) -> Session: ...

    @property
    def store(self) -> Store: ...

    @property
    def processor(self) -> TaskLoop: ...

    @property
    def bus(self) -> MessageBus: ...

    @property
    def member_id(self) -> str: ...


def _ready_from(tasks: list[Task]) -> str:
    """The earliest second ``tasks`` (new, written ready) are ready from, in ISO form."""
    return min(ready_at(t, t.updated_at) for t in tasks).isoformat()


def submit(node: Intake, req: TaskSubmit, request: uuid.UUID | None = None) -> Task:
    """Create a task (its payload validated; at its type's default priority, and with its
    type's resources besides the request's): the API's ``task.submit`` and every task the
    node makes itself (schedule fires, stream copies, aspect tasks) come through here.

    The task loop takes it (:meth:`TaskLoop.accept`): when a worker of this node is free
    and the task needs nothing looked up or booked first, it is written already claimed by
    this node and starts at once (its lock, then one store write); otherwise it is written
    WAITING, and every node is told to scan (TRIGGER_SCAN) when this one cannot start it
    now. A task due later than the open queue's horizon waits in a time bucket: the bucket
    cursor is made sure of first (:mod:`runner.tasks.due`), and no node is told (no scan
    can find it before the master moves its bucket into the ready lanes).

    ``request``: the API request's message id, which a redelivered copy keeps: the task's
    id is made from it (:func:`~runner.requests.submit_task_id`), and a task with that id
    written already by an earlier handling is answered, not written twice."""
    kind = node.registry.get(req.type)
    kind.parse(req.payload)
    run_at = req.when()
    bucketed = due.needs_cursor(run_at)
    if bucketed:
        due.ensure_cursor(node.session)
    new = node.store.tasks.new(req.type, req.payload, unique_key=req.unique_key,
                               priority=kind.priority if req.priority is None
                               else req.priority, run_at=run_at,
                               ordering_key=req.ordering_key,
                               resources=[*kind.resources, *req.resources],
                               timeout=req.timeout)
    if request is not None:
        new = replace(new, id=submit_task_id(request))
    admitted = node.processor.accept(new, again=request is not None)
    if admitted.admission is Admission.ELSEWHERE and not bucketed:
        node.bus.broadcast("TRIGGER_SCAN", {"task": admitted.task.id,
                                            "behind": _ready_from([new])})
    return admitted.task

def submit_many(node: Intake, req: TaskSubmitMany) -> list[Task]:
    """Create a page of tasks (``task.submit_many``) in one store write, in order: each
    validated as :meth:`submit` validates one (an invalid one refuses the page, naming its
    index, before anything is written), then every node told to scan once (unless every
    task of the page waits in a time bucket, as :meth:`submit` says). A keyed page
    (``req.page``) gives its tasks the ids its key makes, and creates only those a sending
    before did not."""
    news = []
    ready = False  # a task of the page written into a ready lane
    for n, item in enumerate(req.tasks):
        try:
            kind = node.registry.get(item.type)
            kind.parse(item.payload)
        except TaskError as exc:
            raise type(exc)(f"task {n} of the page: {exc}") from exc
        run_at = item.when()
        if due.needs_cursor(run_at):
            due.ensure_cursor(node.session)
        else:
            ready = True
        news.append(node.store.tasks.new(
            item.type, item.payload, unique_key=item.unique_key,
            priority=kind.priority if item.priority is None else item.priority,
            run_at=run_at, ordering_key=item.ordering_key,
            resources=[*kind.resources, *item.resources], timeout=item.timeout))
    if req.page is not None:
        news = [replace(task, id=page_task_id(req.page, n)) for n, task in enumerate(news)]
    written = node.store.tasks.add_many(news, again=req.page is not None)
    if ready:
        # from when they are ready: a write that landed late (this node paused, or waiting
        # for the graph, after it stamped them) lies behind the scans' cursors
        behind = _ready_from(news)
        node.processor.trigger(datetime.fromisoformat(behind))
        node.bus.broadcast("TRIGGER_SCAN", {"tasks": len(written), "behind": behind})
    return written


def cancel(node: Intake, task_id: str, by: str, reason: str | None = None) -> Cancelled:
    """Deactivate a task and cancel its running attempt cluster-wide: the attempt ends
    CANCELLED and the task's fence moves on in one write (the owner can write nothing
    more), then the owner's lock node is deleted and a ``cancel-<task id>`` message left
    in the owner's mailbox, which cancels its handler within a ZooKeeper round trip."""
    before = node.store.tasks.get(task_id)
    task, closed = node.store.cancel(task_id, by, reason)
    if closed:
        owner = force_release(node.session, task_id)
        for attempt in closed:  # the owner stops its handler (its mailbox)
            post(node.session, attempt.executor, f"cancel-{task_id}",
                 (attempt.error or "cancelled by an operator").encode())
        log.warning("member %s: task %s (%s) cancelled by operator %s; its attempt on %s "
                    "was stopped", node.member_id, task_id, task.type, by, owner)
    return Cancelled.of_cancel(before, task, closed)


def mail(node: Intake, name: str, data: bytes) -> None:
    """A message in this member's mailbox: ``cancel-<task id>`` (an operator's cancel,
    written on whichever node took it) stops that task's handler here."""
    kind, _, task_id = name.partition("-")
    if kind == "cancel" and task_id:
        reason = data.decode(errors="replace") or "cancelled by an operator"
        if node.processor.cancel_running(task_id, reason):
            log.warning("member %s: task %s: its handler is stopped: %s", node.member_id,
                        task_id, reason)
