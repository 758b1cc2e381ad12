"""What process isolation costs (issue 44): CPU per task of an isolated ``sleep 0`` against a
threaded one in the same run, 60 one-second isolated tasks against the ideal, and how long a
hung isolated handler holds its worker.

Starts ZooKeeper, RabbitMQ and 3 nodes of 4 workers on an embedded graph (``--graph server``:
on a Gremlin Server of its own, where the store's work leaves the nodes: the node CPU the
difference is read from is then a fifth as big, and so is its noise), with a module of
three bench types loaded by ``--tasks`` (as a user's would be): ``bench.thread`` and
``bench.process`` (the same handler, ``ctx.cancel.wait(seconds)``, in a thread of the node or
in a child process) and ``bench.hang`` (isolated, ``timeout=1``, ``grace=1``, a handler that
ignores its token). Then:

* rounds of ``--tasks`` (default 2,000) ``seconds=0`` tasks sent with ``submit_many``, threaded,
  isolated and two raw probes side by side (``--sets`` sets, default 6, one round of each kind
  a set, the order turning): the drain's rate and the CPU per task of the node processes and
  every descendant (the fork server and its children included, and shown apart); each kind's
  medians, and the median over the sets of each set's own difference per task (target:
  isolated at most 0.5 ms more). The raw probes are threaded handlers that send one byte to a
  helper process (one per worker) and read it back: ``bench.echo`` to ``cat``, the floor of a
  process round trip per task on these cores; ``bench.pyecho`` to a bare Python read-write
  loop, the floor of a round trip through a second interpreter (whose run between two steps of
  the node's own takes the node's code out of the cores' caches, as any handler process's
  does). ``isolated - the Python probe`` is what the isolation's own work adds;
* 60 isolated one-second tasks at once (after one wave of them, so that no node claims ahead as
  it does after short handlers), and 60 threaded ones the same way: the wall time against the
  ideal (60 / 12 workers x 1 s; target within 1.05x);
* one hung isolated handler: its attempt's start to its end written TIMED_OUT, against
  timeout + grace + 1 s (the worker is free again when its end is written).

Usage: ``python bench/bench_isolation.py [--tasks 2000]`` (``--tasks 0``: no CPU rounds).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _profile
from bench._servers import rabbitmq, start_nodes, zookeeper
from coord.testing import terminate_all
from runner.client import Client
from runner.store import AttemptStatus, Store, open_store
from runner.store.server.graph import SERIAL
from runner.testing.gremlinserver import GremlinServer

MODULE = textwrap.dedent('''
    import os
    import subprocess
    import sys
    import threading
    import time
    from pydantic import BaseModel
    from runner.tasks import TaskContext, task

    class Sleep(BaseModel):
        seconds: float = 0.0

    def sleep(ctx: TaskContext, p: Sleep) -> None:
        if p.seconds:
            ctx.cancel.wait(p.seconds)

    @task("bench.thread", payload=Sleep)
    def threaded(ctx: TaskContext, p: Sleep) -> None:
        sleep(ctx, p)

    @task("bench.process", payload=Sleep, isolation="process")
    def isolated(ctx: TaskContext, p: Sleep) -> None:
        sleep(ctx, p)

    _helper = threading.local()
    _PY_ECHO = ("import os\\nwhile True:\\n    b = os.read(0, 64)\\n    if not b:\\n"
                "        break\\n    os.write(1, b)\\n")

    def _round_trip(name: str, argv: list[str]) -> None:
        """One byte to this worker's helper process ``name`` and back."""
        helper = getattr(_helper, name, None)
        if helper is None:
            helper = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      bufsize=0)
            setattr(_helper, name, helper)
        os.write(helper.stdin.fileno(), b"x")
        os.read(helper.stdout.fileno(), 64)

    @task("bench.echo", payload=Sleep)
    def echo(ctx: TaskContext, p: Sleep) -> None:
        """The raw probe: one byte to a helper process (`cat`, one per worker) and back, in a
        thread: a process round trip per task and nothing else."""
        _round_trip("cat", ["cat"])

    @task("bench.pyecho", payload=Sleep)
    def pyecho(ctx: TaskContext, p: Sleep) -> None:
        """The raw probe with a Python helper (a bare read-write loop, one per worker): a
        round trip through a second interpreter, whose run between two steps of the node's
        own also takes the node's code out of the cores' caches, as any handler process's
        does."""
        _round_trip("py", [sys.executable, "-c", _PY_ECHO])

    @task("bench.hang", payload=Sleep, isolation="process", timeout=1.0, grace=1.0)
    def hang(ctx: TaskContext, p: Sleep) -> None:
        while True:  # ignores its token
            time.sleep(0.5)
