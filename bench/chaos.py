"""The chaos suite: a cluster run the way it fails in production, checked against what latchwork
promises. Prints one JSON table and exits 1 if any figure that must be zero is not.

What runs (all on loopback, servers and nodes started here and stopped by PID):

* a 3-server ZooKeeper ensemble and RabbitMQ, from the Debian packages;
* 3 node processes (``runner.testing.chaosnode``: the node ``latchwork node start`` runs, plus
  its session credentials in a file and a recorded MASTER command), each reaching ZooKeeper
  through loopback proxies that can silently partition it;
* mixed tasks in a shared embedded graph: ``diag.effect`` (sleep, ``ctx.check()``, then an
  effect record and the success in one fenced write), ``diag.append`` (sleep polling
  ``ctx.cancel``, ``ctx.check()``, then one line appended to a file: an effect nothing fences,
  the way a user's handler touches a system that cannot check a token), ``diag.sleep``,
  ``diag.conflict`` (commit conflicts, retried), ``diag.fail`` (stops the task, by design),
  and the long-job shapes of :mod:`runner.testing.chaoscommands`: ``chaos.steps`` (a job that
  checkpoints every 5 of its 20 steps), ``chaos.hang`` and ``chaos.crash`` (process isolated,
  their first attempt hangs past its timeout or segfaults: the ``hang`` and ``crash`` faults);
  half of the plain ones submitted through the client as a user does (a node with a free
  worker writes such a task already running, in one write after its lock:
  ``submitted_through_the_client`` and ``running_when_the_submit_answered`` in
  ``task_shapes``), the others written to the store;
* the user-declared MASTER command ``chaos.record`` (``@command``) sent through the client with
  confirms, some sent twice with the same id back to back (a retry after a lost confirm);
* a burst: the profile's ``burst`` short tasks (2,000 in the full profile) sent with
  ``Client.submit_many`` while one more fault (drawn from :data:`BURST_FAULTS`) hits, so faults
  land on claims made in batches and ends written in groups; ``burst`` in the table gives the
  claim batches by size (the tasks of one batch share their token) and those a fault hit.
  The fault comes once its victim runs tasks of the burst (how many: in the table), so that it
  lands on claims in hand, not beside the burst.

Faults injected while they run, in an order drawn from the seed: kill -9 of a node and of the
master (each restarted), SIGSTOP past the session timeout, a silent partition of one node
(packets dropped, sockets open), kill -9 and restart of the ZooKeeper leader (twice: once at
a random moment, once at the very moment a burst of handlers ends, ``zk_leader_ending``),
RabbitMQ stop_app/start_app, a forced expiry of a node's session.

The figures (all must be 0 but the time to drain):

* ``tasks_lost``: a task that should have finished (or, for ``diag.fail``, stopped with its
  failure) and did not, by the end of the drain;
* ``finished_without_succeeded_attempt``;
* ``effects_applied_twice``: a ``diag.effect`` task with more than one effect record;
* ``effects_from_a_closed_attempt``: an effect record whose attempt did not end SUCCEEDED;
* ``unfenced_effects_twice``: a ``diag.append`` task with more than one line in the file;
* ``unfenced_effects_from_a_closed_attempt``: a line whose attempt did not end SUCCEEDED.
  Both leave out the two windows docs/reliability.md states: the owner paused between its
  last ``ctx.check()`` and its effect (a SIGSTOP that began after the check returned), and
  the owner killed -9 after its effect, before its group wrote the attempt's end (within
  :data:`KILL_WINDOW` of the line); those cases are listed apart, with their timings, as
  ``unfenced_effects_in_the_stated_window``;
* ``tasks_created_twice``: tasks of the run's types in the store that no submit of the run
  answered with, beyond those its failed submits may have written: a submit handled twice
  (the broker delivers an API request again when the node that took it dies or is cut off
  before its ack), each handling writing a task of its own;
* ``needless_reruns``: an attempt closed CANCELLED_BY_SYSTEM although its owner was not
  disrupted while it ran (not killed, paused, partitioned, nor its session expired): a
  ZooKeeper leader election, a broker restart or another node's fault cost it its work;
* ``overlapping_owners``: two attempts of one task whose [start, end] overlap;
* ``interrupted_attempts_not_cancelled_by_system``: an attempt that ended FAILED or CANCELLED
  for any reason but its handler's own (a diag.fail or a commit conflict), or is still RUNNING;
* ``confirmed_master_messages_lost``: a confirmed chaos.record without its effect;
* ``master_messages_handled_twice``: a chaos.record whose handler completed more than once;
* ``lock_znodes_left``: task lock parents left under ``locks/tasks`` once everything ended;
* ``holds_left``: exclusive holds (a resource, an ordering key) left under ``slots/held`` once
  everything ended: a live member's session keeps one for as long as it lives, and every task
  that needs it waits (a release run while the connection was down left them);
* ``started_before_run_at``: an attempt of a delayed task (a share of the tasks get a ``run_at``
  a few seconds ahead) that started before it;
* ``ordering_violations``: a task of an ordering key (a share of the tasks carry one of 4)
  whose first attempt started before the previous task of its key had ended;
* ``resource_holders_overlapping``: two SUCCEEDED attempts of tasks that declare one resource
  (a share take two of 4) that overlap in time;
* ``work_redone_before_checkpoint``: a step of a ``chaos.steps`` job that ran again in a later
  attempt although an earlier attempt had committed a checkpoint past it
  (``work_redone_after_checkpoint``, the steps after the last checkpoint run again by design,
  is reported beside it);
* ``hung_attempts_left``: an attempt still RUNNING once everything ended;
* ``workflow_members_succeeded_twice``, ``joins_twice``, ``workflow_members_started_early``,
  ``workflows_stuck``: each round submits a workflow (a chain of 3 ``diag.effect``, a fan-out
  of 20 with a join, a ``chaos.spawner`` of 5 children and a step after it; issue 72): a
  member with two SUCCEEDED attempts, a join so, a member whose first attempt started before
  everything it depends on had succeeded, a workflow with a member unfinished once drained;
* ``schedule_fires_twice``: a fire of the run's every-second schedule (``chaos-tick``, fired by
  whichever node is master through every fault) with more than one task; the fires with a task
  and the fires missed (expected only where no master existed for over ``GRACE`` seconds:
  the misfire policy) are reported beside it. The schedule's tasks count in the figures above
  like the submitted ones.

With ``--graph server`` the nodes share a Gremlin Server (TinkerGraph, one traversal at a
time) instead of the file, each through a link of its own, and two faults join: one node's
link to the graph silenced (``graph_cut``) and the server stopped and started again
(``graph_restart``: its data written on the stop and read back).

With ``--hosts`` every node and server runs on a host of its own (a network namespace on a
bridge: :mod:`coord.testing.hosts`), the nodes on the server graph, and the faults are the
network's: ``partition`` takes a node's link down, ``graph_cut`` drops what it sends to the
graph host, ``one_way_cut`` lets it hear everything and send nothing, ``degrade`` adds latency
and loss (tc netem; left out, and said so in ``faults_left_out``, where the kernel lacks it).
A machine that cannot make namespaces (not root) prints why in one line and exits 0.

Usage: ``python bench/chaos.py [--profile short|full] [--seed N] [--keep DIR]
[--graph embedded|server] [--hosts]``; ``make chaos`` runs the full profile (``CHAOS_ARGS``
adds options), ``make test`` the short one on the file, on the server graph and across hosts
(``tests/test_chaos.py``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from gremlin_python.process.traversal import P
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from coord import Session, read_leader, read_members
from coord.slots import HELD, exclusive_holders
from coord.testing import (
    FaultInjectionFailed,
    NodeProcess,
    TcpProxy,
    ZooKeeperCluster,
    kill_ensemble_leader,
    wait_until,
)
from coord.testing.hosts import Host, HostNetwork, hosts_unavailable_reason
from messaging import (
    Connector,
    Topology,
    declare_topology,
)
from messaging.processed import HANDLING, PROCESSED
from messaging.testing import RabbitMQServer
from runner.client import Client
from runner.errors import ClientError
from runner.store import Attempt, AttemptStatus, Store, Task, codec, open_store
from runner.store.server.graph import SERIAL
from runner.tasks.features.diag import AppendRecord, appended, effects
from runner.tasks.master import schedules
from runner.tasks.master.duties import FULL_REAP_INTERVAL
from runner.tasks.master.schedules import ScheduleSpec
from runner.templates import TaskTemplate
from runner.testing.chaoscommands import COMMAND, EFFECTS, RUNS
from runner.testing.gremlinserver import GremlinServer
from runner.workflows import chain, chord, group, plan
from runner.workflows import step as workflow_step

CLUSTER = "chaos"
ZERO = ("tasks_lost", "finished_without_succeeded_attempt", "effects_applied_twice",
        "effects_from_a_closed_attempt", "unfenced_effects_twice",
        "unfenced_effects_from_a_closed_attempt", "tasks_created_twice", "needless_reruns",
        "overlapping_owners",
        "interrupted_attempts_not_cancelled_by_system", "confirmed_master_messages_lost",
        "master_messages_handled_twice", "lock_znodes_left", "holds_left",
        "started_before_run_at",
        "ordering_violations", "resource_holders_overlapping", "schedule_fires_twice",
        "hung_attempts_left", "work_redone_before_checkpoint",
        "workflow_members_succeeded_twice", "joins_twice", "workflow_members_started_early",
        "workflows_stuck")
#: the workflows a run submits, one per round in turn (:meth:`Run.submit_workflow`)
WORKFLOW_SHAPES = ("chain", "fan-out", "spawner")
#: the kinds whose retry policy moves their run_at (their first attempt hangs or crashes)
RETRIED = ("chaos.hang", "chaos.crash")
#: the run's recurring schedule: every second, through every fault
SCHEDULE = "chaos-tick"
#: resources some tasks take (two of these each), and ordering keys some tasks carry
RESOURCES = ("ontology:brick", "aspect:geo", "aspect:time", "file:/shared")
KEYS = 4
FAULTS = ("kill_node", "kill_master", "sigstop", "partition", "zk_leader", "zk_leader_ending",
          "broker_restart", "session_expiry")
#: the faults of the graph, added with ``--graph server``: one node's link to the graph server
#: silenced, and the server stopped and started again (its data written and read back)
GRAPH_FAULTS = ("graph_cut", "graph_restart")
#: with ``--hosts`` (every node and server on a host of its own), the network's faults: a
#: node's link cut both ways is ``partition``; a one-way cut (it hears, cannot send); latency
#: and loss (``degrade``: tc netem, where the kernel has it)
HOST_FAULTS = ("one_way_cut", "degrade")
#: the faults the burst round draws one of (``--graph server`` and ``--hosts`` add none)
BURST_FAULTS = ("kill_node", "kill_master", "sigstop", "partition", "zk_leader",
                "session_expiry", "broker_restart")
#: how many handlers the ``zk_leader_ending`` fault makes end at the moment of the kill
ENDING = 12


@dataclass(frozen=True)
class Profile:
    tasks: int
    session: float  # ZooKeeper session timeout of the nodes, seconds
    messages: int  # chaos.record messages (a third of them published twice)
    task_seconds: tuple[float, float]  # how long effect and sleep tasks take
    drain: float  # seconds allowed for everything to end after the last fault
    burst: int  # short tasks submitted with submit_many while one more fault hits


PROFILES = {
    "short": Profile(tasks=120, session=2.0, messages=30, task_seconds=(0.3, 2.0), drain=45.0,
                     burst=300),
    "full": Profile(tasks=360, session=4.0, messages=100, task_seconds=(0.2, 2.0), drain=180.0,
                    burst=2000),
}


@dataclass
class Node:
    process: NodeProcess
    member: str
    proxies: list[TcpProxy]
    session_file: Path
    graph_proxy: TcpProxy | None = None


@dataclass
class Run:
    profile: Profile
    rng: random.Random
    workdir: Path
    zk: ZooKeeperCluster
    rabbit: RabbitMQServer
    store: Store
    nodes: list[Node] = field(default_factory=list)
    tasks: dict[str, str] = field(default_factory=dict)  # task id -> type
    #: tasks submitted through the client -> their status in the submit's answer
    through_api: dict[str, str] = field(default_factory=dict)
    # tasks a failed submit may have written all the same (its answer lost): at most this
    # many tasks of the store are not among ``tasks``
    unanswered_submits: int = 0
    confirmed: set[str] = field(default_factory=set)  # chaos.record ids the broker confirmed
    injected: Counter[str] = field(default_factory=Counter)
    restarts: int = 0
    log: list[str] = field(default_factory=list)
    #: (member, fault, from, to): epoch seconds during which the fault may cost that member
    #: its work (``to`` infinite for a kill: the member never comes back)
    disrupted: list[tuple[str, str, float, float]] = field(default_factory=list)
    #: the graph server the nodes share (``--graph server``), each through a proxy of its own
    graph_server: GremlinServer | None = None
    #: ``--hosts``: the network, and the host each node runs on (by node index)
    network: HostNetwork | None = None
    node_hosts: list[Host] = field(default_factory=list)
    graph_host: Host | None = None
    #: faults left out, each with why (e.g. no netem on this kernel)
    skipped: list[str] = field(default_factory=list)
    #: the burst round: its tasks (submitted with submit_many) and the fault that hit it
    burst_tasks: list[str] = field(default_factory=list)
    burst_fault: str = ""
    burst_running: int = 0  # the burst's attempts running on the victim when the fault came
    #: the run's workflows by key: their shape and their members' task ids (plan order)
    workflows: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    workflow_submits_failed: int = 0

    @property
    def appends(self) -> Path:
        return self.workdir / "appended.jsonl"

    @property
    def steps(self) -> Path:
        """``chaos.steps``'s record: each step started, each checkpoint committed."""
        return self.workdir / "steps.jsonl"

    def say(self, line: str) -> None:
        stamp = f"{time.monotonic() - T0:7.1f}s"
        self.log.append(f"{stamp} {line}")
        print(f"chaos {stamp} {line}", file=sys.stderr, flush=True)

    # -- nodes ------------------------------------------------------------------------------
    def env(self, proxies: list[TcpProxy], graph_proxy: TcpProxy | None,
            host: Host | None = None) -> dict[str, str]:
        hosts = ",".join(f"127.0.0.1:{p.port}" for p in proxies)
        graph = {"LATCHWORK_GRAPH": str(self.workdir / "graph.db")} if graph_proxy is None else {
            "LATCHWORK_GRAPH": f"ws://127.0.0.1:{graph_proxy.port}/gremlin",
            "LATCHWORK_GRAPH_SERIAL_SERVER": "true", "LATCHWORK_GRAPH_TIMEOUT": "3"}
        if host is not None:  # on a host of its own: the servers' addresses, no proxies
            assert self.graph_server is not None
            hosts = self.zk.hosts
            graph = {"LATCHWORK_GRAPH": self.graph_server.url,
                     "LATCHWORK_GRAPH_SERIAL_SERVER": "true", "LATCHWORK_GRAPH_TIMEOUT": "3",
                     # what other hosts reach this node at
                     "LATCHWORK_STREAM_LIVENESS_HOST": host.address,
                     "LATCHWORK_SPARK_DRIVER_HOST": host.address}
        return {**os.environ, "LATCHWORK_CLUSTER": CLUSTER, "LATCHWORK_ZK_HOSTS": hosts,
                "LATCHWORK_AMQP_URL": self.rabbit.url, **graph,
                "LATCHWORK_SESSION_TIMEOUT": str(self.profile.session),
                "LATCHWORK_SCAN_INTERVAL": "1", "LATCHWORK_REAP_INTERVAL": "0.5",
                "LATCHWORK_WORKERS": "2", "LATCHWORK_SHUTDOWN_TIMEOUT": "10",
                "LATCHWORK_DATA_DIR": str(self.workdir / "data")}

    def start_node(self, index: int) -> Node:
        host = self.node_hosts[index] if self.network is not None else None
        proxies = [] if host is not None else [TcpProxy(s.client_port).start()
                                               for s in self.zk.servers]
        graph_proxy = (TcpProxy(self.graph_server.port).start()
                       if self.graph_server is not None and host is None else None)
        session_file = self.workdir / f"node{index}-{self.restarts}.session"
        process = NodeProcess(["-m", "runner.testing.chaosnode", str(session_file)],
                              self.workdir / f"node{index}-{self.restarts}.log",
                              env=self.env(proxies, graph_proxy, host), name=f"node{index}",
                              netns=host.netns if host is not None else None)
        line = process.start(ready_timeout=60, ready_prefix="latchwork node")
        member = line.split()[0]
        node = Node(process, member, proxies, session_file, graph_proxy)
        if index < len(self.nodes):
            self.nodes[index] = node
        else:
            self.nodes.append(node)
        return node

    def restart(self, index: int) -> None:
        old = self.nodes[index]
        for proxy in [*old.proxies, *([old.graph_proxy] if old.graph_proxy else [])]:
            proxy.close()
        old.process.close()
        self.restarts += 1
        self.start_node(index)

    def master_index(self, reader: Session) -> int:
        leader = read_leader(reader)
        for i, node in enumerate(self.nodes):
            if node.member == leader:
                return i
        return self.rng.randrange(len(self.nodes))

    # -- work -------------------------------------------------------------------------------
    def submit_tasks(self, count: int) -> None:
        """``count`` tasks of every shape, written to the store; half of the plain ones (no
        key, resource or due time) submitted through the client as a user does, which a node
        with a free worker writes already running (``TaskLoop.start_new``), so the faults that
        follow hit tasks started that way too. A submit that fails is told and not counted
        (the task may exist all the same: it runs, and its effects are checked like any)."""
        with Client(self.rabbit.url, CLUSTER, timeout=5.0, sender="chaos") as client:
            self._submit_tasks(count, client)

    def submit_workflow(self, client: Client) -> None:
        """One workflow, the shapes in turn: a chain of 3, a fan-out of 20 with a join, a
        spawner of 5 children and a step after it (its members ``diag.effect`` tasks, their
        effects counted like any). Sent again with its key while it is not answered (the
        submit is idempotent); one never answered is told and left out."""
        n = len(self.workflows) + self.workflow_submits_failed
        shape = WORKFLOW_SHAPES[n % len(WORKFLOW_SHAPES)]
        low, high = self.profile.task_seconds

        def effect() -> TaskTemplate:
            return workflow_step("diag.effect", {"seconds": round(self.rng.uniform(low, high) / 2,
                                                            2)})
        if shape == "chain":
            flow = chain(effect(), effect(), effect())
        elif shape == "fan-out":
            flow = chord(group([effect() for _ in range(20)]), then=effect())
        else:
            flow = chain(workflow_step("chaos.spawner", {"children": 5, "seconds": 0.1}), effect())
        key = f"chaos-{uuid.uuid4().hex[:12]}"
        for attempt in range(3):
            try:
                ref = client.submit_workflow(flow, key=key)
                break
            except ClientError as exc:
                self.say(f"workflow {key} ({shape}) not submitted (try {attempt + 1}): {exc}")
                time.sleep(1.0)
        else:
            self.workflow_submits_failed += 1
            return
        self.workflows[key] = (shape, ref.members)
        for task_id, planned in zip(ref.members, plan(flow), strict=True):
            self.tasks[task_id] = planned.template.type

    def _submit_tasks(self, count: int, client: Client) -> None:
        self.submit_workflow(client)
        low, high = self.profile.task_seconds
        for _ in range(count):
            roll = self.rng.random()
            seconds = round(self.rng.uniform(low, high), 2)
            payload: dict[str, Any]
            if roll < 0.35:
                kind, payload = "diag.effect", {"seconds": seconds}
            elif roll < 0.53:
                kind, payload = "diag.append", {"seconds": seconds, "path": str(self.appends)}
            elif roll < 0.7:
                kind, payload = "diag.sleep", {"seconds": seconds}
            elif roll < 0.79:
                kind, payload = "diag.conflict", {"conflicts": self.rng.randint(1, 2)}
            elif roll < 0.86:
                kind, payload = "diag.fail", {"message": "chaos: failing by design"}
            elif roll < 0.95:  # a long job: checkpoints every 5 of 20 steps
                kind, payload = "chaos.steps", {"record": str(self.steps), "steps": 20,
                                                "every": 5, "seconds": round(seconds / 8, 3)}
            elif roll < 0.975:  # a hang fault: its first attempt ignores its timeout
                kind, payload = "chaos.hang", {}
            else:  # a crash fault: its first attempt segfaults
                kind, payload = "chaos.crash", {}
            extra: dict[str, Any] = {}
            if kind in ("diag.effect", "diag.append", "diag.sleep"):  # they end: no key blocks
                shape = self.rng.random()
                if shape < 0.15:
                    extra["ordering_key"] = f"key-{self.rng.randrange(KEYS)}"
                elif shape < 0.3:
                    extra["resources"] = self.rng.sample(RESOURCES, 2)
                elif shape < 0.45:
                    extra["run_at"] = codec.now() + timedelta(seconds=self.rng.uniform(0.5, 4))
            priority = self.rng.randint(0, 2)
            if not extra and self.rng.random() < 0.5:
                try:
                    view = client.submit(kind, payload, priority=priority)
                except ClientError as exc:
                    self.say(f"submit of a {kind} task failed: {exc}")
                    self.unanswered_submits += 1
                    continue
                self.tasks[view.id] = kind
                self.through_api[view.id] = view.status
                continue
            task = self.store.tasks.create(kind, payload, priority=priority, **extra)
            self.tasks[task.id] = kind

    def publish_messages(self, count: int) -> None:
        """Send ``count`` user-declared ``chaos.record`` commands through the client, as a
        user would (a third of them sent twice with the same id, back to back: a retry after
        a lost confirm); a command counts as confirmed once every send of it returned."""
        with Client(self.rabbit.url, CLUSTER, timeout=5.0, sender="chaos") as client:
            for _ in range(count):
                message_id = uuid.uuid4()
                copies = 2 if self.rng.random() < 1 / 3 else 1
                try:
                    for _ in range(copies):
                        client.command(COMMAND, {"hold": 0.05}, id=message_id)
                    self.confirmed.add(str(message_id))
                except ClientError as exc:
                    self.say(f"send of {message_id} not confirmed: {exc}")

    def start_schedule(self) -> None:
        spec = ScheduleSpec.model_validate({"every": 1.0, "type": "diag.sleep",
                                            "payload": {"seconds": 0.05}})
        self.store.schedules.add(SCHEDULE, spec.model_dump())

    def stop_schedule(self) -> None:
        """Pause the schedule as an operator does (its fires made ahead that have not started
        are stopped: :func:`paused_fire`), then take the tasks it made into the run's tasks,
        so the drain waits for them too."""
        schedules.pause(self.store, SCHEDULE)
        for task_id, _key in schedule_tasks(self.store):
            self.tasks[task_id] = "diag.sleep"

    def burst(self, fault: str, reader: Session) -> None:
        """A fault injected while the profile's ``burst`` short tasks are submitted with
        ``Client.submit_many`` (pages of 500) and claimed in batches."""
        def submit() -> None:
            items = [{"type": "diag.sleep", "payload": {"seconds": round(
                self.rng.uniform(0.0, 0.1), 3)}} for _ in range(self.profile.burst)]
            try:
                with Client(self.rabbit.url, CLUSTER, timeout=30.0, sender="chaos") as client:
                    ids = client.submit_many(items)
            except ClientError as exc:
                ids = getattr(exc, "done", [])
                self.say(f"burst: submit_many stopped after {len(ids)}: {exc}")
                self.unanswered_submits += len(items) - len(ids)
            self.burst_tasks += ids
            for task_id in ids:
                self.tasks[task_id] = "diag.sleep"

        self.burst_fault = fault
        victim = (self.master_index(reader) if fault == "kill_master"
                  else self.rng.randrange(len(self.nodes)))
        member = self.nodes[victim].member
        began, before = time.time(), set(self.tasks)
        sender = threading.Thread(target=submit)
        sender.start()
        # the fault lands on claims in hand: once the victim runs tasks of the burst
        running = wait_until(lambda: self.burst_running_on(member, began, before) >= 2, 15,
                             0.05)
        self.burst_running = self.burst_running_on(member, began, before)
        self.say(f"burst: {self.profile.burst} tasks with submit_many, {fault} during it, "
                 f"{self.burst_running} of them running on node{victim} ({member})"
                 + ("" if running else " (no more came in 15 s)"))
        self.inject(fault, reader, victim)
        sender.join(120)

    def burst_running_on(self, member: str, since: float, before: set[str]) -> int:
        """Attempts of the burst's tasks (the plain ``diag.sleep`` tasks that started since
        ``since``, not among the tasks submitted ``before``) running on ``member`` now."""
        return sum(1 for a in self.store.attempts.running()
                   if a.executor == member and a.task_id not in before
                   and a.started_at.timestamp() >= since
                   and (task := self.store.tasks.get(a.task_id)).type == "diag.sleep"
                   and task.unique_key is None)

    def ending_burst(self) -> float:
        """:data:`ENDING` ``diag.append`` tasks (of the highest priority) whose handlers all
        end at one moment, a few seconds from now; that moment."""
        until = time.time() + 3.0
        for _ in range(ENDING):
            task = self.store.tasks.create("diag.append", {"until": until,
                                                           "path": str(self.appends)},
                                           priority=3)
            self.tasks[task.id] = "diag.append"
        return until

    # -- faults -----------------------------------------------------------------------------
    def _disrupt(self, member: str, fault: str, began: float, hold: float,
                 start: Callable[[], object], end: Callable[[], object]) -> None:
        """``start()``, ``hold`` seconds, ``end()``; the member counts as disrupted from
        ``began`` to a second after the end."""
        start()
        time.sleep(hold)
        end()
        self.disrupted.append((member, fault, began, time.time() + 1.0))

    def inject(self, fault: str, reader: Session, victim: int | None = None) -> None:
        hold = self.profile.session * 2.5
        if victim is None:
            victim = self.rng.randrange(len(self.nodes))
            if fault == "kill_master":
                victim = self.master_index(reader)
        node = self.nodes[victim]
        self.injected[fault] += 1
        began = time.time()
        if fault in ("kill_node", "kill_master"):
            self.say(f"{fault}: kill -9 node{victim} ({node.member})")
            node.process.kill()
            self.disrupted.append((node.member, fault, began, float("inf")))
            time.sleep(self.profile.session * 1.5)
            self.restart(victim)
        elif fault == "sigstop":
            self.say(f"sigstop: node{victim} ({node.member}) for {hold:.1f}s")
            self._disrupt(node.member, fault, began, hold, node.process.pause,
                          node.process.resume)
        elif fault == "partition" and self.network is not None:
            host = self.node_hosts[victim]
            self.say(f"partition: node{victim} ({node.member}) on {host.address}: its link "
                     f"down for {hold:.1f}s")
            self._disrupt(node.member, fault, began, hold, host.cut, host.heal)
        elif fault == "partition":
            self.say(f"partition: node{victim} ({node.member}) silent for {hold:.1f}s")
            self._disrupt(node.member, fault, began, hold,
                          lambda: [proxy.blackhole() for proxy in node.proxies],
                          lambda: [proxy.heal() for proxy in node.proxies])
        elif fault == "one_way_cut":
            host = self.node_hosts[victim]
            self.say(f"one_way_cut: node{victim} ({node.member}) on {host.address} hears "
                     f"everything and sends nothing for {hold:.1f}s")
            self._disrupt(node.member, fault, began, hold, host.cut_outgoing,
                          host.heal_outgoing)
        elif fault == "degrade":
            host = self.node_hosts[victim]
            assert self.network is not None
            if not self.network.netem_available():
                self.say("degrade: no tc netem on this kernel (sch_netem): latency and loss "
                         "left out")
                self.injected[fault] -= 1
                self.skipped.append("degrade: no tc netem on this kernel (sch_netem)")
                return
            self.say(f"degrade: node{victim} ({node.member}): 150 ms latency, 5% loss for "
                     f"{hold:.1f}s")
            self._disrupt(node.member, fault, began, hold,
                          lambda: host.degrade(delay_ms=150, loss_percent=5.0), host.restore)
        elif fault in ("zk_leader", "zk_leader_ending"):
            if fault == "zk_leader_ending":
                until = self.ending_burst()
                time.sleep(max(0.0, until - time.time() - 0.01))
                running = len(self.store.attempts.running())
                self.say(f"{fault}: {running} attempts running, a burst of handlers ends now")
            dead = kill_ensemble_leader(self.zk)
            self.say(f"{fault}: killed {dead.name}; a new leader serves")
            time.sleep(self.profile.session)
            dead.start()
            dead.wait_ready()
            self.say(f"{fault}: {dead.name} back")
        elif fault == "broker_restart":
            self.say("broker_restart: RabbitMQ stop_app")
            self.rabbit.stop_app()
            time.sleep(2.0)
            self.rabbit.start_app()
            self.say("broker_restart: RabbitMQ start_app done")
        elif fault == "session_expiry":
            self.say(f"session_expiry: node{victim} ({node.member})")
            expire(self.zk.hosts, node.session_file)
            self.disrupted.append((node.member, fault, began, time.time() + 1.0))
        elif fault == "graph_cut":
            self.say(f"graph_cut: node{victim} ({node.member}) cannot reach the graph for "
                     f"{hold:.1f}s")
            if self.network is not None:  # its packets to the graph host dropped
                assert self.graph_host is not None
                self.node_hosts[victim].cut_outgoing(to=[self.graph_host])
                time.sleep(hold)
                self.node_hosts[victim].heal_outgoing()
            else:
                assert node.graph_proxy is not None
                node.graph_proxy.blackhole()
                time.sleep(hold)
                node.graph_proxy.heal()
            self.disrupted.append((node.member, fault, began, time.time() + 1.0))
        elif fault == "graph_restart":
            assert self.graph_server is not None
            self.say("graph_restart: the graph server stopped (its data written)")
            self.graph_server.stop()
            time.sleep(1.0)
            self.graph_server.start()
            self.store.graph.read(lambda g: g.inject(1).to_list())  # this side reconnects
            self.say("graph_restart: the graph server is back (its data read back)")
            for other in self.nodes:  # a ctx.check() meanwhile cannot confirm ownership
                self.disrupted.append((other.member, fault, began, time.time() + 1.0))
        time.sleep(self.profile.session * 0.5)


