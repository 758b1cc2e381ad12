"""make demo: a three-node latchwork cluster on this machine, end to end.

1. ``latchwork dev up``: a ZooKeeper ensemble of three and RabbitMQ on 127.0.0.1;
2. three ``latchwork node start`` processes sharing an embedded graph file;
3. the master synchronises the Brick ontologies (shipped in the ``brickschema`` package);
4. a long ``diag.sleep`` task is submitted; the node running it is killed with ``kill -9``;
   the master frees its lock once its session expires and another node finishes the task;
5. the attempt reports and the cluster status are printed; everything is stopped.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from coord.testing import terminate_all

ROOT = Path(".latchwork/demo")
ZK_PORT = os.environ.get("LATCHWORK_DEMO_ZK_PORT", "22181")
AMQP_PORT = os.environ.get("LATCHWORK_DEMO_AMQP_PORT", "25673")
LATCHWORK = [sys.executable, "-m", "runner.cli"]


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def cli(*args: str, env: dict[str, str], check: bool = True) -> str:
    result = subprocess.run([*LATCHWORK, *args], env=env, capture_output=True, text=True,
                            check=False)
    if check and result.returncode != 0:
        raise SystemExit(f"latchwork {' '.join(args)} failed ({result.returncode}):\n"
                         f"{result.stdout}{result.stderr}")
    return result.stdout


def show(*args: str, env: dict[str, str]) -> None:
    subprocess.run([*LATCHWORK, *args], env={**env, "COLUMNS": "160"}, check=False)


def wait(what: str, predicate, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise SystemExit(f"demo: timed out waiting for {what}")


def main() -> int:
    dev_dir = ROOT / "servers"
    if ROOT.exists():
        subprocess.run([*LATCHWORK, "dev", "down", "--dir", str(dev_dir)], check=False,
                       capture_output=True)
        shutil.rmtree(ROOT)
    ROOT.mkdir(parents=True)
    nodes: list[subprocess.Popen[bytes]] = []
    say("latchwork dev up: ZooKeeper ensemble of 3 + RabbitMQ, bound to 127.0.0.1")
    up = subprocess.run([*LATCHWORK, "dev", "up", "--dir", str(dev_dir), "--zk-ensemble", "3",
                         "--zk-port", ZK_PORT, "--amqp-port", AMQP_PORT],
                        capture_output=True, text=True, check=False)
    if up.returncode != 0:
        raise SystemExit(up.stderr)
    env = dict(os.environ)
    for line in up.stdout.splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            env[key] = value.strip("'\"")
    try:
        ontologies = ROOT / "ontologies"
        brick = Path(importlib.util.find_spec("brickschema").submodule_search_locations[0])  # type: ignore[union-attr,index]
        ontologies.mkdir()
        shutil.copy(brick / "ontologies/1.2/Brick.ttl", ontologies / "Brick.ttl")
        for name in ("Brick-BOT-alignment.ttl", "Brick-REC-alignment.ttl"):
            shutil.copy(brick / "ontologies/1.2/alignments" / name, ontologies / name)
        env.update({"LATCHWORK_CLUSTER": "demo", "LATCHWORK_GRAPH": str(ROOT / "graph.db"),
                    "LATCHWORK_ONTOLOGY_SOURCE": str(ontologies),
                    "LATCHWORK_SESSION_TIMEOUT": "4", "LATCHWORK_SCAN_INTERVAL": "1",
                    "LATCHWORK_REAP_INTERVAL": "1"})
        say("three nodes: latchwork node start (logs in .latchwork/demo/node-N.log)")
        for i in range(3):
            with open(ROOT / f"node-{i}.log", "wb") as log:  # the child keeps its own copy
                nodes.append(subprocess.Popen([*LATCHWORK, "node", "start"], env=env,
                                              stdout=log, stderr=subprocess.STDOUT))
        wait("three members", lambda: len(json.loads(cli(
            "cluster", "status", "--json", env=env, check=False) or "{}").get(
                "members", [])) == 3, 60)
        show("cluster", "status", env=env)

        say("the master synchronises the Brick ontologies (one load task per file)")
        def loaded() -> bool:
            tasks = json.loads(cli("task", "list", "--type", "ontology.load", "--json",
                                   env=env))
            return len(tasks) == 3 and all(t["finished"] for t in tasks)
        wait("the ontology load tasks", loaded, 120)
        show("task", "list", "--type", "ontology.load", env=env)

        say("submit a 10 s task, then kill -9 the node running it")
        task_id = cli("task", "submit", "diag.sleep", "--payload", '{"seconds": 10}',
                      env=env).strip()
        print(f"task {task_id}")

        def running_on() -> str | None:
            report = json.loads(cli("task", "show", task_id, "--json", env=env))
            running = [a for a in report["attempts"] if a["status"] == "RUNNING"]
            return running[0]["executor"] if running else None
        wait("the task to start", lambda: running_on() is not None, 30)
        executor = running_on()
        assert executor is not None
        pid = int(executor.split(":")[1])
        print(f"running on {executor}; kill -9 {pid}")
        os.kill(pid, signal.SIGKILL)
        started = time.monotonic()

        def taken_over() -> bool:
            other = running_on()
            return other is not None and other != executor
        wait("another node to take the task over", taken_over, 60)
        print(f"running elsewhere after {time.monotonic() - started:.1f} s "
              f"(session timeout 4 s + scan interval 1 s)")
        wait("the task to finish", lambda: json.loads(cli(
            "task", "show", task_id, "--json", env=env))["task"]["finished"], 60)

        say("the attempt report")
        show("task", "show", task_id, env=env)
        say("a task that fails: its stack trace is in the report")
        failing = cli("task", "submit", "diag.fail", "--payload",
                      '{"message": "demo failure"}', env=env).strip()
        wait("the failing task to stop", lambda: not json.loads(cli(
            "task", "show", failing, "--json", env=env))["task"]["active"], 30)
        show("task", "show", failing, env=env)
        say("cluster status")
        show("cluster", "status", env=env)
        say("one frame of `latchwork top` (without --once it refreshes every second)")
        show("top", "--once", env=env)
    finally:
        say("stopping the nodes (SIGTERM) and the servers")
        terminate_all(nodes)
        subprocess.run([*LATCHWORK, "dev", "down", "--dir", str(dev_dir)], check=False)
    print("\ndemo finished")
    return 0


if __name__ == "__main__":
    sys.exit(main())