''')


#: sets of rounds (threaded, isolated, the two raw probes) the CPU figure is the median over
SETS = 6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=2000, help="tasks a round (0: no CPU "
                        "rounds)")
    parser.add_argument("--sets", type=int, default=SETS,
                        help="sets of rounds, one of each kind (threaded, isolated, the two "
                        "raw probes)")
    parser.add_argument("--graph", choices=("embedded", "server"), default="embedded",
                        help="the graph the nodes share: on a Gremlin Server the store's work "
                        "leaves the nodes, and the node CPU the difference is read from "
                        "is a fifth of the embedded graph's")
    args = parser.parse_args()
    measure(args.tasks, args.sets, args.graph)


def measure(tasks: int, sets: int = SETS, graph_kind: str = "embedded") -> None:
    """The whole bench (see the module), on servers and nodes of its own; prints its lines."""
    with contextlib.ExitStack() as stack:
        zk = stack.enter_context(zookeeper())
        mq = stack.enter_context(rabbitmq())
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        (scratch / "benchjobs.py").write_text(MODULE)
        graph = str(scratch / "graph.db")
        if graph_kind == "server":
            server = GremlinServer(scratch / "gremlin-server", heap="2g")
            server.start()
            stack.callback(server.kill)
            graph = server.url
        print(f"(graph: {graph_kind})")
        env = {**os.environ, "LATCHWORK_ZK_HOSTS": zk.hosts, "LATCHWORK_AMQP_URL": mq.url,
               "LATCHWORK_GRAPH": graph, "LATCHWORK_CLUSTER": "isolation",
               **({"LATCHWORK_GRAPH_SERIAL_SERVER": "true"} if graph_kind == "server" else {}),
               "LATCHWORK_WORKERS": "4", "LATCHWORK_TASKS": json.dumps(["benchjobs"]),
               "PYTHONPATH": os.pathsep.join(filter(None, [
                   str(scratch), str(Path(__file__).resolve().parent.parent),
                   os.environ.get("PYTHONPATH")]))}
        procs = start_nodes(env, logs=scratch)
        try:
            client = Client(mq.url, "isolation", timeout=60)
            store = (open_store(graph, atomicity=SERIAL) if graph_kind == "server"
                     else open_store(graph))
            bench(client, store, [p.pid for p in procs], tasks, sets, scratch)
        finally:
            terminate_all(procs)


def bench(client: Client, store: Store, pids: list[int], tasks: int,
          sets: int, logs: Path) -> None:
    drain(client, store, pids, "bench.process", 200)  # the children started, the server warm
    drain(client, store, pids, "bench.thread", 200)
    drain(client, store, pids, "bench.echo", 200)  # each worker's helpers started
    drain(client, store, pids, "bench.pyecho", 200)
    if tasks:
        cpu_rounds(client, store, pids, tasks, sets)
    slow_and_hung(client, store, logs)


def cpu_rounds(client: Client, store: Store, pids: list[int], tasks: int,
               sets: int = SETS) -> None:
    """Threaded, isolated and the two raw probes' drains side by side: ``sets`` sets, each of
    the kinds once, the order turning from one set to the next (ABCD, BCDA, ..., then
    reversed), so that neither the graph's growth nor the box's drift favours a kind. The
    figure is the median over the sets of each set's own difference (isolated minus threaded,
    a probe minus threaded): the box's speed moves 10-20% within minutes (one run saw the
    threaded rounds cost 11.5 then 12.5 ms a task), which would swamp a 0.5 ms difference
    taken between medians of rounds minutes apart."""
    kinds = ("bench.thread", "bench.process", "bench.echo", "bench.pyecho")
    rounds: dict[str, list[tuple[float, float, float]]] = {kind: [] for kind in kinds}
    for i in range(sets):
        order = kinds[i % len(kinds):] + kinds[:i % len(kinds)]
        for kind in (order if (i // len(kinds)) % 2 == 0 else order[::-1]):
            rounds[kind].append(drain(client, store, pids, kind, tasks))
    for kind in kinds:
        rate, cpu, kids = (statistics.median(r[i] for r in rounds[kind]) for i in range(3))
        print(f"{kind}: {tasks} sleep-0 tasks, median of {sets}: {rate:.0f} tasks/s, CPU "
              f"per task (nodes and their children) {cpu:.3f} ms, of which their child "
              f"processes {kids:.3f} ms; rounds " + ", ".join(f"{r:.0f}/s {c:.3f} ms"
                                                            for r, c, _ in rounds[kind]))

    def paired(kind: str) -> tuple[float, str]:
        diffs = [b[1] - a[1] for a, b in zip(rounds["bench.thread"], rounds[kind], strict=True)]
        return statistics.median(diffs), ", ".join(f"{d:+.3f}" for d in diffs)

    extra, extras = paired("bench.process")
    floor, floors = paired("bench.echo")
    pyfloor, pyfloors = paired("bench.pyecho")
    print(f"isolated - threaded CPU per task, median of the {sets} sets' own differences: "
          f"{extra:+.3f} ms (target <= +0.5 ms); each: {extras}")
    print(f"raw probes - threaded: a round trip to `cat` per task (bench.echo) {floor:+.3f} ms "
          f"(each: {floors}); to a bare Python loop (bench.pyecho) {pyfloor:+.3f} ms (each: "
          f"{pyfloors}); isolated - the Python probe: {extra - pyfloor:+.3f} ms (what the "
          "isolation adds over a round trip through a second interpreter)")


def slow_and_hung(client: Client, store: Store, logs: Path) -> None:
    """60 one-second tasks of each kind against the ideal, and how many each node ran (one
    that ran none has its log's last lines printed); one hung isolated handler."""

    for kind in ("bench.thread", "bench.process"):
        # one wave of one-second tasks first: a node that has just run short handlers claims
        # ahead (three times its workers: RunningSet), so the kind measured right after the
        # CPU rounds had 48 of its 60 tasks claimed at once and its span counted from those
        # claims (1.01-1.03x), and the other one ran in waves, a claim between each (1.05-
        # 1.07x), whichever it was; both are now measured in waves, as long jobs run
        ids = client.submit_many([{"type": kind, "payload": {"seconds": 1}}
                                  for _ in range(12)])
        wait_until(lambda ids=ids: all(store.tasks.get(t).finished for t in ids), 120)
        # due 2 s from now, so every node sees them at once; the span from the first start to
        # the last end, as bench/bench_runner.py measures its slow phase
        ids = client.submit_many([{"type": kind, "payload": {"seconds": 1}, "delay": 2.0}
                                  for _ in range(60)])
        wait_until(lambda ids=ids: all(store.tasks.get(t).finished for t in ids[-5:])
                   and all(store.tasks.get(t).finished for t in ids), 120)
        attempts = [a for t in ids for a in store.attempts.for_task(t)]
        span = (max(a.ended_at.timestamp() for a in attempts if a.ended_at is not None)
                - min(a.started_at.timestamp() for a in attempts))
        ran = collections.Counter(a.executor for a in attempts)
        print(f"60 one-second {kind} tasks on 3 x 4 workers: {span:.2f} s from the first "
              f"start to the last end, ideal 5 s: {span / 5:.3f}x (target for bench.process "
              f"<= 1.05); tasks per node: {', '.join(str(n) for n in sorted(ran.values()))}")
        if len(ran) < 3:
            for log in sorted(logs.glob("node-*.log")):
                print(f"-- the last lines of {log.name}:\n"
                      + "\n".join(log.read_text(errors="replace").splitlines()[-15:]))

    (hung,) = client.submit_many([{"type": "bench.hang"}])
    wait_until(lambda: any(a.ended_at is not None for a in store.attempts.for_task(hung)), 60)
    (attempt,) = store.attempts.for_task(hung)
    assert attempt.ended_at is not None
    held = (attempt.ended_at - attempt.started_at).total_seconds()
    print(f"hung isolated handler (timeout 1 s, grace 1 s): {attempt.status.value} after "
          f"{held:.2f} s, its worker free again (target <= timeout + grace + 1 = 3 s)")
    assert attempt.status is AttemptStatus.TIMED_OUT


def drain(client: Client, store: Store, pids: list[int], kind: str,
          count: int) -> tuple[float, float, float]:
    """``count`` tasks of ``kind`` submitted at once and drained: tasks/s, CPU ms per task of
    the nodes and their descendants, and of the descendants alone (handler processes)."""
    before = closed(store)
    cpu = sum(_profile.cpu_seconds(pid) for pid in pids)
    own = sum(_profile.cpu_seconds(pid, descendants=False) for pid in pids)
    began = time.monotonic()
    client.submit_many([{"type": kind} for _ in range(count)])
    wait_until(lambda: closed(store) >= before + count, 600)
    took = time.monotonic() - began
    used = sum(_profile.cpu_seconds(pid) for pid in pids) - cpu
    nodes = sum(_profile.cpu_seconds(pid, descendants=False) for pid in pids) - own
    return count / took, 1000 * used / count, 1000 * (used - nodes) / count


def closed(store: Store) -> int:
    """Tasks finished or stopped (one count of an index lookup: cheap for the nodes)."""
    return int(store.graph.read(lambda g: g.V().has("task_queue", "closed").count().next()))


def wait_until(done: Callable[[], bool], timeout: float) -> None:
    end = time.monotonic() + timeout
    while not done():
        if time.monotonic() > end:
            raise TimeoutError("the bench's tasks did not end in time")
        time.sleep(0.05)


if __name__ == "__main__":
    main()
