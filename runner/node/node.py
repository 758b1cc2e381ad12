"""The latchwork node: one cluster member built from :class:`~runner.config.Settings`.

A node joins membership and the master election, opens the graph store, and runs:

* the task loop (every node): :class:`~runner.tasks.worker.loop.TaskLoop`;
* the MASTER consumer while it is master, plus the master duties
  (:mod:`runner.tasks.master.duties`);
* the MODEL consumer (TRIGGER_SCAN: scan now; UPDATE_CACHE: reload the ontology cache);
* the API responder (:mod:`runner.node.api`); what comes in as tasks goes through
  :mod:`runner.node.intake`.

SIGTERM or SIGINT: it stops taking tasks, cancels the running ones (their attempts end
CANCELLED_BY_SYSTEM), releases their locks after the attempts are written, hands over the
latch, leaves membership and exits 0, within ``shutdown_timeout`` plus a few seconds.

Failure behaviour: killed -9, its member and latch nodes go with its session and the master
frees its locks and closes its RUNNING attempts; a LOST session cancels its running tasks, and
membership and latch register again on the next session.

Lifecycle: LATENT, STARTED, CLOSED (:class:`NodeState`); ``start()`` builds every part at once
(:class:`NodeParts`), registering each one's close as it starts it, so ``close()`` (and a start
that fails half-way) closes exactly what was started, in reverse.

Why one module: the node is the composition root: the order its parts are built, started and
closed in is one piece of knowledge, and its MODEL and MASTER handlers read those parts.
"""

from __future__ import annotations

import enum
import functools
import logging
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime

from coord import (
    LeaderLatch,
    LifecycleError,
    Mailbox,
    Membership,
    SessionState,
)
from messaging import MessageBus, Topology, ZkProcessedLog
from runner import __version__, logs
from runner.config import Settings
from runner.connect import amqp_connector, graph_store, zk_session
from runner.errors import StoreError
from runner.node import commands as builtin_commands
from runner.node import intake, workflows
from runner.node.api import NodeApi
from runner.node.metrics import LiveState, NodeMetrics
from runner.node.registries import node_registry
from runner.ontology import OntologyCache, OntologySync
from runner.pipeline import extra
from runner.pipeline.aspects import AspectRegistry
from runner.pipeline.handlers import Pipeline
from runner.pipeline.spark import stop_spark
from runner.replies import Cancelled, WorkflowCancelled, WorkflowReport, WorkflowView
from runner.requests import (
    TaskSubmit,
    TaskSubmitMany,
    WorkflowSubmit,
    submitted,
    workflow_pages,
)
from runner.store import Store, Task, migrations
from runner.tasks import Services, TaskRegistry
from runner.tasks.authoring import register_commands
from runner.tasks.commands import CommandRegistry
from runner.tasks.features.streams import (
    StreamLiveness,
    StreamRegistry,
    StreamRetention,
)
from runner.tasks.master import layout
from runner.tasks.master.duties import MasterDuties, Pruning
from runner.tasks.master.incidents import IncidentWatch, load_hooks
from runner.tasks.master.retention import Retention
from runner.tasks.master.schedules import ScheduleFirer
from runner.tasks.master.workflows import WorkflowRound
from runner.tasks.observer import Observer, delivery_hook
from runner.tasks.worker.loop import LoopSettings, TaskLoop
from runner.workflows import Flow, WorkflowRef

log = logging.getLogger("latchwork.node")


class ScanOnRelease(Observer):
    """Tells every node to scan (TRIGGER_SCAN) when an end of this node made workflow members
    claimable, so a join does not wait for the next scan interval."""

    def __init__(self, bus: MessageBus) -> None:
        self.bus = bus

    def on_released(self, tasks: Sequence[Task], behind: datetime) -> None:
        self.bus.broadcast("TRIGGER_SCAN", {"released": len(tasks),
                                            "behind": behind.isoformat()})


@dataclass(frozen=True)
class NodeParts:
    """What a started node runs (built by :meth:`Node.start` all at once)."""

    membership: Membership
    store: Store
    latch: LeaderLatch
    bus: MessageBus
    sync: OntologySync
    pipeline: Pipeline
    processor: TaskLoop
    master: MasterDuties
    metrics: NodeMetrics | None
    observers: list[Observer]  # the metrics, then the node's own: built once
    processed: ZkProcessedLog  # the MASTER messages' processed ids