def expire(hosts: str, session_file: Path) -> None:
    """Close a node's session from a second client attached to it: the server expires it."""
    session_hex, password_hex = session_file.read_text().split()
    intruder = KazooClient(hosts=hosts, client_id=(int(session_hex, 16),
                                                   bytes.fromhex(password_hex)), timeout=10)
    try:
        intruder.start(timeout=10)
    finally:
        intruder.stop()
        intruder.close()


T0 = time.monotonic()


def paused_fire(task: Task) -> bool:
    """A fire of the run's schedule that its pause stopped before it started."""
    return task.stop_reason == f"schedule {SCHEDULE} paused" and task.attempts == 0


def drained(run: Run, reader: Session) -> bool:
    if run.store.attempts.running():
        return False
    for task_id, kind in run.tasks.items():
        task = run.store.tasks.get(task_id)
        if kind == "diag.fail":
            if task.active:
                return False
        elif not (task.finished or paused_fire(task)):
            return False
    client = reader.client
    return all(client.exists(f"{EFFECTS}/{m}") is not None for m in run.confirmed)


def schedule_tasks(store: Store) -> list[tuple[str, str]]:
    """(task id, uniqueness key) of every task the run's schedule made."""
    prefix = f"schedule:{SCHEDULE}:"
    rows = store.graph.read(lambda g: g.V().has_label("task").has("task_unique")
                            .value_map("task_id", "task_unique").to_list())
    return [(row["task_id"][0], row["task_unique"][0]) for row in rows
            if row["task_unique"][0].startswith(prefix)]


