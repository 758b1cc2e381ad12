"""The Python client: submit, follow and steer tasks through whichever node answers.

::

    from runner.client import Client

    with Client.from_settings() as client:          # LATCHWORK_AMQP_URL, LATCHWORK_CLUSTER
        ref = client.submit("diag.sleep", {"seconds": 1}, unique_key="nightly-1")
        report = client.wait(ref.id, timeout=60)     # the final state with every attempt
        print(report.task.finished, [a.status for a in report.attempts])

Every call is one request over the API paradigm (a persistent request that expires when the
client gives up, answered by any node). Errors are one tree under :class:`ClientError`
(a :class:`~runner.errors.RunnerError`), each with a stable ``code``:

* :class:`RequestRefused` (code: the node's, e.g. ``task_type_unknown``, ``payload_invalid``,
  ``invalid``): the request itself is wrong (the node's error declares itself ``refused``,
  see :mod:`runner.errors`); sending it again will not help;
* :class:`RequestFailed` (code: the node's, e.g. ``task_not_found``, ``aspect_busy``,
  ``internal_error``): the node could not do it;
* :class:`NoAnswer` (``no_answer``): no node answered in time (none running, or all busy);
* :class:`BrokerUnreachable` (``broker_unreachable``): RabbitMQ cannot be reached;
* for :meth:`Client.command` with ``wait``: :class:`CommandRefused` (a refusal: the master
  dead-lettered it, code ``invalid``, ``unknown-command``, ...) and :class:`CommandFailed`
  (its handler failed past its retries).

A client is for one thread at a time; open one per thread. ``close()`` (or the ``with`` block)
closes its connection; a closed client refuses further calls (``LifecycleError``).

Every typed method builds its request model (:func:`build`) and is a call of
:meth:`Client.send`, which returns the reply model the request names (:mod:`runner.replies`):
``client.send(build(TaskGet, id=...))`` is ``client.get(...)``.

Why one module: the client is one class with one typed method per command of the contract
(:mod:`runner.requests`); its error types live in :mod:`runner.errors`.
"""

from __future__ import annotations

import builtins
import getpass
import logging
import socket
import time
import typing
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import ClassVar, TypeVar, cast, overload

from pydantic import BaseModel, JsonValue, ValidationError

from messaging import (
    ApiClient,
    BrokerUnavailable,
    Connector,
    DeadLetter,
    DeadLetterNotFound,
    DeadLetterQueue,
    EnvelopeError,
    PublishFailed,
    RemoteError,
    RequestTimeout,
    Topology,
    summary,
    validate_payload,
)
from runner.config import Settings
from runner.connect import amqp_connector
from runner.errors import (
    BrokerUnreachable,
    ClientError,
    CommandFailed,
    CommandRefused,
    NoAnswer,
    RequestFailed,
    RequestRefused,
    ResultPending,
    TaskStopped,
)
from runner.replies import (
    Acted,
    AspectView,
    Cancelled,
    CheckpointValue,
    ClusterStatus,
    CommandView,
    OntologyDetail,
    OntologyView,
    RecentAttempt,
    ResultValue,
    ScheduleView,
    StreamInfo,
    StreamPage,
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
    SUBMIT_PAGE,
    SUBMIT_PAGE_BYTES,
    AspectCreate,
    AspectDelete,
    AspectGet,
    AspectList,
    AttemptRecent,
    ClusterStatusQuery,
    CommandList,
    OntologyList,
    OntologyShow,
    OntologySyncRequest,
    Request,
    ScheduleAdd,
    ScheduleList,
    SchedulePause,
    ScheduleRemove,
    ScheduleSpec,
    StreamList,
    StreamPush,
    StreamRead,
    StreamStart,
    StreamStatus,
    TaskCancel,
    TaskCheckpoint,
    TaskCounts,
    TaskDeactivate,
    TaskGet,
    TaskList,
    TaskReactivate,
    TaskResult,
    TaskSkip,
    TaskSubmit,
    TaskSubmitMany,
    TaskTemplate,
    TaskTypes,
    WorkflowCancel,
    WorkflowShow,
    submitted,
    workflow_pages,
)
from runner.requests import TaskSearch as TaskSearchRequest
from runner.results import ResultRef
from runner.store import codec
from runner.workflows import Flow, WorkflowRef, workflow_id

