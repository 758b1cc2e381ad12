"""A node's Prometheus metrics, served on ``metrics_port`` (off unless set).

Each node has its own registry (no global one), served by prometheus_client's HTTP server on
``metrics_host:metrics_port``:

* ``latchwork_attempts_started_total{type}``, ``latchwork_attempts_total{type,status}`` and
  ``latchwork_attempt_seconds{type,status}`` (histogram): every attempt this node started, and
  how it ended (SUCCEEDED, FAILED, CANCELLED_BY_SYSTEM); counted by before- and after-attempt
  hooks of the task loop;
* ``latchwork_task_claims_total{result}``: ``started``, ``lock_busy`` (another node holds the
  lock), ``stale`` (the task changed since it was listed), ``lock_lost_at_start`` (a new task
  written claimed whose lock could not be had: its attempt cancelled before the handler);
  ``latchwork_task_scans_total`` and ``latchwork_scan_seconds`` (histogram);
  ``latchwork_locks_freed_total``;
* ``latchwork_session_connected``, ``latchwork_is_master`` (0 or 1, read at scrape time);
* ``latchwork_messages_total{paradigm,outcome}``: MASTER, MODEL and API messages by what
  happened to them (handled, duplicate, retried, dead-lettered, requeued);
* ``latchwork_commands_total{command,outcome}``: the declared MASTER commands and MODEL
  broadcasts (``@command``, ``@broadcast``) by outcome (handled, duplicate, retried,
  dead-lettered, requeued; a name nobody declares counts as ``(unknown)``), and
  ``latchwork_command_seconds{command,result}`` (histogram): their handlers' runs, ``ok``,
  ``failed`` or ``cancelled``;
* ``latchwork_broker_connections_total{consumer}``: connections each consumer opened (1 +
  reconnections);
* ``latchwork_store_calls_total{kind}`` and ``latchwork_store_seconds_total{kind}``: the graph
  store's reads and writes (a write: one transaction, or one guarded traversal on a server
  without transactions) and the time spent in them.

Failure behaviour: a port that is taken fails the node's start with the reason; metrics never
fail a task or a message (a hook that raises is logged by its caller and ignored).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from messaging import Delivery, DeliveryOutcome, Envelope, Paradigm
from runner.store import AttemptStatus
from runner.tasks import TaskContext
from runner.tasks.observer import Observer


@dataclass(frozen=True)
class LiveState:
    """What the node tells its metrics at scrape time."""
    connected: bool  # the ZooKeeper session is CONNECTED
    master: bool
    stats: Mapping[str, int]  # the task loop's counters (claims by result, listings)
    connections: Mapping[str, int]  # RabbitMQ connections opened per consumer
    store: Mapping[str, float] | None  # the graph store's calls (StoreCalls.snapshot)
    #: the master's count of workflows by state (None on the other nodes: one exporter)
    workflows: Mapping[str, int] | None = None


class _Live(Collector):
    """What is read from the node at scrape time."""

    def __init__(self, read: Callable[[], LiveState]) -> None:
        self.read = read

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        state = self.read()
        yield GaugeMetricFamily("latchwork_session_connected",
                                "1 while the ZooKeeper session is CONNECTED",
                                value=1.0 if state.connected else 0.0)
        yield GaugeMetricFamily("latchwork_is_master", "1 while this node is the master",
                                value=1.0 if state.master else 0.0)
        claims = CounterMetricFamily("latchwork_task_claims",
                                     "task claims by result (started, lock_busy, stale, "
                                     "lock_lost_at_start)", labels=["result"])
        for result in ("started", "lock_busy", "stale", "lock_lost_at_start"):
            claims.add_metric([result], float(state.stats.get(result, 0)))
        yield claims
        yield CounterMetricFamily("latchwork_task_scans", "listings of the open tasks",
                                  value=float(state.stats.get("listings", 0)))
        connections = CounterMetricFamily("latchwork_broker_connections",
                                          "RabbitMQ connections opened per consumer "
                                          "(1 + reconnections)", labels=["consumer"])
        for name, count in state.connections.items():
            connections.add_metric([name], float(count))
        yield connections
        store = state.store
        if store is not None:
            calls = CounterMetricFamily("latchwork_store_calls",
                                        "graph store calls (a write is one transaction or one "
                                        "guarded traversal)", labels=["kind"])
            seconds = CounterMetricFamily("latchwork_store_seconds",
                                          "time spent in graph store calls", labels=["kind"])
            for kind in ("read", "write"):
                calls.add_metric([kind], float(store[f"{kind}s"]))
                seconds.add_metric([kind], float(store[f"{kind}_seconds"]))
            yield calls
            yield seconds
        if state.workflows is not None:
            flows = GaugeMetricFamily("latchwork_workflows", "workflows by state (the master "
                                      "exports it)", labels=["state"])
            for name, count in sorted(state.workflows.items()):
                flows.add_metric([name], float(count))
            yield flows


class NodeMetrics(Observer):
    """The node's Prometheus metrics: an :class:`~runner.tasks.observer.Observer` of its task
    loop and message bus, plus what is read at scrape time."""

    def __init__(self, known_commands: Callable[[str], bool] = lambda name: False) -> None:
        self.known_commands = known_commands
        self.registry = CollectorRegistry(auto_describe=True)
        self.started = Counter("latchwork_attempts_started", "attempts this node started",
                               ["type"], registry=self.registry)
        self.attempts = Counter("latchwork_attempts", "attempts run by this node, by how "
                                "they ended", ["type", "status"], registry=self.registry)
        self.attempt_seconds = Histogram(
            "latchwork_attempt_seconds", "attempt duration", ["type", "status"],
            buckets=(0.01, 0.1, 0.5, 1, 5, 15, 60, 300, 1800, 7200), registry=self.registry)
        self.scan_seconds = Histogram("latchwork_scan_seconds", "one pass of the task loop",
                                      buckets=(0.001, 0.005, 0.02, 0.1, 0.5, 2, 10),
                                      registry=self.registry)
        self.messages = Counter("latchwork_messages", "messages by paradigm and outcome",
                                ["paradigm", "outcome"], registry=self.registry)
        self.commands = Counter("latchwork_commands", "declared MASTER commands and MODEL "
                                "broadcasts by what happened to their messages",
                                ["command", "outcome"], registry=self.registry)
        self.command_seconds = Histogram(
            "latchwork_command_seconds", "a declared command's or broadcast's handler run, by "
            "result (ok, failed, cancelled)", ["command", "result"],
            buckets=(0.001, 0.01, 0.1, 0.5, 1, 5, 30, 120, 600), registry=self.registry)
        self.locks_freed = Counter("latchwork_locks_freed", "task locks this node freed as "
                                   "master (their owner was gone)", registry=self.registry)
        self._server: tuple[WSGIServer, threading.Thread] | None = None

    def watch(self, read: Callable[[], LiveState]) -> None:
        """Register what is read at scrape time (see :class:`_Live`)."""
        self.registry.register(_Live(read))

    # -- the observer's hooks --------------------------------------------------------------
    def before_attempt(self, ctx: TaskContext) -> None:
        self.started.labels(ctx.task.type).inc()

    def after_attempt(self, ctx: TaskContext, status: AttemptStatus, error: str | None) -> None:
        labels = (ctx.task.type, status.value)
        self.attempts.labels(*labels).inc()
        started = ctx.attempt.started_at.timestamp()
        self.attempt_seconds.labels(*labels).observe(max(0.0, time.time() - started))

    def after_scan(self, seconds: float) -> None:
        self.scan_seconds.observe(seconds)

    def on_delivery(self, delivery: Delivery, envelope: Envelope | None,
                    outcome: DeliveryOutcome, detail: str) -> None:
        paradigm = envelope.paradigm.value if envelope is not None else "undecodable"
        self.messages.labels(paradigm, outcome.value).inc()
        if envelope is not None and envelope.paradigm is not Paradigm.API:
            # a name nobody declares (dead-lettered unknown) is not a label of its own
            name = envelope.command if self.known_commands(envelope.command) else "(unknown)"
            self.commands.labels(name, outcome.value).inc()

    def after_command(self, name: str, seconds: float, result: str) -> None:
        self.command_seconds.labels(name, result).observe(seconds)

    def on_lock_freed(self, task_id: str, owner: str) -> None:
        self.locks_freed.inc()

    # -- serving ----------------------------------------------------------------------------
    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        self._server = start_http_server(port, addr=host, registry=self.registry)

    def close(self) -> None:
        if self._server is not None:
            server, thread = self._server
            server.shutdown()
            server.server_close()
            thread.join(5)
            self._server = None