def fires(run: Run) -> dict[str, int]:
    """The schedule's fires with a task, fires with more than one, and fires missed between
    the first and the last one made."""
    keys = Counter(key for _, key in schedule_tasks(run.store))
    prefix = f"schedule:{SCHEDULE}:"
    times = sorted(codec.decode_time(key[len(prefix):]) for key in keys)
    missed = 0
    for before, after in itertools.pairwise(times):
        missed += max(0, round((after - before).total_seconds()) - 1)
    return {"schedule_fires": len(keys),
            "schedule_fires_twice": sum(1 for n in keys.values() if n > 1),
            "schedule_fires_missed": missed}


def workflow_figures(run: Run) -> dict[str, Any]:
    """The workflows' guarantees: a member that succeeded twice (a task succeeds once: a
    release written twice would show here), a join that did, a member that started before
    every member it depends on had succeeded, a workflow with a member not finished once the
    run drained (one waits for ever)."""
    store = run.store
    twice = joins = early = stuck = 0
    members = 0
    for key, (shape, ids) in run.workflows.items():
        everyone = list(ids)
        for task_id in ids:
            if run.tasks.get(task_id) == "chaos.spawner":
                everyone += [c.id for c in store.workflows.children(task_id)]
        members += len(everyone)
        ends: dict[str, datetime] = {}
        succeeded: dict[str, int] = {}
        for task_id in everyone:
            attempts = store.attempts.for_task(task_id)
            done = [a for a in attempts if a.status is AttemptStatus.SUCCEEDED]
            succeeded[task_id] = len(done)
            if done and done[0].ended_at is not None:
                ends[task_id] = done[0].ended_at
            if len(done) > 1:
                twice += 1
                joins += shape == "fan-out" and task_id == ids[-1]
                run.say(f"workflow {key}: member {task_id} succeeded {len(done)} times")
        deps = store.workflows.depends_on(everyone)
        for task_id, on in deps.items():
            attempts = store.attempts.for_task(task_id)
            first = min((a.started_at for a in attempts), default=None)
            if first is not None and any(d not in ends or ends[d] > first for d in on):
                early += 1
                run.say(f"workflow {key}: member {task_id} started at {first.isoformat()} "
                        f"before one of {on} had succeeded")
        left = [t for t in everyone if not store.tasks.get(t).finished]
        if left:
            stuck += 1
            run.say(f"workflow {key} ({shape}) stuck: {len(left)} members not finished: "
                    + "; ".join(f"{t} {store.tasks.get(t).stored_state().value} pending "
                                f"{store.tasks.get(t).pending}" for t in left[:5]))
    return {"workflows": len(run.workflows), "workflow_members": members,
            "workflow_submits_failed": run.workflow_submits_failed,
            "workflow_members_succeeded_twice": twice, "joins_twice": joins,
            "workflow_members_started_early": early, "workflows_stuck": stuck}