T = TypeVar("T")
#: a request's reply type
R = TypeVar("R")
#: a request model, or a part of one
Q = TypeVar("Q", bound=BaseModel)
#: what a task's result reads as
M = TypeVar("M")
#: sendings of one bulk submit page at most (the first, and again while no answer comes or the
#: graph is out of reach: 0.5, 1, 2 s apart)
PAGE_TRIES = 4
log = logging.getLogger("latchwork.client")
#: a filter's value: one, or any of several
AnyOf = str | Sequence[str]

__all__ = ["BrokerUnreachable", "Client", "ClientError", "CommandFailed", "CommandRefused",
           "NoAnswer", "RequestFailed", "RequestRefused", "ResultPending", "ResultRef",
           "TaskStopped", "build", "operator"]



def build(model: type[Q], **fields: object) -> Q:
    """The request (or part of one) ``model`` of ``fields``, validated here as the node
    validates it: a wrong one is refused before it is sent (:class:`RequestRefused`, code
    ``invalid``, naming the command)."""
    try:
        return cast(Q, validate_payload(model, fields))
    except ValidationError as exc:
        command = getattr(model, "command", model.__name__)
        raise RequestRefused(command, "invalid", f"{command}: {summary(exc)}") from exc


def _pages(items: builtins.list[TaskTemplate]) -> Iterator[builtins.list[TaskTemplate]]:
    """``items`` in pages of at most SUBMIT_PAGE items and SUBMIT_PAGE_BYTES of JSON."""
    page: builtins.list[TaskTemplate] = []
    size = 0
    for item in items:
        length = len(item.model_dump_json(exclude_none=True)) + 2
        if page and (len(page) >= SUBMIT_PAGE or size + length > SUBMIT_PAGE_BYTES):
            yield page
            page, size = [], 0
        page.append(item)
        size += length
    if page:
        yield page


def _object(payload: object) -> object:
    """A payload as the request model takes it: a mapping copied, anything else left for the
    model to refuse ("Input should be a JSON object"), never a TypeError here."""
    if payload is None:
        return {}
    return dict(payload) if isinstance(payload, Mapping) else payload


def _listed(value: AnyOf | None) -> str | list[str] | None:
    return value if value is None or isinstance(value, str) else list(value)


