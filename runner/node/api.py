"""The node's API: one handler per command of the contract (:mod:`runner.requests`), answered by
any node.

Each handler is registered on the API paradigm under its command name (``task.submit``,
``task.list``, ...): the request payload is validated into its model first (an invalid one is
dead-lettered and the client told ``invalid``), and an error the handler raises reaches the
client as ``{"kind", "code", "detail"}`` with the error's stable code (:mod:`runner.errors`).
Each handler returns its command's reply model (:mod:`runner.replies`, named by the request:
``Request[TaskView]``), which the node sends as JSON: :meth:`NodeApi.register` writes it with
the request's reply adapter, so a handler cannot answer what its command does not declare.

Why one module: the handlers of the core commands are one class (:class:`NodeApi`, registered
as one, each a few lines over the node's parts); the web console's and the outside world's
requests are mixins of their own (:mod:`.api_console`, :mod:`.api_outside`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from coord import (
    VersionedRegister,
)
from messaging import MAX_BODY, HandlerContext, MessageBus
from runner.errors import NoOntologySource, OntologyNotFound, TaskArchived, TaskNotFound
from runner.node import workflows
from runner.node.api_console import ConsoleApi
from runner.node.api_outside import OutsideApi, api
from runner.node.status import cluster_status
from runner.replies import (
    Acted,
    AspectView,
    AttemptView,
    Cancelled,
    CheckpointValue,
    ClusterStatus,
    OntologyClassView,
    OntologyDetail,
    OntologyView,
    RecentAttempt,
    ResultValue,
    ScheduleRemoved,
    ScheduleView,
    SearchPage,
    StreamStarted,
    StreamState,
    Submitted,
    SyncSent,
    TaskReport,
    TaskTypeView,
    TaskView,
    WorkflowCancelled,
    WorkflowReport,
    WorkflowView,
)
from runner.requests import (
    AspectCreate,
    AspectDelete,
    AspectGet,
    AspectList,
    AttemptRecent,
    ClusterStatusQuery,
    OntologyList,
    OntologyShow,
    OntologySyncRequest,
    Request,
    ScheduleAdd,
    ScheduleList,
    SchedulePause,
    ScheduleRemove,
    StreamStart,
    StreamStatus,
    TaskCancel,
    TaskCheckpoint,
    TaskDeactivate,
    TaskGet,
    TaskList,
    TaskReactivate,
    TaskResult,
    TaskSkip,
    TaskSubmit,
    TaskSubmitMany,
    TaskTypes,
    WorkflowCancel,
    WorkflowShow,
    WorkflowSubmit,
)
from runner.store import Attempt, AttemptStatus, codec
from runner.tasks.features import streams
from runner.tasks.master import schedules

log = logging.getLogger("latchwork.node")

if TYPE_CHECKING:
    from coord import Session
    from runner.config import Settings
    from runner.pipeline.aspects import AspectRegistry
    from runner.pipeline.handlers import Pipeline
    from runner.store import Store, Task
    from runner.tasks import TaskRegistry
    from runner.tasks.features.streams import StreamRegistry




def list_start(listed: list[Task], after: str | None) -> int:
    """Where the page after cursor ``after`` (``<position>:<last task id>``) starts: after
    that task, found again even when tasks were added before it since; at its position when
    it is gone."""
    if after is None:
        return 0
    position, _, last = after.partition(":")
    for n, task in enumerate(listed):
        if task.id == last:
            return n + 1
    return int(position) if position.isdigit() else 0


class ApiHost(Protocol):
    """What the API needs of the node it answers for (:class:`runner.node.node.Node`)."""

    settings: Settings
    session: Session
    aspects: AspectRegistry
    registry: TaskRegistry
    streams: StreamRegistry

    @property
    def store(self) -> Store: ...

    @property
    def bus(self) -> MessageBus: ...

    @property
    def pipeline(self) -> Pipeline: ...

    @property
    def member_id(self) -> str: ...

    def submit(self, req: TaskSubmit, request: uuid.UUID | None = None) -> Task: ...

    def submit_many(self, req: TaskSubmitMany) -> list[Task]: ...

    def cancel(self, task_id: str, by: str, reason: str | None = None) -> Cancelled: ...

    def submit_workflow(self, req: WorkflowSubmit) -> WorkflowView: ...

    def workflow_report(self, workflow_id: str) -> WorkflowReport: ...

    def cancel_workflow(self, workflow_id: str, by: str,
                        reason: str | None = None) -> WorkflowCancelled: ...


class NodeApi(OutsideApi, ConsoleApi):
    """The API handlers of one node; they read the node's parts when a request arrives."""

    node: ApiHost

    def __init__(self, node: ApiHost) -> None:
        self.node = node

    @property
    def store(self) -> Store:
        return self.node.store

    @property
    def bus(self) -> MessageBus:
        return self.node.bus

    @property
    def pipeline(self) -> Pipeline:
        return self.node.pipeline

    @classmethod
    def handlers(cls) -> dict[str, tuple[str, type[Request[object]]]]:
        """Every API command with its handler's name and request model."""
        found = {}
        for name in dir(cls):
            model: type[Request[object]] | None = getattr(getattr(cls, name), "api_request",
                                                          None)
            if model is not None:
                found[model.command] = (name, model)
        return found

    @classmethod
    def register(cls, node: ApiHost, bus: MessageBus) -> NodeApi:
        handlers = cls(node)
        for command, (name, model) in cls.handlers().items():
            bus.api.handler(command, model)(_answering(model, getattr(handlers, name)))
        return handlers

    @api(TaskSubmit)
    def submit(self, ctx: HandlerContext, req: TaskSubmit) -> TaskView:
        # the request's id names the task: a copy redelivered after its first handler was
        # killed or cut off before it answered finds that task instead of making a second
        task = self.node.submit(req, ctx.message_id)
        log.info("member %s: task %s (%s) submitted by %s", self.node.member_id, task.id,
                 task.type, ctx.envelope.sender)
        return TaskView.of(task)

    @api(TaskSubmitMany)
    def submit_many(self, ctx: HandlerContext, req: TaskSubmitMany) -> Submitted:
        tasks = self.node.submit_many(req)
        log.info("member %s: %d tasks submitted by %s", self.node.member_id, len(tasks),
                 ctx.envelope.sender)
        return Submitted(ids=[task.id for task in tasks])

    @api(WorkflowSubmit)
    def submit_workflow(self, ctx: HandlerContext, req: WorkflowSubmit) -> WorkflowView:
        """A page of a workflow, written waiting; the last page commits it."""
        return self.node.submit_workflow(req)

    @api(WorkflowCancel)
    def cancel_workflow(self, ctx: HandlerContext, req: WorkflowCancel) -> WorkflowCancelled:
        return self.node.cancel_workflow(req.id, ctx.envelope.sender, req.reason)

    @api(WorkflowShow)
    def show_workflow(self, ctx: HandlerContext, req: WorkflowShow) -> WorkflowReport:
        return self.node.workflow_report(req.id)

    @api(TaskList)
    def list_tasks(self, ctx: HandlerContext, q: TaskList) -> SearchPage:
        if q.ordering_key is not None:
            tasks = self.store.tasks.with_key(q.ordering_key)
        elif q.unfinished:
            tasks = self.store.tasks.unfinished()
        else:
            tasks = self.store.tasks.all(q.type)
        listed = [t for t in tasks if q.type is None or t.type == q.type]
        start = list_start(listed, q.after)
        progress = {a.task_id: a.progress for a in self.store.attempts.running()}
        # half what the node and a client with the default limit read: room for the rest
        budget = min(self.node.settings.max_message_bytes, MAX_BODY) // 2
        page: list[TaskView] = []
        for task in listed[start:start + q.limit]:
            view = TaskView.of(task, progress.get(task.id))
            budget -= len(view.model_dump_json()) + 1
            if budget < 0 and page:
                break
            page.append(view)
        end = start + len(page)
        return SearchPage(tasks=page,
                          next=f"{end}:{listed[end - 1].id}" if end < len(listed) else None)

    @api(AttemptRecent)
    def recent_attempts(self, ctx: HandlerContext, q: AttemptRecent) -> list[RecentAttempt]:
        """The attempts that ended last, newest first, each with its task's type."""
        types: dict[str, str] = {}
        views = []
        for attempt in self.store.attempts.recent(q.limit):
            if attempt.task_id not in types:
                types[attempt.task_id] = self.store.tasks.get(attempt.task_id).type
            views.append(RecentAttempt.model_validate({
                **RecentAttempt.fields_of(attempt), "task": attempt.task_id,
                "type": types[attempt.task_id]}))
        return views

    @api(StreamStart)
    def stream_start(self, ctx: HandlerContext, req: StreamStart) -> StreamStarted:
        """Create the stream's copy tasks (idempotent); the nodes start them."""
        ids = streams.start(self.node.submit, self.node.streams, req.name, req.redundancy)
        return StreamStarted(stream=req.name, copies=ids)

    @api(StreamStatus)
    def stream_status(self, ctx: HandlerContext, req: StreamStatus) -> StreamState:
        """The handler's state (phase, input positions, output end) and the running copies."""
        self.node.streams.get(req.name)
        state, version = VersionedRegister(self.node.session,
                                           f"handlers/{req.name}/state").get()
        return StreamState(stream=req.name, version=version, state=state,
                           copies=streams.copies(self.node.session, req.name))

    @api(TaskTypes)
    def task_types(self, ctx: HandlerContext, req: TaskTypes) -> list[TaskTypeView]:
        """Every task type this node knows, with its description and payload JSON schema."""
        return [TaskTypeView.model_validate(kind.describe())
                for kind in self.node.registry.all()]

    @api(TaskCheckpoint)
    def task_checkpoint(self, ctx: HandlerContext, ref: TaskCheckpoint) -> CheckpointValue:
        self.store.tasks.get(ref.id)  # task_not_found for a task that is not there
        found = self.store.checkpoints.read(ref.id)
        if found is None:
            return CheckpointValue(task_id=ref.id, present=False)
        return CheckpointValue(task_id=ref.id, present=True, at=found.info.at,
                               size=found.info.size, seq=found.info.seq, value=found.state)

    @api(TaskGet)
    def get_task(self, ctx: HandlerContext, ref: TaskGet) -> TaskReport:
        task = self._task(ref.id)
        attempts = self.store.attempts.for_task(ref.id)
        view = TaskView.of(task)
        why = workflows.blocked(self.store, task) if task.workflow is not None else None
        if why is not None:  # a member waiting for one that stopped: it waits for ever
            view = view.model_copy(update={"state": "blocked", "stop_reason": why})
        return TaskReport(task=view, attempts=[AttemptView.of(a) for a in attempts],
                          progress=self.pipeline.progress_of(task),
                          result=self._result(task, attempts) if task.finished else None)

    @api(TaskResult)
    def task_result(self, ctx: HandlerContext, ref: TaskResult) -> ResultValue:
        """The task's state and, once it succeeded, what its handler returned; when it
        stopped, its last attempt's error."""
        task = self._task(ref.id)
        if task.finished:
            return self._result(task, ())
        state = task.state(codec.now()).value
        error = None
        if not task.active:  # stopped: failed or cancelled; why, from its last attempt
            attempts = self.store.attempts.for_task(ref.id)
            error = (attempts[-1].error if attempts else None) or task.stop_reason
        return ResultValue(task_id=task.id, state=state, error=error)

    def _task(self, task_id: str) -> Task:
        """The task, or TaskNotFound / TaskArchived (removed by the retention policy)."""
        try:
            return self.store.tasks.get(task_id)
        except TaskNotFound:
            tomb = self.store.retention.tombstone(task_id)
            if tomb is None:
                raise
            where = f"archived to {tomb.where}" if tomb.where else "removed"
            raise TaskArchived(f"task {task_id} finished long ago and was {where} by the "
                               f"retention policy on {tomb.at}") from None

    def _result(self, task: Task, attempts: Sequence[Attempt]) -> ResultValue:
        """A finished task's result (one read; none when no attempt of it succeeded)."""
        state = task.state(codec.now()).value
        if attempts and not any(a.status is AttemptStatus.SUCCEEDED for a in attempts):
            return ResultValue(task_id=task.id, state=state)  # skipped: nothing to read
        found = self.store.attempts.result(task.id)
        if found is None:
            return ResultValue(task_id=task.id, state=state)
        return ResultValue(task_id=task.id, state=state, present=True,
                           attempt_id=found.attempt_id, size=found.size,
                           value=codec.decode_json(found.text))

    @api(AspectCreate)
    def aspect_create(self, ctx: HandlerContext, req: AspectCreate) -> AspectView:
        return self.pipeline.create(req.name, batch_rows=req.batch_rows, pause=req.pause)

    @api(AspectDelete)
    def aspect_delete(self, ctx: HandlerContext, req: AspectDelete) -> AspectView:
        return self.pipeline.delete(req.name)

    @api(AspectGet)
    def aspect_get(self, ctx: HandlerContext, req: AspectGet) -> AspectView:
        return self.pipeline.describe(req.name)

    @api(AspectList)
    def aspect_list(self, ctx: HandlerContext, req: AspectList) -> list[AspectView]:
        return [self.pipeline.describe(d.name) for d in self.node.aspects.all()]

    @api(TaskDeactivate)
    def deactivate(self, ctx: HandlerContext, ref: TaskDeactivate) -> Cancelled:
        return self.node.cancel(ref.id, ctx.envelope.sender)

    @api(TaskCancel)
    def cancel(self, ctx: HandlerContext, req: TaskCancel) -> Cancelled:
        return self.node.cancel(req.id, ctx.envelope.sender, req.reason)

    @api(TaskReactivate)
    def reactivate(self, ctx: HandlerContext, ref: TaskReactivate) -> Acted:
        before = self.store.tasks.get(ref.id)
        task = self.store.tasks.reactivate(ref.id, fresh=ref.fresh)
        if task.version != before.version:
            self.bus.broadcast("TRIGGER_SCAN", {"task": task.id})
        return Acted.of_action(before, task)

    @api(TaskSkip)
    def skip(self, ctx: HandlerContext, ref: TaskSkip) -> Acted:
        """Finish a stopped or waiting task without running it: its ordering key goes on."""
        before = self.store.tasks.get(ref.id)
        task = self.store.tasks.skip(ref.id)
        log.warning("member %s: task %s (%s) skipped by %s", self.node.member_id, task.id,
                    task.type, ctx.envelope.sender)
        self.bus.broadcast("TRIGGER_SCAN", {"task": task.id})
        return Acted.of_action(before, task)

    @api(ScheduleAdd)
    def schedule_add(self, ctx: HandlerContext, req: ScheduleAdd) -> ScheduleView:
        """Add a recurring schedule; the master creates one task per fire."""
        self.node.registry.get(req.spec.type).parse(req.spec.payload)
        added = self.store.schedules.add(req.name, req.spec.model_dump())
        log.info("member %s: schedule %s added by %s", self.node.member_id, req.name,
                 ctx.envelope.sender)
        return schedules.describe(added)

    @api(ScheduleList)
    def schedule_list(self, ctx: HandlerContext, req: ScheduleList) -> list[ScheduleView]:
        return [schedules.describe(s) for s in self.store.schedules.all()]

    @api(ScheduleRemove)
    def schedule_remove(self, ctx: HandlerContext, ref: ScheduleRemove) -> ScheduleRemoved:
        """Remove a schedule; its fires that have not started are stopped."""
        schedules.remove(self.store, ref.name)
        return ScheduleRemoved(name=ref.name, removed=True)

    @api(SchedulePause)
    def schedule_pause(self, ctx: HandlerContext, req: SchedulePause) -> ScheduleView:
        """Pause (or resume) a schedule: a pause also stops its fires that have not started;
        fires while paused are not made up on resume."""
        return schedules.describe(schedules.pause(self.store, req.name, req.paused))

    @api(ClusterStatusQuery)
    def status(self, ctx: HandlerContext, req: ClusterStatusQuery) -> ClusterStatus:
        return cluster_status(self.node.session, self.node.settings, self.node.member_id,
                              self.store)

    @api(OntologySyncRequest)
    def ontology_sync(self, ctx: HandlerContext, req: OntologySyncRequest) -> SyncSent:
        if self.node.settings.ontology_source is None:
            raise NoOntologySource("no ontology source is configured (set ontology_source, "
                                   "LATCHWORK_ONTOLOGY_SOURCE): nothing to synchronise")
        sent = self.bus.send_master("SYNCHRONIZE_MODEL", {"reason": "requested"})
        return SyncSent(message_id=str(sent.id))

    @api(OntologyList)
    def ontology_list(self, ctx: HandlerContext, req: OntologyList) -> list[OntologyView]:
        return [OntologyView.of(o) for o in self.store.ontologies.all()]

    @api(OntologyShow)
    def ontology_show(self, ctx: HandlerContext, ref: OntologyShow) -> OntologyDetail:
        """An ontology and its classes, each with its parents and how many children it has
        (in any loaded ontology)."""
        record = self.store.ontologies.get(ref.iri)
        if record is None:
            raise OntologyNotFound(f"no ontology {ref.iri} is loaded")
        children: dict[str, int] = {}
        for _, parent in self.store.ontologies.subclass_edges():
            children[parent] = children.get(parent, 0) + 1
        classes = [OntologyClassView(iri=c.iri, label=c.label, parents=list(c.parents),
                                     children=children.get(c.iri, 0))
                   for c in self.store.ontologies.classes(ref.iri)]
        return OntologyDetail(iri=record.iri, version=record.version, checksum=record.checksum,
                              loaded_at=record.loaded_at, classes=classes)



def _answering(model: type[Request[object]],
               handler: Callable[[HandlerContext, Request[object]], object]
               ) -> Callable[[HandlerContext, Request[object]], object]:
    """``handler`` answering JSON: its reply model written by the request's reply adapter."""
    adapter = model.reply_adapter()

    def answer(ctx: HandlerContext, req: Request[object]) -> object:
        return adapter.dump_python(handler(ctx, req), mode="json")
    answer.__name__ = answer.__qualname__ = getattr(handler, "__name__", model.command)
    return answer