def figures(run: Run, reader: Session) -> dict[str, Any]:
    store = run.store
    for _, ids in list(run.workflows.values()):  # spawned children count like any task
        for task_id in ids:
            if run.tasks.get(task_id) == "chaos.spawner":
                run.tasks.update((c.id, c.type) for c in store.workflows.children(task_id))
    lost = without_success = overlapping = interrupted = hung = 0
    attempts_total = 0
    status: dict[str, AttemptStatus] = {}
    needless = []
    for task_id, kind in run.tasks.items():
        task = store.tasks.get(task_id)
        attempts = store.attempts.for_task(task_id)
        attempts_total += len(attempts)
        status.update((a.id, a.status) for a in attempts)
        needless += [a for a in attempts if a.status is AttemptStatus.CANCELLED_BY_SYSTEM
                     and not disrupted_while(run, a)]
        statuses = [a.status for a in attempts]
        if (task.active or task.finished or AttemptStatus.FAILED not in statuses) \
                if kind == "diag.fail" else not (task.finished or paused_fire(task)):
            lost += 1
            run.say(f"task lost: {task_id} ({kind}) {task.status.value}, active {task.active}, "
                    f"finished {task.finished}, owner {task.owner}, run_at {task.run_at}, key "
                    f"{task.ordering_key}, resources {list(task.resources)}, version "
                    f"{task.version}, fence {task.fence}; attempts: "
                    + "; ".join(f"{a.seq} {a.status.value} on {a.executor} [{a.started_at}, "
                                f"{a.ended_at}] {a.error or ''}" for a in attempts))
        if task.finished and AttemptStatus.SUCCEEDED not in statuses:
            without_success += 1
        ordered = sorted(attempts, key=lambda a: a.started_at)
        for before, after in itertools.pairwise(ordered):
            if before.ended_at is None or before.ended_at > after.started_at:
                overlapping += 1
        for a in attempts:
            own = (kind == "diag.fail" and a.status is AttemptStatus.FAILED
                   and "failing by design" in (a.error or "")) or (
                kind == "diag.conflict" and a.status is AttemptStatus.FAILED
                and (a.error or "").startswith("commit conflict")) or (
                kind == "chaos.hang" and a.status is AttemptStatus.TIMED_OUT) or (
                kind == "chaos.crash" and a.status is AttemptStatus.FAILED
                and "killed by signal 11" in (a.error or ""))
            hung += a.status is AttemptStatus.RUNNING
            if a.status in (AttemptStatus.RUNNING, AttemptStatus.CANCELLED) or (
                    a.status in (AttemptStatus.FAILED, AttemptStatus.TIMED_OUT) and not own):
                interrupted += 1
                run.say(f"interrupted, not cancelled by the system: task {task_id} ({kind}) "
                        f"attempt {a.seq} on {a.executor} {a.status.value} "
                        f"[{a.started_at.isoformat()}, "
                        f"{a.ended_at.isoformat() if a.ended_at else '-'}]: {a.error}")
    for a in needless:
        run.say(f"needless rerun: task {a.task_id} attempt {a.seq} on {a.executor} "
                f"[{a.started_at.isoformat()}, {a.ended_at.isoformat() if a.ended_at else '-'}]"
                f": {a.error}")
    unfenced = unfenced_figures(run, status)
    made_twice = created_twice(run)
    records = effects(store)
    per_task = Counter(r.task_id for r in records)
    closed = sum(1 for r in records
                 if store.attempts.get(r.attempt_id).status is not AttemptStatus.SUCCEEDED)
    client = reader.client
    runs: dict[str, int] = defaultdict(int)
    seen: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for child in client.get_children(RUNS):
        data, _ = client.get(f"{RUNS}/{child}")
        record = json.loads(data.decode())
        seen[child.rsplit("-", 1)[0]].append(record)
        if "end" in record:
            runs[child.rsplit("-", 1)[0]] += 1
    for message, n in runs.items():
        if n > 1:
            run.say(f"chaos.record {message} handled {n} times: {seen[message]}")
    unanswered = [m for m in run.confirmed if client.exists(f"{EFFECTS}/{m}") is None]
    for message in unanswered:
        run.say(f"chaos.record {message} confirmed, no effect; its runs: {seen.get(message)}; "
                f"{message_state(client, message)}")
    messages_lost = len(unanswered)
    locks = client.get_children("/locks/tasks") if client.exists("/locks/tasks") else []
    for task_id in locks:
        run.say(f"lock left: {left_lock(run, reader, task_id)}")
    holds = left_holds(reader)
    for name, owner in holds.items():
        run.say(f"hold left: {name}, by {owner} (live members {sorted(read_members(reader))})")
    early, ordering, resources = semantics(run)
    shapes: Counter[str] = Counter()
    for task_id in run.tasks:
        task = store.tasks.get(task_id)
        shapes["delayed"] += task.run_at is not None
        shapes["ordered"] += task.ordering_key is not None
        shapes["resource_locked"] += bool(task.resources)
        shapes["schedule_fires_stopped_by_the_pause"] += paused_fire(task)
        shapes["submitted_through_the_client"] += task_id in run.through_api
        shapes["running_when_the_submit_answered"] += run.through_api.get(task_id) == "RUNNING"
        kind = run.tasks[task_id]
        if kind in ("chaos.steps", "chaos.hang", "chaos.crash"):
            shapes[kind] += 1
            statuses = {a.status for a in store.attempts.for_task(task_id)}
            shapes["hang_faults_timed_out"] += (kind == "chaos.hang"
                                                and AttemptStatus.TIMED_OUT in statuses)
            shapes["crash_faults_failed"] += (kind == "chaos.crash"
                                              and AttemptStatus.FAILED in statuses)
    return {
        "tasks": len(run.tasks), "attempts": attempts_total, "task_shapes": dict(shapes),
        "master_messages_confirmed": len(run.confirmed),
        "faults": dict(run.injected), "node_restarts": run.restarts,
        "tasks_lost": lost, "finished_without_succeeded_attempt": without_success,
        "effects_applied_twice": sum(1 for n in per_task.values() if n > 1),
        "effects_from_a_closed_attempt": closed, **unfenced,
        "tasks_created_twice": made_twice,
        "needless_reruns": len(needless), "overlapping_owners": overlapping,
        "interrupted_attempts_not_cancelled_by_system": interrupted,
        "confirmed_master_messages_lost": messages_lost,
        "master_messages_handled_twice": sum(1 for n in runs.values() if n > 1),
        "lock_znodes_left": len(locks), "holds_left": len(holds),
        "started_before_run_at": early, "ordering_violations": ordering,
        "resource_holders_overlapping": resources, **fires(run), "burst": burst_figures(run),
        "hung_attempts_left": hung, **checkpoint_figures(run), **workflow_figures(run),
    }