class NodeState(enum.Enum):
    """A node's lifecycle (Curator's, like the coord recipes'): LATENT until ``start()``,
    STARTED, CLOSED after ``close()``; a node is started once."""

    LATENT = "LATENT"
    STARTED = "STARTED"
    CLOSED = "CLOSED"


class Node:
    """One cluster node built from :class:`Settings`; ``start()`` then ``close()``.

    ``start()`` a second time, or after ``close()``, raises :class:`~coord.LifecycleError`; a
    start that fails closes what it had started and leaves the node CLOSED; ``close()`` is
    idempotent."""

    def __init__(self, settings: Settings, registry: TaskRegistry | None = None, *,
                 observers: Sequence[Observer] = ()) -> None:
        self.state = NodeState.LATENT
        self.settings = settings
        #: what the node reports to, after its metrics (:mod:`runner.tasks.observer`)
        self.observers = list(observers)
        self.streams = StreamRegistry()  # filled by the --tasks modules' @stream handlers
        #: the built-in commands and broadcasts, then the --tasks modules' own
        self.commands = CommandRegistry()
        if registry is None:
            registry = node_registry(settings, self.streams, self.commands)
        else:
            register_commands(self.commands, builtin_commands, builtin=True)
        self.registry = registry
        #: what handlers get (tasks' ctx.services, commands' too): filled by start()
        self.services = Services()
        self.incident_hooks = load_hooks(settings.incident_hooks)
        self.session = zk_session(settings)
        self.cache = OntologyCache()
        self.aspects = AspectRegistry(settings.aspects)  # a bad definition fails the start
        if settings.retention_days is not None and settings.retention_mode == "archive":
            extra.require('retention_mode = "archive" (Parquet files of finished tasks)')
        self._parts: NodeParts | None = None
        #: what start() started, closed in reverse by close() (a failed start included)
        self._closers = ExitStack()

    def _started(self) -> NodeParts:
        if self._parts is None:
            raise LifecycleError(f"node is {self.state.value}, not started")
        return self._parts

    # -- the parts of a started node (LifecycleError before start() has built them) ----------
    @property
    def membership(self) -> Membership:
        return self._started().membership

    @property
    def store(self) -> Store:
        return self._started().store

    @property
    def latch(self) -> LeaderLatch:
        return self._started().latch

    @property
    def bus(self) -> MessageBus:
        return self._started().bus

    @property
    def sync(self) -> OntologySync:
        return self._started().sync

    @property
    def pipeline(self) -> Pipeline:
        return self._started().pipeline

    @property
    def processor(self) -> TaskLoop:
        return self._started().processor

    @property
    def master(self) -> MasterDuties:
        return self._started().master

    @property
    def metrics(self) -> NodeMetrics | None:
        return self._started().metrics

    @property
    def member_id(self) -> str:
        return self._started().membership.member_id

    def start(self) -> Node:
        if self.state is not NodeState.LATENT:
            raise LifecycleError(f"node is {self.state.value}; start() works once")
        self.state = NodeState.STARTED
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        """Join (the graph's format checked first, then the session and the membership),
        build every part, then start them, each one's close registered as it starts."""
        store, membership = self._join()
        self._parts = self._build(store, membership)
        self._run(self._parts)

    def _join(self) -> tuple[Store, Membership]:
        closers = self._closers
        # the graph's store format first: a graph to migrate (or a newer one) stops the start
        # here, before this node joins anything
        store = graph_store(self.settings)
        closers.callback(store.close)
        self.session.start()
        closers.callback(self.session.close)
        closers.callback(stop_spark)
        membership = Membership(self.session, version=__version__,
                                details={"commands": self.commands.describe(),
                                         layout.FORMAT_KEY: migrations.CURRENT}).start()
        closers.callback(membership.close)
        member = membership.member_id
        layout.check_on_join(self.session, store, member)
        self.session.add_listener(
            lambda state: log.log(logging.INFO if state is SessionState.CONNECTED
                                  else logging.WARNING,
                                  "member %s: ZooKeeper session %s", member, state.value,
                                  extra=logs.event(f"session.{state.value.lower()}")))
        self.cache.reload(store)
        return store, membership

    def _build(self, store: Store, membership: Membership) -> NodeParts:
        s = self.settings
        member = membership.member_id
        latch = LeaderLatch(self.session, member)
        latch.add_listener(
            on_gain=lambda: log.info("member %s: became master", member,
                                     extra=logs.event("master.gained")),
            on_loss=lambda: log.warning("member %s: no longer master", member,
                                        extra=logs.event("master.lost")))
        metrics = NodeMetrics(self.commands.known) if s.metrics_port is not None else None
        # built once; the same list goes to the task loop, the master's duties, the commands
        # and (one adapter) the bus
        observers: list[Observer] = [*([metrics] if metrics else []), *self.observers]
        bus = MessageBus(amqp_connector(s, name=f"latchwork {member}"), Topology(s.cluster),
                         member, max_body=s.max_message_bytes,
                         on_outcome=[delivery_hook(observers)])
        sync = OntologySync(s.ontology_source, store, bus, member,
                            is_master=lambda: latch.is_leader, submit_flow=self.submit_flow)
        pipeline = Pipeline(s, self.session, store, self.cache, self.aspects,
                            submit=self.submit, member=member)
        processor = TaskLoop(
            self.session, member, store, self.registry,
            LoopSettings(workers=s.workers, scan_interval=s.scan_interval, limits=s.concurrency,
                         store_retry_for=s.graph_retry_for, prefetch=s.prefetch),
            live_members=membership.live_ids,
            services=self.services,
            observers=[*observers, ScanOnRelease(bus)])
        for service in (bus, sync, pipeline, self.session, self.streams,
                        StreamLiveness(s.stream_liveness_host or None), self.cache, store,
                        processor):
            self.services.add(service)
        processed = ZkProcessedLog(self.session)  # the bus's claims, the master's pruning
        master = MasterDuties(
            latch, store, reap_interval=s.reap_interval,
            pruning=Pruning(processed, retention=s.processed_retention),
            on_master=lambda: bus.send_master("SYNCHRONIZE_MODEL", {"reason": "new master"}),
            on_freed=lambda ids: bus.broadcast("TRIGGER_SCAN", {"freed": ids}),
            observers=observers,
            duties=self._duties(store, member))
        return NodeParts(membership, store, latch, bus, sync, pipeline, processor, master,
                         metrics, observers, processed)

    def _run(self, parts: NodeParts) -> None:
        s, closers = self.settings, self._closers
        self.register_messages(parts.bus)
        parts.bus.start(parts.latch, parts.processed,
                        on_model_reconnect=self._model_reconnected)
        closers.callback(parts.bus.close)
        parts.latch.start()
        closers.callback(parts.latch.close)
        parts.master.start()
        closers.callback(parts.master.close)
        parts.processor.start()
        # attempts written, locks freed
        closers.callback(parts.processor.close, s.shutdown_timeout)
        # an operator's cancel (on any node) reaches the handler through this mailbox
        mailbox = Mailbox(self.session, parts.membership.member_id,
                          functools.partial(intake.mail, self)).start()
        closers.callback(mailbox.close)
        parts.sync.start_watching()
        closers.callback(parts.sync.close)
        metrics = parts.metrics
        if metrics is not None:
            assert s.metrics_port is not None  # metrics exist because the port is set
            metrics.watch(self._live_state)
            metrics.serve(s.metrics_port, s.metrics_host)
            closers.callback(metrics.close)
            log.info("member %s: metrics on http://%s:%d/metrics", parts.membership.member_id,
                     s.metrics_host, s.metrics_port)

    def _duties(self, store: Store, member: str) -> list[tuple[str, Callable[[], object]]]:
        """The master's rounds besides reaping: schedules, incidents, and the retentions
        configured."""
        s = self.settings
        duties: list[tuple[str, Callable[[], object]]] = [
            ("schedules", ScheduleFirer(store, self.submit).tick),
            ("incidents", IncidentWatch(store, self.registry, member, self.incident_hooks,
                                        s.incident_webhook).tick),
            ("store layout", layout.LayoutWatch(self.session, store, member).tick),
            ("workflows", WorkflowRound(store, member).tick)]
        if s.stream_retention > 0:
            duties.append(("stream retention", StreamRetention(
                self.session, self.streams, member, s.stream_retention,
                s.stream_retention_interval).tick))
        if s.retention_days is not None:
            duties.append(("retention", Retention(
                self.session, store, member, s.retention_days, s.retention_mode, s.data_dir,
                s.retention_batch, s.retention_interval).tick))
        return duties

    def _live_state(self) -> LiveState:
        """What the metrics read at scrape time."""
        parts = self._started()
        return LiveState(
            connected=self.session.state is SessionState.CONNECTED,
            master=parts.latch.is_leader,
            stats=dict(parts.processor.stats),
            connections={c.name: c.connections_opened for c in parts.bus.consumers},
            store=self.store.graph.stats.snapshot(),
            workflows=self._workflow_counts() if parts.latch.is_leader else None)

    def _workflow_counts(self) -> dict[str, int] | None:
        """The master's count of workflows by state for the metrics (None when the graph
        does not answer: the scrape goes on without it)."""
        try:
            return self.store.workflows.counts()
        except StoreError:
            return None

    def _model_reconnected(self) -> None:
        """The MODEL connection came back: broadcasts sent meanwhile were missed, so each
        broadcast's catch-up runs (the built-ins: reload the ontology cache, scan now)."""
        log.info("member %s: the MODEL connection came back; running the broadcasts' "
                 "catch-ups", self.member_id)
        self.commands.reconnected(self.services)

    def submit(self, req: TaskSubmit, request: uuid.UUID | None = None) -> Task:
        """Create a task: the API's ``task.submit`` and every task the node makes itself
        (:func:`runner.node.intake.submit`)."""
        return intake.submit(self, req, request)

    def submit_many(self, req: TaskSubmitMany) -> list[Task]:
        """Create a page of tasks in one store write (:func:`runner.node.intake.submit_many`)."""
        return intake.submit_many(self, req)

    def cancel(self, task_id: str, by: str, reason: str | None = None) -> Cancelled:
        """Deactivate a task and cancel its running attempt cluster-wide
        (:func:`runner.node.intake.cancel`)."""
        return intake.cancel(self, task_id, by, reason)

    def submit_workflow(self, req: WorkflowSubmit) -> WorkflowView:
        """A page of a workflow (:func:`runner.node.workflows.submit`)."""
        return workflows.submit(self, req)

    def submit_flow(self, flow: Flow, key: str) -> WorkflowRef:
        """A workflow the node makes itself (the ontology sync's), every page of it taken
        here as ``workflow.submit`` would take them."""
        pages = workflow_pages(flow, key)
        answer = None
        for req in pages:
            answer = workflows.submit(self, req)
        assert answer is not None
        return submitted(pages[0], answer)

    def cancel_workflow(self, workflow_id: str, by: str,
                        reason: str | None = None) -> WorkflowCancelled:
        """Cancel a workflow's unfinished members (:func:`runner.node.workflows.cancel`)."""
        return workflows.cancel(self, workflow_id, by, reason)

    def workflow_report(self, workflow_id: str) -> WorkflowReport:
        """A workflow and its members (:func:`runner.node.workflows.report`)."""
        return workflows.report(self, workflow_id)

    def register_messages(self, bus: MessageBus) -> None:
        """The declared commands and broadcasts (:mod:`runner.node.commands`, then the
        ``--tasks`` modules'), then the node's API (:class:`NodeApi`). Handlers read the
        node's services when a message arrives, so registering needs nothing started."""
        observers = self._parts.observers if self._parts is not None else self.observers
        self.commands.install(bus, self.services, observers)
        NodeApi.register(self, bus)

    def close(self) -> None:
        """Close what start() started, in reverse: metrics, the ontology watch, the task loop
        (its tasks cancelled, their attempts written and locks released within
        ``shutdown_timeout``), the master's duties, the latch, the bus, the graph, the
        membership, Spark, the session. Idempotent."""
        if self.state is NodeState.CLOSED:
            return
        self.state = NodeState.CLOSED
        if self._session_state() is not None:
            # ZooKeeper not answering, now or while the parts close: the session is closed
            # first, so that every ZooKeeper call still waiting (kazoo holds one for ever in a
            # partition: a handler's, a latch's, a tidying delete) fails at once and each
            # part closes without it; what they would have deleted goes with the session's
            # expiry or is pruned by the master. (A node stopped during a partition waited
            # for ever.)
            self.session.add_listener(self._close_session_unless_connected)
            self._close_session_unless_connected(self.session.state)
        self._closers.close()

    def _close_session_unless_connected(self, state: SessionState) -> None:
        if state is not SessionState.CONNECTED and self.session.state is not \
                SessionState.CONNECTED:
            log.warning("member %s: closing while ZooKeeper is not connected (%s): its "
                        "session is closed first", self.member_id, state.value)
            self.session.close()

    def _session_state(self) -> SessionState | None:
        """The session's state once it was started (None before)."""
        try:
            self.session.client  # noqa: B018  # raises until started
        except LifecycleError:
            return None
        return self.session.state

    def __enter__(self) -> Node:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


