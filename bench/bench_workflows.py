"""Workflows at scale (issue 72, item 8), on 3 node processes (4 workers each) sharing the
embedded graph, one run on this box:

1. **plain**: ``MEMBERS`` ``bench.flow_step`` tasks submitted with ``Client.submit_many``, run
   by the nodes: tasks/s from the first start to the last end, and the nodes' CPU per task;
   the baseline of this run;
2. **fan-out**: one workflow of ``MEMBERS`` ``bench.flow_step`` members and a join
   (``chord(group(...), then=bench.flow_join)``) submitted in one ``submit_workflow`` call:
   the call's time (every page written waiting, the commit, the roots activated), members/s and
   the nodes' CPU per member against the plain round's, all of it (the submit's pages, edges
   and activation included) and from the submit's answer on: both rounds' tasks are due
   ``LEAD`` seconds after their submit, so that CPU is the claims', the ends' and the
   releases' alone (target: a member's claim within 1.25x a plain task's), and the join's
   start after the last member's end (target: within 1 s);
3. **spawner**: a workflow of one ``bench.flow_spawner`` that spawns ``CHILDREN`` children,
   then a join after it: how long the spawning took, the children's drain, and the join's start
   after the last child's end.

Usage: ``python bench/bench_workflows.py [--members N] [--children N]``. Prints one JSON table;
the ratios are of this run only (the box's speed moves 2-3x between hours).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._servers import rabbitmq, start_nodes, zookeeper
from coord.testing import terminate_all
from runner.client import Client
from runner.tasks import chain, chord, group, step

ROOT = Path(__file__).resolve().parent.parent
MEMBERS = 10_000
#: seconds the plain tasks and the fan-out's members are due after their submit: the submit is
#: over before the first of them starts, so the nodes' CPU from its answer on is the claims',
#: the ends' and the releases' alone, on both sides
LEAD = 20.0
CHILDREN = 1_000


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of ``pids`` so far (their /proc stat), in seconds."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / ticks


def marks(directory: Path, name: str) -> list[list[float]]:
    found = []
    for path in directory.glob(f"{name}-*"):
        found += [[float(x) for x in line.split()] for line in path.read_text().splitlines()]
    for path in directory.glob(f"{name}-*"):
        path.unlink()
    return found


def wait_for(count: int, directory: Path, name: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = sum(len(p.read_text().splitlines()) for p in directory.glob(f"{name}-*"))
        if seen >= count:
            return
        time.sleep(0.2)
    raise RuntimeError(f"only some of {count} {name} marks after {timeout}s")


def run(members: int, children: int) -> dict[str, Any]:
    with zookeeper() as zk, rabbitmq() as mq, \
            tempfile.TemporaryDirectory(prefix="latchwork-bench-flows-") as tmp:
        scratch = Path(tmp)
        dots = scratch / "marks"
        dots.mkdir()
        env = {**os.environ, "LATCHWORK_ZK_HOSTS": zk.hosts, "LATCHWORK_AMQP_URL": mq.url,
               "LATCHWORK_GRAPH": str(scratch / "graph.db"), "LATCHWORK_CLUSTER": "bench-flows",
               "LATCHWORK_WORKERS": "4", "LATCHWORK_SCAN_INTERVAL": "1.0",
               "LATCHWORK_TASKS": '["bench.flows"]', "LATCHWORK_BENCH_MARKS": str(dots),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                           os.environ.get("PYTHONPATH")]))}
        procs = start_nodes(env, 3)
        pids = [p.pid for p in procs]
        out: dict[str, Any] = {"members": members, "children": children, "nodes": 3,
                               "graph": "embedded"}
        try:
            with Client(mq.url, "bench-flows", timeout=120, sender="bench") as client:
                # 1. plain tasks: the baseline
                cpu = cpu_seconds(pids)
                client.submit_many([{"type": "bench.flow_step", "payload": {}, "delay": LEAD}
                                    for _ in range(members)])
                submitted = cpu_seconds(pids)
                wait_for(members, dots, "step", 900)
                plain_cpu = cpu_seconds(pids) - cpu
                plain_drain = cpu_seconds(pids) - submitted
                steps = marks(dots, "step")
                plain_wall = max(e for _, e in steps) - min(b for b, _ in steps)
                out["plain"] = {"tasks_per_s": round(members / plain_wall, 1),
                                "node_cpu_ms_per_task": round(1000 * plain_cpu / members, 3),
                                "node_cpu_ms_per_task_after_submit":
                                    round(1000 * plain_drain / members, 3)}

                # 2. a fan-out of MEMBERS and one join, in one call
                cpu = cpu_seconds(pids)
                sent = time.monotonic()
                flow = chord(group([step("bench.flow_step", {"i": i}, delay=LEAD)
                                    for i in range(members)]),
                             then=step("bench.flow_join", {}))
                ref = client.submit_workflow(flow, key="bench-fan-out")
                submit_s = time.monotonic() - sent
                submitted = cpu_seconds(pids)
                client.result(ref.members[-1], wait=1800)
                fan_cpu = cpu_seconds(pids) - cpu
                fan_drain = cpu_seconds(pids) - submitted
                steps = marks(dots, "step")
                (join_at,) = [m[0] for m in marks(dots, "join")]
                last_end = max(e for _, e in steps)
                fan_wall = last_end - min(b for b, _ in steps)
                out["fan_out"] = {
                    "submit_s": round(submit_s, 2),
                    "members_per_s": round(members / fan_wall, 1),
                    "node_cpu_ms_per_member": round(1000 * fan_cpu / members, 3),
                    "node_cpu_ms_per_member_after_submit": round(1000 * fan_drain / members, 3),
                    "join_start_after_last_member_s": round(join_at - last_end, 3)}

                # 3. a spawner of CHILDREN children, then a step after it
                spawned = client.submit_workflow(
                    chain(step("bench.flow_spawner", {"children": children}),
                          step("bench.flow_join", {})), key="bench-spawner")
                client.result(spawned.members[-1], wait=1800)
                steps = marks(dots, "step")
                (spawn,) = marks(dots, "spawn")
                (after_at,) = [m[0] for m in marks(dots, "join")]
                last_child = max(e for _, e in steps)
                out["spawner"] = {
                    "spawn_s": round(spawn[1] - spawn[0], 2),
                    "children_per_s_spawned": round(children / (spawn[1] - spawn[0]), 1),
                    "children_drained_s": round(last_child - min(b for b, _ in steps), 2),
                    "after_start_after_last_child_s": round(after_at - last_child, 3)}
        finally:
            terminate_all(procs)
        ratio = out["fan_out"]["node_cpu_ms_per_member"] / out["plain"]["node_cpu_ms_per_task"]
        drain = (out["fan_out"]["node_cpu_ms_per_member_after_submit"]
                 / out["plain"]["node_cpu_ms_per_task_after_submit"])
        out["targets"] = {
            "member_cost_over_plain": round(ratio, 3),
            "member_claim_and_end_over_plain_after_submit": round(drain, 3),
            "member_claim_and_end_within_1_25": drain <= 1.25,
            "join_within_1s": out["fan_out"]["join_start_after_last_member_s"] <= 1.0,
            "spawner_dependant_within_1s": out["spawner"]["after_start_after_last_child_s"]
            <= 1.0}
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=MEMBERS)
    parser.add_argument("--children", type=int, default=CHILDREN)
    args = parser.parse_args()
    print(json.dumps(run(args.members, args.children), indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