def checkpoint_figures(run: Run) -> dict[str, Any]:
    """``chaos.steps``'s record read back: a step that ran again in a later attempt although
    an earlier attempt had committed a checkpoint past it (``work_redone_before_checkpoint``:
    must be 0), and the steps that ran again past the last committed checkpoint (expected:
    the work between a checkpoint and a fault; reported)."""
    attempts: dict[str, dict[str, int]] = {}  # attempt id -> its task's attempts' seq
    seq: dict[str, int] = {}
    for task_id, kind in run.tasks.items():
        if kind == "chaos.steps":
            attempts[task_id] = {a.id: a.seq for a in run.store.attempts.for_task(task_id)}
            seq.update(attempts[task_id])
    ran: dict[str, list[tuple[int, int]]] = defaultdict(list)  # task -> (seq, step)
    committed: dict[str, list[tuple[int, int]]] = defaultdict(list)  # task -> (seq, next)
    if run.steps.exists():
        for line in run.steps.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a kill -9 mid-write
                continue
            if record["attempt"] not in seq:
                continue
            n = seq[record["attempt"]]
            if "step" in record:
                ran[record["task"]].append((n, record["step"]))
            else:
                committed[record["task"]].append((n, record["committed"]))
    before = after = 0
    for task_id, steps in ran.items():
        done_by: dict[int, set[int]] = defaultdict(set)  # step -> the attempts that ran it
        for n, step in steps:
            done_by[step].add(n)
        for step, runs in done_by.items():
            later = sorted(runs)[1:]  # the attempts that ran it again
            for n in later:
                if any(m < n and upto > step for m, upto in committed[task_id]):
                    before += 1
                    run.say(f"work redone before its checkpoint: task {task_id} step {step} "
                            f"in attempt {n}; checkpoints {committed[task_id]}")
                else:
                    after += 1
    return {"work_redone_before_checkpoint": before, "work_redone_after_checkpoint": after,
            "checkpointed_tasks": len(attempts)}