def operator() -> str:
    """Who is asking (``user@host``): named in what a request changes, e.g. an attempt
    "cancelled by operator alice@host"."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@contextmanager
def _answered(command: str, refused: type[RequestRefused],
              failed: type[RequestFailed]) -> Iterator[None]:
    """messaging's errors of one call as the client's: an error answer (``refused`` when the
    node says the caller asked wrongly, else ``failed``), no answer, no broker."""
    try:
        yield
    except RemoteError as exc:
        kind = refused if exc.refused else failed
        raise kind(command, exc.code, exc.detail) from exc
    except RequestTimeout as exc:
        raise NoAnswer(str(exc)) from exc
    except (BrokerUnavailable, PublishFailed) as exc:  # not sent: send it again
        raise BrokerUnreachable(str(exc)) from exc


class Client:
    """A typed client of one cluster (see the module)."""

    poll_interval: ClassVar[float] = 0.25

    def __init__(self, amqp_url: str, cluster: str, *, timeout: float = 10.0,
                 sender: str | None = None, name: str = "latchwork client",
                 connector: Connector | None = None) -> None:
        self.timeout = timeout
        connector = connector or Connector(amqp_url, connect_deadline=min(timeout, 10.0),
                                           name=name)
        self._api = ApiClient(connector, Topology(cluster), sender=sender or operator())
        self._dead = DeadLetterQueue(connector, Topology(cluster))

    @classmethod
    def from_settings(cls, settings: Settings | None = None, *, config: Path | None = None,
                      timeout: float = 10.0, sender: str | None = None,
                      name: str = "latchwork client") -> Client:
        """A client of the cluster the settings name (a TOML file and ``LATCHWORK_*``); a bad
        configuration raises :class:`~runner.config.ConfigError`."""
        settings = settings or Settings.load(config)
        connector = amqp_connector(settings, name=name, connect_deadline=min(timeout, 10.0))
        return cls(connector.url, settings.cluster, timeout=timeout, connector=connector,
                   sender=sender, name=name)

    # -- the calls ------------------------------------------------------------------------------
    def submit(self, task_type: str, payload: Mapping[str, JsonValue] | None = None, *,
               priority: int | None = None, unique_key: str | None = None,
               run_at: datetime | None = None, delay: float | None = None,
               ordering_key: str | None = None, resources: Sequence[str] = (),
               timeout: float | None = None) -> TaskView:
        """Create a task (validated by the node; ``priority`` None: the type's default) and
        return its view (a :class:`~runner.replies.TaskRef`); the same ``unique_key`` again
        returns the task it created first. ``run_at`` (an aware datetime) or ``delay``
        (seconds): not started before then. ``ordering_key``: tasks with the same key run one
        at a time in submission order. ``resources``: taken all-or-nothing before it starts
        (besides its type's). ``timeout``: seconds an attempt may run, capped by its type's
        (docs/runner.md, "Time limits and heartbeats"); not the request's own timeout."""
        return self.send(build(TaskSubmit, type=task_type, payload=_object(payload),
                               priority=priority, unique_key=unique_key, run_at=run_at,
                               delay=delay, ordering_key=ordering_key,
                               resources=list(resources), timeout=timeout))

    def submit_many(self, tasks: Iterable[Mapping[str, JsonValue] | TaskTemplate]
                    ) -> builtins.list[str]:
        """Create many tasks, each given as :meth:`submit`'s fields (``{"type": ...,
        "payload": ..., "priority": ..., ...}``), in pages of at most
        :data:`~runner.requests.SUBMIT_PAGE` tasks and 192 KiB of JSON: each page one request
        and one store write (about a request's cost for the whole page). Their ids, in order.
        Every item is checked here first (a bad one: :class:`RequestRefused` naming its index,
        nothing sent); a node that refuses a page (an unknown type, an invalid payload) names
        the item (its index in that page), and the pages before it stay created (their ids in
        the error's ``done``).

        Each page carries a key of its own (``TaskSubmitMany.page``), so a page whose answer
        did not come (:class:`NoAnswer`: a node killed or paused while it wrote) or that the
        graph refused for a while (``store_unavailable``) is sent again, up to
        :data:`PAGE_TRIES` times in all with a growing pause: what its first sending wrote is
        not written twice, and its ids come back as one."""
        items = []
        for n, item in enumerate(tasks):
            try:
                items.append(item if isinstance(item, TaskTemplate)
                             else TaskTemplate.model_validate(item))
            except ValidationError as exc:
                raise RequestRefused(TaskSubmitMany.command, "invalid",
                                     f"task {n}: {summary(exc)}") from exc
        ids: builtins.list[str] = []
        for page in _pages(items):
            try:
                sent = self._submit_page(page)
            except RequestFailed as exc:
                exc.done = list(ids)
                exc.detail = (f"{exc.detail} (in the page of tasks {len(ids)} to "
                              f"{len(ids) + len(page) - 1}; the {len(ids)} before were created)")
                exc.args = (exc.detail, *exc.args[1:])
                raise
            ids += sent.ids
        return ids

    def _submit_page(self, page: builtins.list[TaskTemplate]) -> Submitted:
        """One page of :meth:`submit_many`, under a key of its own, sent again while no
        answer comes or the graph is out of reach (see there)."""
        key = uuid.uuid4().hex
        for n in range(PAGE_TRIES):
            try:
                return self.send(build(TaskSubmitMany, tasks=page, page=key))
            except (NoAnswer, RequestFailed) as exc:
                transient = isinstance(exc, NoAnswer) or exc.code == "store_unavailable"
                if not transient or n == PAGE_TRIES - 1:
                    raise
                log.warning("bulk submit: page %s not answered (%s); sending it again", key,
                            exc)
                time.sleep(min(4.0, 0.5 * 2 ** n))
        raise AssertionError("unreachable")  # the last try raised

    def submit_workflow(self, workflow: Flow, *, key: str,
                        on_failure: TaskTemplate | None = None,
                        deadline: datetime | float | None = None) -> WorkflowRef:
        """Submit ``workflow`` (:mod:`runner.workflows`: ``chain``, ``group``, ``chord``,
        ``step``) all or nothing: its members in pages (each written waiting, nothing
        claimable), then the last page commits it and its roots start. ``key`` is the
        submit's idempotency key: the same call again (an answer lost, a client restarted)
        writes nothing twice and answers the same ids; another workflow under a key already
        used is refused (``workflow_refused``), as is a member whose ``unique_key`` a task
        outside the workflow holds (naming it). A page not answered, or refused while the
        graph was out of reach, is sent again (:data:`PAGE_TRIES` times in all).

        ``on_failure``: a step (``runner.workflows.step``) that runs once if a member stops
        (its retries spent) or the deadline passes, never in a workflow that succeeds.
        ``deadline`` (an aware datetime, or seconds from now): members not started by then
        are stopped by the master (running ones finish), and ``on_failure`` starts."""
        if isinstance(deadline, int | float):
            deadline = codec.now() + timedelta(seconds=deadline)
        try:
            pages = workflow_pages(workflow, key, on_failure, deadline)
        except ValidationError as exc:  # refused here, as build() refuses a request
            raise RequestRefused("workflow.submit", "invalid",
                                 f"workflow.submit: {summary(exc)}") from exc
        answer: WorkflowView | None = None
        for n, request in enumerate(pages):
            answer = self._again(request, f"workflow {workflow_id(key)} page {n}")
        assert answer is not None
        return submitted(pages[0], answer)

    def workflow(self, workflow_id: str) -> WorkflowReport:
        """A workflow and its members' states (``latchwork workflow show``)."""
        return self.send(build(WorkflowShow, id=workflow_id))

    def cancel_workflow(self, workflow_id: str, reason: str | None = None
                        ) -> WorkflowCancelled:
        """Cancel every unfinished member of the workflow (each as :meth:`cancel`: a running
        one is stopped cluster-wide); what succeeded stays."""
        return self.send(build(WorkflowCancel, id=workflow_id, reason=reason))

    def _again(self, request: Request[R], what: str) -> R:
        """``request``, sent again while no answer comes or the graph is out of reach (up to
        :data:`PAGE_TRIES` sendings, 0.5, 1, 2 s apart): for requests that are safe to send
        twice."""
        for n in range(PAGE_TRIES):
            try:
                return self.send(request)
            except (NoAnswer, RequestFailed) as exc:
                transient = isinstance(exc, NoAnswer) or exc.code == "store_unavailable"
                if not transient or n == PAGE_TRIES - 1:
                    raise
                log.warning("%s not answered (%s); sending it again", what, exc)
                time.sleep(min(4.0, 0.5 * 2 ** n))
        raise AssertionError("unreachable")  # the last try raised

    def get(self, task_id: str) -> TaskReport:
        return self.send(build(TaskGet, id=task_id))

    def list(self, *, unfinished: bool = False, task_type: str | None = None,
             ordering_key: str | None = None) -> builtins.list[TaskView]:
        """Tasks, newest first; ``unfinished``: the open ones in the order nodes take them;
        ``ordering_key``: that key's unfinished tasks in the order they will run."""
        tasks: builtins.list[TaskView] = []
        after: str | None = None
        while True:  # a page at a time: one reply of every task would be over the limit
            page = self.send(build(TaskList, unfinished=unfinished, type=task_type,
                                   ordering_key=ordering_key, after=after))
            tasks.extend(page.tasks)
            if page.next is None:
                return tasks
            after = page.next

    def wait(self, task_id: str, timeout: float) -> TaskReport:
        """The task's report once it is finished or stopped; :class:`NoAnswer` if it is still
        open after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            report = self.get(task_id)
            if report.done:
                return report
            left = deadline - time.monotonic()
            if left <= 0:
                raise NoAnswer(f"task {task_id} is still {report.task.status.lower()} after "
                               f"{timeout:g}s")
            time.sleep(min(self.poll_interval, left))

    def submit_for(self, handler: Callable[..., M], payload: BaseModel | Mapping[str, JsonValue]
                   | None = None, **fields: object) -> ResultRef[M]:
        """Submit a task of ``handler``'s ``@task`` type (its name read from the handler,
        ``payload`` a model or a mapping, the other ``fields`` as :meth:`submit` takes them)
        and return a typed reference: :meth:`result` of it answers the type the handler's
        return annotation names. A function without ``@task`` raises ValueError."""
        declaration = getattr(handler, "latchwork_task", None)
        name = getattr(declaration, "name", None)
        if not isinstance(name, str):
            raise ValueError(f"{getattr(handler, '__qualname__', handler)} is not a @task "
                             "handler")
        body = payload.model_dump(mode="json") if isinstance(payload, BaseModel) else payload
        view = self.submit(name, cast(Mapping[str, JsonValue] | None, body),
                           **cast(dict[str, typing.Any], fields))
        return cast(ResultRef[M], ResultRef.returned_by(view.id, handler))

    @overload
    def result(self, task: ResultRef[M], wait: float | None = None) -> M: ...

    @overload
    def result(self, task: str, wait: float | None = None) -> JsonValue: ...

    @overload
    def result(self, task: str, wait: float | None = None, *, model: type[M]) -> M: ...

    def result(self, task: str | ResultRef[M], wait: float | None = None, *,
               model: type[M] | None = None) -> M | JsonValue:
        """What the task's handler returned (None: it returned nothing), once it succeeded:
        read as the reference's type (:class:`~runner.results.ResultRef`, :meth:`submit_for`)
        or ``model``, else as stored JSON. ``wait``: seconds to wait for it to end (None: not
        at all). A task that stopped raises :class:`TaskStopped` (``state`` failed, cancelled
        or skipped; ``error`` its last attempt's); one still open past ``wait``
        :class:`ResultPending`; an unknown one ``task_not_found``."""
        ref: ResultRef[M] | ResultRef[JsonValue] = (
            task if isinstance(task, ResultRef) else
            ResultRef.of(task, model) if model is not None else ResultRef(task))
        return ref.read(self.result_value(ref.task_id, wait).value)

    def result_value(self, task_id: str, wait: float | None = None) -> ResultValue:
        """:meth:`result`'s answer whole (the value as stored JSON, its size and attempt; the
        same errors): what ``latchwork task result --json`` prints."""
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            answer = self.send(build(TaskResult, id=task_id))
            if answer.state == "succeeded":
                return answer
            if answer.state in ("failed", "cancelled", "skipped"):
                why = (f": {answer.error}" if answer.error else
                       ": it has no result" if answer.state == "skipped" else "")
                raise TaskStopped(f"task {task_id} {answer.state}{why}", task_id=task_id,
                                  state=answer.state, error=answer.error)
            left = 0.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                waited = "" if wait is None else f" after {wait:g}s"
                raise ResultPending(f"task {task_id} is still {answer.state}{waited}")
            time.sleep(min(self.poll_interval, left))

    def checkpoint(self, task_id: str) -> CheckpointValue:
        """The task's last checkpoint with its value (``present`` False: none);
        ``task_not_found`` for an unknown task."""
        return self.send(build(TaskCheckpoint, id=task_id))

    def cancel(self, task_id: str, reason: str | None = None) -> Cancelled:
        """Deactivate the task and cancel its running attempt cluster-wide: the attempt ends
        CANCELLED "cancelled by operator <sender>" and its owner is fenced off."""
        return self.send(build(TaskCancel, id=task_id, reason=reason))

    def deactivate(self, task_id: str) -> Cancelled:
        """Stop the task (it is kept); a running attempt is cancelled as with :meth:`cancel`."""
        return self.send(build(TaskDeactivate, id=task_id))

    def reactivate(self, task_id: str, *, fresh: bool = False) -> Acted:
        """Let nodes pick a stopped task again; ``fresh``: drop its last checkpoint too, so
        its next attempt starts from the beginning (refused while an attempt runs it). The
        answer says what it did (``was``, ``changed``): an active task is left as it is; a
        finished one raises ``RequestFailed`` ``task_finished``, its checkpoint kept."""
        return self.send(build(TaskReactivate, id=task_id, fresh=fresh))

    def skip(self, task_id: str) -> Acted:
        """Finish a stopped or waiting task without running it (its ordering key goes on);
        ``task_finished`` for a finished one, refused for a running one."""
        return self.send(build(TaskSkip, id=task_id))

    def recent_attempts(self, limit: int = 10) -> builtins.list[RecentAttempt]:
        """The attempts that ended last (today and yesterday), newest first."""
        return self.send(build(AttemptRecent, limit=limit))

    def task_types(self) -> builtins.list[TaskTypeView]:
        """Every task type the answering node knows: name, description, default priority,
        slots, limits, isolation and payload JSON schema."""
        return self.send(TaskTypes())

    def cluster_status(self) -> ClusterStatus:
        return self.send(ClusterStatusQuery())

    # -- schedules ---------------------------------------------------------------------------
    def schedule_add(self, name: str, spec: ScheduleSpec) -> ScheduleView:
        """Add the recurring schedule ``name``: ``spec`` says when it fires (``cron``: a
        crontab expression in UTC, or ``every`` seconds), the task each fire creates (the
        fields a submit shares, :class:`~runner.templates.TaskFields`) and ``misfire``
        (``run_once`` or ``skip`` for fires missed while no master existed); the master
        creates one task per fire. ``ScheduleSpec(type="diag.sleep", cron="0 3 * * *")``."""
        return self.send(build(ScheduleAdd, name=name, spec=spec))

    def schedules(self) -> builtins.list[ScheduleView]:
        return self.send(ScheduleList())

    def schedule_remove(self, name: str) -> None:
        """Remove a schedule; its fires made ahead that have not started are stopped."""
        self.send(build(ScheduleRemove, name=name))

    def schedule_pause(self, name: str, paused: bool = True) -> ScheduleView:
        """Pause a schedule (its fires made ahead that have not started are stopped), or
        resume it (``paused=False``: from now on, missed fires are not made up)."""
        return self.send(build(SchedulePause, name=name, paused=paused))

    # -- streams, aspects, ontologies ---------------------------------------------------------
    def stream_start(self, name: str, redundancy: int = 2) -> StreamStarted:
        """Create the copy tasks of stream ``name`` (idempotent)."""
        return self.send(build(StreamStart, name=name, redundancy=redundancy))

    def stream_status(self, name: str) -> StreamState:
        """The stream handler's state (phase, positions, output end) and its running copies."""
        return self.send(build(StreamStatus, name=name))

    def aspect_create(self, name: str, *, batch_rows: int | None = None,
                      pause: float = 0.0) -> AspectView:
        return self.send(build(AspectCreate, name=name, batch_rows=batch_rows, pause=pause))

    def aspect_delete(self, name: str) -> AspectView:
        return self.send(build(AspectDelete, name=name))

    def aspect(self, name: str) -> AspectView:
        """An aspect's state, its task, and its batches done and total."""
        return self.send(build(AspectGet, name=name))

    def aspects(self) -> builtins.list[AspectView]:
        return self.send(AspectList())

    def ontology_sync(self) -> SyncSent:
        """Ask the master to load new or changed ontologies (the message's id)."""
        return self.send(OntologySyncRequest())

    def ontologies(self) -> builtins.list[OntologyView]:
        return self.send(OntologyList())

    def ontology(self, iri: str) -> OntologyDetail:
        """An ontology and its classes, each with its parents and its number of children."""
        return self.send(build(OntologyShow, iri=iri))

    # -- the web console's lists ------------------------------------------------------------
    def search(self, *, type: AnyOf | None = None, state: AnyOf | None = None,
               owner: AnyOf | None = None, ordering_key: AnyOf | None = None,
               resource: str | None = None, before: str | None = None,
               limit: int = 50) -> tuple[builtins.list[TaskView], str | None]:
        """A page of tasks matching every filter given, newest first, and the cursor of the
        next (older) page (None: this was the last). ``state``: waiting, running, stopped,
        finished or skipped. A sequence of values means any of them (``type=("a", "b")``).
        Reads a page, never the whole history."""
        page = self.send(build(TaskSearchRequest, type=_listed(type), state=_listed(state),
                               owner=_listed(owner), ordering_key=_listed(ordering_key),
                               resource=resource, before=before, limit=limit))
        return page.tasks, page.next

    def task_counts(self, *, type: AnyOf | None = None, owner: AnyOf | None = None,
                    ordering_key: AnyOf | None = None, resource: str | None = None
                    ) -> dict[str, int]:
        """How many tasks match the filters in each state (a sequence: any of its values)."""
        return self.send(build(TaskCounts, type=_listed(type), owner=_listed(owner),
                               ordering_key=_listed(ordering_key), resource=resource))

    def streams(self) -> builtins.list[StreamInfo]:
        """The streams a node declares, each with its state and running copies."""
        return self.send(StreamList())

    # -- your own commands and broadcasts, and streams from the outside -----------------------
    def command(self, name: str, payload: Mapping[str, JsonValue] | None = None, *,
                id: str | uuid.UUID | None = None, wait: float | None = None) -> JsonValue:
        """Send the MASTER command ``name`` (declared with ``@command`` on the nodes); returns
        once the broker has it (a publisher confirm). ``id``: its idempotency key (a UUID):
        sent again with the same id (after a lost confirm), it is handled once, and each call
        that waits gets the one answer. ``wait``: seconds to wait for the master's answer (the
        handler's return value); then :class:`CommandFailed` (the handler failed, out of
        retries), :class:`CommandRefused` (code ``unknown-command``, ``invalid``, ...) or
        :class:`NoAnswer` (the command stays queued: a master will still run it). Without
        ``wait``: None."""
        try:
            message_id = uuid.UUID(str(id)) if id is not None else None
        except ValueError as exc:
            raise RequestRefused(name, "invalid", f"command id {id!r} is not a UUID") from exc
        body = dict(payload) if payload is not None else None
        try:
            with _answered(name, CommandRefused, CommandFailed):
                answer: JsonValue = self._api.command(name, body, message_id=message_id,
                                                      wait=wait)
                return answer
        except (EnvelopeError, ValidationError) as exc:  # a name the envelope refuses
            raise RequestRefused(name, "invalid", f"command {name!r}: {exc}") from exc

    def broadcast(self, name: str, payload: Mapping[str, JsonValue] | None = None) -> str:
        """Send the broadcast ``name`` to every node connected now (confirmed by the broker);
        its message id. A node disconnected meanwhile runs the broadcast's catch-up instead."""
        try:
            return str(self._api.broadcast(name, dict(payload) if payload is not None
                                           else None).id)
        except BrokerUnavailable as exc:
            raise BrokerUnreachable(str(exc)) from exc
        except ValidationError as exc:  # a name the envelope refuses
            raise RequestRefused(name, "invalid", f"broadcast {name!r}: {exc}") from exc

    def commands(self) -> builtins.list[CommandView]:
        """Every command and broadcast the live nodes declare: name, kind, description,
        payload JSON schema, built-in or not, and the members that declare it."""
        return self.send(CommandList())

    def stream_push(self, queue: str, values: Sequence[JsonValue], *,
                    token: str | None = None, raw: bool = False) -> builtins.list[int]:
        """Append ``values`` (JSON; with ``raw``, strings stored as their text) to the queue
        ``queue`` in one step; their indexes. ``token``: a push sent again with it (after a
        lost reply) pushes nothing more and returns the first one's indexes. A value too
        large is refused (:class:`RequestRefused`, code ``stream_element_too_large``)."""
        return self.send(build(StreamPush, queue=queue, values=builtins.list(values),
                               token=token, raw=raw)).indexes

    def stream_read(self, queue: str, start: int = 0, limit: int = 100) -> StreamPage:
        """Up to ``limit`` elements of ``queue`` from ``start`` (each its ``index`` and its
        ``value``, ``text`` or ``base64``) and where the next read starts (an input, an output
        or a dead-letter queue, ``<stream>.dead``)."""
        return self.send(build(StreamRead, queue=queue, start=start, limit=limit))

    # -- the dead-letter queue (read from RabbitMQ directly: no node needed) ------------------
    def dead_letters(self, limit: int = 100) -> builtins.list[DeadLetter]:
        """Up to ``limit`` dead-lettered messages, oldest first, left in the queue."""
        return self._broker(lambda: self._dead.list(limit))

    def dead_letter_count(self) -> int:
        return self._broker(self._dead.count)

    def dead_letter(self, message_id: str) -> DeadLetter:
        """One dead letter by message id; ``RequestFailed`` (``dead_letter_not_found``)."""
        return self._broker(lambda: self._dead.get(message_id))

    def replay(self, message_id: str) -> DeadLetter:
        """Send a dead letter back to the queue it came from, with the same message id (so a
        MASTER message that was in fact handled is acked as a duplicate), then drop it."""
        return self._broker(lambda: self._dead.replay(message_id))

    def _broker(self, call: Callable[[], T]) -> T:
        try:
            return call()
        except DeadLetterNotFound as exc:
            raise RequestFailed("dlq", DeadLetterNotFound.error_code, str(exc)) from exc
        except BrokerUnavailable as exc:
            raise BrokerUnreachable(str(exc)) from exc

    # -- plumbing -------------------------------------------------------------------------------
    def send(self, request: Request[R]) -> R:
        """Send one request of the API's contract (:mod:`runner.requests`; build it with
        :func:`build`, which refuses a wrong one before it is sent) and read the reply into
        the model its command names. A reply that does not read as that model (a node of
        another version that broke the contract) is :class:`RequestFailed` with code
        ``invalid_reply``; else the node's error, as a :class:`ClientError`."""
        command = request.command
        raw = self.request(command, request.model_dump(mode="json"))
        try:
            return cast(R, type(request).reply_adapter().validate_python(raw))
        except ValidationError as exc:
            raise RequestFailed(command, "invalid_reply",
                                f"the node's answer to {command} is not what the command "
                                f"answers: {summary(exc)}") from exc

    def request(self, command: str, payload: Mapping[str, JsonValue] | None = None,
                timeout: float | None = None) -> JsonValue:
        """One API request by its command name, as it goes on the wire (prefer the typed
        methods, or :meth:`send`); the reply's ``result`` as JSON, or a :class:`ClientError`."""
        with _answered(command, RequestRefused, RequestFailed):
            answer: JsonValue = self._api.request(command, dict(payload or {}),
                                                  timeout=timeout or self.timeout)
            return answer

    def close(self) -> None:
        self._api.close()
        self._dead.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