def left_holds(reader: Session) -> dict[str, str]:
    """The exclusive holds (resources, ordering keys) left under ``slots/held`` once
    everything ended, each with its owner; the releases under way are given a few seconds."""
    def read() -> dict[str, str]:
        groups = reader.client.get_children(HELD) if reader.client.exists(HELD) else []
        return {f"{group}/{name}": owner for group in groups
                for name, owner in exclusive_holders(reader, group).items()}
    wait_until(lambda: not read(), 10, 0.2)
    return read()


def left_lock(run: Run, reader: Session, task_id: str) -> str:
    """What a lock parent left once everything ended holds, for the log: each child with its
    owner, whether that owner is a live member, its session and age; the task's state and
    attempts."""
    client = reader.client
    members = set(read_members(reader))
    parts = []
    try:
        children = client.get_children(f"/locks/tasks/{task_id}")
    except NoNodeError:  # pruned since it was listed
        return f"{task_id}: pruned while the figures were read"
    for child in children:
        try:
            data, stat = client.get(f"/locks/tasks/{task_id}/{child}")
        except NoNodeError:
            continue
        owner = data.decode()
        parts.append(f"{child} owner {owner} ({'live' if owner in members else 'not a member'}"
                     f", session 0x{stat.ephemeralOwner:x}, "
                     f"{time.time() - stat.ctime / 1000:.1f}s old, czxid {stat.czxid})")
    try:
        task = run.store.tasks.get(task_id)
        state = (f"{task.status.value}, owner {task.owner}, fence {task.fence}; attempts "
                 + "; ".join(f"{a.seq} {a.status.value} on {a.executor} fence {a.fence} "
                             f"[{a.started_at}, {a.ended_at}]"
                             for a in run.store.attempts.for_task(task_id)))
    except Exception as exc:  # not a task of the store
        state = f"no task: {exc!r}"
    return f"{task_id}: {', '.join(parts) or 'no child'}; task {state}"


def burst_figures(run: Run) -> dict[str, Any]:
    """The burst's claim batches, read from the store: the tasks of one batch were claimed in
    one ZooKeeper transaction, so their first attempts carry one token; the sizes of all of
    them, and of those a fault hit (one of its attempts CANCELLED_BY_SYSTEM)."""
    batches: dict[int, list[Attempt]] = defaultdict(list)
    for task_id in run.burst_tasks:
        attempts = run.store.attempts.for_task(task_id)
        for a in attempts:
            batches[a.fence].append(a)
    sizes = Counter(len(v) for v in batches.values())
    hit = Counter(len(v) for v in batches.values()
                  if any(a.status is AttemptStatus.CANCELLED_BY_SYSTEM for a in v))
    return {"tasks": len(run.burst_tasks), "fault": run.burst_fault,
            "running_on_the_victim_when_it_hit": run.burst_running,
            "claim_batches_by_size": dict(sorted(sizes.items())),
            "batches_a_fault_hit_by_size": dict(sorted(hit.items()))}


def disrupted_while(run: Run, attempt: Attempt) -> bool:
    """Whether a fault hit ``attempt``'s owner while the attempt ran (see ``needless_reruns``)."""
    start = attempt.started_at.timestamp()
    end = attempt.ended_at.timestamp() if attempt.ended_at else float("inf")
    return any(member == attempt.executor and begin <= end and start <= until
               for member, _, begin, until in run.disrupted)


#: seconds after its line was written within which a kill -9 of a ``diag.append``'s owner
#: counts as landing in the group commit's window (the line is its handler's last step; the
#: window itself is 1-10 ms on this box under load, far below this)
KILL_WINDOW = 1.0


def in_stated_window(run: Run, line: AppendRecord) -> tuple[str, float, float] | None:
    """The fault of the line's owner that landed in a window docs/reliability.md states, if
    any: (fault, from, to).

    * A SIGSTOP that began after its ``ctx.check()`` returned and before the line was written
      (an unfenced effect lands after the check).
    * A kill -9 at most :data:`KILL_WINDOW` seconds after the line was written: the line is
      the handler's last step, and a worker's end waits for its group's write, so an owner
      killed in between leaves its attempt RUNNING, the master closes it and the task runs
      again ("A worker is free when its handler returns; its end waits for its group",
      "At-least-once handlers")."""
    for member, fault, begin, until in run.disrupted:
        if member != line.member:
            continue
        if fault == "sigstop" and line.checked <= begin \
                and (line.at - line.checked < 0.05 or line.at >= begin):
            return fault, begin, until
        if fault in ("kill_node", "kill_master") and line.at <= begin <= line.at + KILL_WINDOW:
            return fault, begin, begin
    return None


def message_state(client: KazooClient, message: str) -> str:
    """What ZooKeeper holds of a MASTER message: its processed record and its claim (for the
    log of a confirmed message left without its effect)."""
    found = []
    for what, path in (("processed record", f"{PROCESSED}/{message}"),
                       ("claim", f"{HANDLING}/{message}")):
        try:
            data, stat = client.get(path)
            found.append(f"{what} {data.decode(errors='replace')} (owner session "
                         f"{stat.ephemeralOwner:#x})")
        except NoNodeError:
            found.append(f"no {what}")
    return ", ".join(found)


def created_twice(run: Run) -> int:
    """Tasks of the run's types in the store that no submit of the run answered with, past
    those its unanswered submits may have written (a submit handled twice, each handling
    writing a task of its own: the user's work done twice)."""
    kinds = sorted(set(run.tasks.values()))
    stored = run.store.graph.read(
        lambda g: g.V().has("task_type", P.within(kinds)).values("task_id").to_list())
    unknown = [task_id for task_id in stored if task_id not in run.tasks]
    for task_id in unknown:
        task = run.store.tasks.get(task_id)
        run.say(f"task not submitted by the run: {task_id} ({task.type}) {task.payload}, "
                f"attempts: " + "; ".join(f"{a.seq} {a.status.value} on {a.executor}"
                                          for a in run.store.attempts.for_task(task_id)))
    return max(0, len(unknown) - run.unanswered_submits)


def unfenced_figures(run: Run, status: dict[str, AttemptStatus]) -> dict[str, Any]:
    """``diag.append``'s lines: written twice for a task, written by an attempt that did not
    succeed, and those of either kind that the stated window explains (listed with timings)."""
    lines = appended(run.appends)
    window: list[dict[str, Any]] = []
    counted = []
    for line in lines:
        if line.attempt_id not in status:  # of a task not among the run's: made twice
            status[line.attempt_id] = run.store.attempts.get(line.attempt_id).status
        pause = in_stated_window(run, line) \
            if status.get(line.attempt_id) is not AttemptStatus.SUCCEEDED else None
        if pause is None:
            counted.append(line)
            continue
        window.append({"task": line.task_id, "attempt": line.attempt_id, "fault": pause[0],
                       "checked": round(line.checked, 3), "paused_from": round(pause[1], 3),
                       "paused_to": round(pause[2], 3), "written": round(line.at, 3)})
    per_task = Counter(line.task_id for line in counted)
    closed = [line for line in counted
              if status.get(line.attempt_id) is not AttemptStatus.SUCCEEDED]
    for line in closed:
        run.say(f"unfenced effect from a closed attempt: task {line.task_id} attempt "
                f"{line.attempt_id} ({status.get(line.attempt_id)}) by {line.member}, "
                f"checked {line.checked:.3f}, written {line.at:.3f}")
    return {"unfenced_effects": len(lines),
            "unfenced_effects_twice": sum(1 for n in per_task.values() if n > 1),
            "unfenced_effects_from_a_closed_attempt": len(closed),
            "unfenced_effects_in_the_stated_window": window}


def semantics(run: Run) -> tuple[int, int, int]:
    """Scheduled, ordered and resource-locked tasks:

    * attempts that started before their task's ``run_at``;
    * per ordering key, an attempt of a later-submitted task that started before an attempt
      of an earlier one ended (out of order or overlapping);
    * per resource, two SUCCEEDED attempts of different tasks that overlap (an attempt whose
      holder was frozen or cut off lost its lease with its session, and its fence with the
      reaper: it cannot succeed, so only attempts that did their work count)."""
    store = run.store
    early = ordering = overlapping = 0
    keyed: dict[str, list[tuple[Any, list[Any]]]] = defaultdict(list)
    held: dict[str, list[Any]] = defaultdict(list)
    for task_id, kind in run.tasks.items():
        task = store.tasks.get(task_id)
        attempts = store.attempts.for_task(task_id)
        # a retry policy moves run_at to each retry's time: only the last attempt is bound by
        # the run_at the task shows (the chaos.hang and chaos.crash tasks)
        bound = attempts[-1:] if kind in RETRIED else attempts
        if task.run_at is not None:
            for a in bound:
                if a.started_at < task.run_at:
                    early += 1
                    run.say(f"started before its run_at: task {task_id} ({kind}) attempt "
                            f"{a.seq} at {a.started_at.isoformat()}, run_at "
                            f"{task.run_at.isoformat()}")
        if task.ordering_key is not None:
            keyed[task.ordering_key].append((task, attempts))
        for resource in task.resources:
            held[resource].extend(a for a in attempts if a.status is AttemptStatus.SUCCEEDED)
    for tasks in keyed.values():
        tasks.sort(key=lambda ta: (ta[0].created_at, ta[0].id))
        for (_, before), (_, after) in itertools.pairwise(tasks):
            ends = [a.ended_at for a in before]
            last_end = max(ends) if ends and None not in ends else None
            if after and (last_end is None or min(a.started_at for a in after) < last_end):
                ordering += 1
    for resource, attempts in held.items():
        attempts.sort(key=lambda a: a.started_at)
        for a, b in itertools.pairwise(attempts):
            if a.ended_at is None or a.ended_at > b.started_at:
                overlapping += 1
                run.say(f"resource {resource} held twice: " + " and ".join(
                    f"task {x.task_id} attempt {x.seq} by {x.executor} "
                    f"[{x.started_at.isoformat()}, "
                    f"{x.ended_at.isoformat() if x.ended_at else '-'}]" for x in (a, b)))
    return early, ordering, overlapping


def chaos(profile_name: str, seed: int, keep: Path | None,
          graph: str = "embedded", hosts: bool = False) -> dict[str, Any]:
    """One run; ``graph``: ``embedded`` (the nodes share a gremlite file) or ``server`` (they
    share a Gremlin Server, each through a link of its own, and :data:`GRAPH_FAULTS` join).
    ``hosts``: every node and server on a host of its own (:mod:`coord.testing.hosts`), the
    nodes on the server graph, the network's faults (:data:`HOST_FAULTS`) joining;
    :class:`HostsUnavailable` when this machine cannot make hosts."""
    profile = PROFILES[profile_name]
    rng = random.Random(seed)
    workdir = Path(tempfile.mkdtemp(prefix="latchwork-chaos-"))
    network = HostNetwork().start() if hosts else None
    node_hosts: list[Host] = []
    graph_host = None
    if network is not None:
        graph = "server"
        zk_hosts = [network.add(f"zk{i}") for i in (1, 2, 3)]
        broker, graph_host = network.add("broker"), network.add("graph")
        node_hosts = [network.add(f"node{i}") for i in range(3)]
        zk = ZooKeeperCluster(workdir / "zk", tick_time=500,
                              hosts_of=[(h.address, h.netns) for h in zk_hosts])
        rabbit = RabbitMQServer(workdir / "rabbitmq", 5672, 25672, 4369, host=broker.address,
                                netns=broker.netns)
        server: GremlinServer | None = GremlinServer(
            workdir / "gremlin-server", 8182, host=graph_host.address, netns=graph_host.netns)
    else:
        zk = ZooKeeperCluster(workdir / "zk", 3, 500)
        rabbit = RabbitMQServer.on_free_ports(workdir / "rabbitmq")
        server = GremlinServer(workdir / "gremlin-server") if graph == "server" else None
    started = time.monotonic()
    run: Run | None = None
    try:
        zk.start()
    except BaseException:
        if network is not None:
            network.close()
        raise
    try:
        rabbit.start()
        if server is not None:
            server.start()
        rabbit.wait_ready()
        store_at = (open_store(server.url, atomicity=SERIAL) if server is not None
                    else open_store(str(workdir / "graph.db")))
        with store_at as store, Session(zk.hosts, CLUSTER, timeout=10.0) as reader:
            reader.client.ensure_path(RUNS)
            reader.client.ensure_path(EFFECTS)
            run = Run(profile, rng, workdir, zk, rabbit, store, graph_server=server,
                      network=network, node_hosts=node_hosts, graph_host=graph_host)
            topology = Topology(CLUSTER)
            declare_topology(Connector(rabbit.url), topology)
            for i in range(3):
                run.start_node(i)
            where = (f"hosts {[h.address for h in node_hosts]}" if network is not None
                     else "loopback")
            run.say(f"3 nodes up: {[n.member for n in run.nodes]} (graph: {graph}, {where})")
            run.start_schedule()
            faults = (list(FAULTS) + (list(GRAPH_FAULTS) if server is not None else [])
                      + (list(HOST_FAULTS) if network is not None else []))
            rng.shuffle(faults)
            per_round = profile.tasks // (len(faults) + 1)
            per_round_messages = profile.messages // (len(faults) + 1)
            run.submit_tasks(per_round)
            run.publish_messages(per_round_messages)
            for fault in faults:
                run.submit_tasks(per_round)
                worker = threading.Thread(target=run.publish_messages,
                                          args=(per_round_messages,))
                worker.start()
                run.inject(fault, reader)
                worker.join()
            run.burst(rng.choice(BURST_FAULTS), reader)
            run.submit_tasks(profile.tasks - (len(run.tasks) - len(run.burst_tasks)))
            run.publish_messages(profile.messages - len(run.confirmed))
            run.stop_schedule()
            last_fault = time.monotonic()
            run.say(f"faults done; draining {len(run.tasks)} tasks, {len(run.confirmed)} "
                    f"messages")
            ok = wait_until(lambda: drained(run, reader), profile.drain, 0.25)
            drain = time.monotonic() - last_fault
            run.say(f"drained={ok} in {drain:.1f}s")
            # no lock is held once every task ended; the master prunes parents left by
            # sessions that expired, in its full passes (every FULL_REAP_INTERVAL, or when a
            # member left): allow it three (one, 10 s, was too short on a loaded machine)
            wait_until(lambda: not reader.client.exists("/locks/tasks")
                       or reader.client.get_children("/locks/tasks") == [],
                       3 * FULL_REAP_INTERVAL, 0.25)
            result = figures(run, reader)
            if not ok:  # what the broker holds, for the log (a message nobody consumes, ...)
                for what in (["list_queues", "name", "messages_ready",
                              "messages_unacknowledged", "consumers"],
                             ["list_channels", "connection", "consumer_count",
                              "messages_unacknowledged"],
                             ["list_consumers", "queue_name", "channel_pid", "consumer_tag",
                              "active", "activity_status"],
                             ["list_connections", "pid", "peer_host", "peer_port", "state",
                              "timeout"]):
                    try:
                        run.say(f"rabbitmqctl {what[0]}:\n" + rabbit.ctl(*what, timeout=30))
                    except Exception as exc:
                        run.say(f"rabbitmqctl {what[0]} failed: {exc}")
            result.update({"profile": profile_name, "seed": seed, "graph": graph,
                           "hosts": network is not None, "faults_left_out": run.skipped,
                           "drained": ok,
                           "time_to_drain_s": round(drain, 1),
                           "total_s": round(time.monotonic() - started, 1)})
            for i, node in enumerate(run.nodes):
                try:
                    code: int | None = node.process.terminate(
                        timeout=30, on_timeout=lambda pid, i=i: run.say(
                            f"node{i} still running 30 s after SIGTERM; its threads:\n"
                            + thread_stacks(pid)))
                except FaultInjectionFailed:
                    code = None
                    run.say(f"node{i}'s last log lines:\n{node.process.stderr_tail(60)}")
                if code != 0:
                    result.setdefault("nodes_not_stopping_cleanly", []).append(f"node{i}")
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                for path in workdir.glob("node*.log"):
                    shutil.copy(path, keep / path.name)
                for path in [rabbit.log_path, *rabbit.log_path.parent.glob("rabbit*.log"),
                             *(s.log_path for s in zk.servers),
                             *([server.log] if server is not None else [])]:
                    if path.exists():
                        shutil.copy(path, keep / f"{path.parent.name}-{path.name}")
                (keep / "chaos.log").write_text("\n".join(run.log) + "\n")
            return result
    finally:
        for node in run.nodes if run is not None else []:
            node.process.close()
            for proxy in [*node.proxies, *([node.graph_proxy] if node.graph_proxy else [])]:
                proxy.close()
        if server is not None:
            server.kill()
        rabbit.stop()
        zk.stop()
        if network is not None:
            network.close()
        shutil.rmtree(workdir, ignore_errors=True)


def thread_stacks(pid: int) -> str:
    """Every thread's stack of the process ``pid`` (py-spy, which the dev setup installs), or
    why not."""
    spy = Path(sys.executable).with_name("py-spy")
    try:
        return subprocess.run([str(spy), "dump", "--pid", str(pid)], capture_output=True,
                              text=True, timeout=30, check=False).stdout or "(py-spy: nothing)"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(no stacks: {exc})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="full")
    parser.add_argument("--seed", type=int, default=20261122)
    parser.add_argument("--keep", type=Path, default=None,
                        help="copy the node logs and the fault log here")
    parser.add_argument("--graph", choices=("embedded", "server"), default="embedded",
                        help="the graph the nodes share: the embedded gremlite file, or a "
                        "Gremlin Server (with two more faults: a node's link to it cut, the "
                        "server restarted)")
    parser.add_argument("--hosts", action="store_true",
                        help="every node and server on a host of its own (network namespaces "
                        "on a bridge; root), the nodes on the server graph, the network's own "
                        "faults: a link cut, a one-way cut, latency and loss")
    args = parser.parse_args(argv)
    # SIGTERM ends the run as Ctrl-C does: every server and node it started is stopped on the
    # way out (the default action left its ZooKeeper ensemble and broker running)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.hosts:
        reason = hosts_unavailable_reason()
        if reason is not None:
            print(f"chaos: {reason}", file=sys.stderr)
            return 0
    result = chaos(args.profile, args.seed, args.keep, args.graph, args.hosts)
    broken = [k for k in ZERO if result[k]] + ([] if result["drained"] else ["drained"])
    broken += ["nodes_not_stopping_cleanly"] if result.get("nodes_not_stopping_cleanly") else []
    result["ok"] = not broken
    print(json.dumps(result, indent=2, sort_keys=True))
    if broken:
        print(f"chaos: broken guarantees: {', '.join(broken)}", file=sys.stderr)
    return 0 if not broken else 1


if __name__ == "__main__":
    sys.exit(main())
