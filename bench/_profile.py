"""Where a task's time goes, read from outside the processes (bench/bench_runner.py):

* CPU seconds of a process and its descendants (``/proc/<pid>/stat``, utime + stime);
* ZooKeeper requests the server received (``mntr``: ``zk_packets_received``; pings included);
* a node's graph store calls and time, and the broker messages it consumed (its ``/metrics``).

A :class:`Snapshot` is taken before and after a measured stretch; :func:`per_task` divides the
differences by the tasks run in it.
"""

from __future__ import annotations

import os
import urllib.request
from dataclasses import dataclass, field

from coord.testing.zookeeper import zk_four_letter

TICKS = os.sysconf("SC_CLK_TCK")


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tree.setdefault(int(fields[1]), []).append(int(name))
    return tree


def cpu_seconds(pid: int, descendants: bool = True) -> float:
    """CPU seconds used so far by ``pid`` and (``descendants``) every descendant of it: the
    live ones, and those that ended and were waited for (their parent's cutime and cstime: a
    handler process replaced after its ``max_tasks_per_child`` took its whole life's CPU out
    of a sum of the live ones alone)."""
    tree = _children() if descendants else {}
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime
        if descendants:
            total += (int(fields[13]) + int(fields[14])) / TICKS  # cutime, cstime
        todo.extend(tree.get(p, []))
    return total


def zk_packets(host: str, port: int) -> int:
    for line in zk_four_letter(port, "mntr", host).splitlines():
        if line.startswith("zk_packets_received"):
            return int(line.split()[1])
    raise RuntimeError("mntr gave no zk_packets_received")


def scrape(port: int) -> dict[str, float]:
    """The node's metrics that the profile reads: store calls and seconds by kind, messages
    consumed, attempts that succeeded (the end of a round, seen without reading the store)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {"messages": 0.0}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        if name.startswith("latchwork_store_calls_total"):
            out["store_" + ("reads" if 'kind="read"' in name else "writes")] = float(value)
        elif name.startswith("latchwork_store_seconds_total"):
            out["store_" + ("read_s" if 'kind="read"' in name else "write_s")] = float(value)
        elif name.startswith("latchwork_messages_total"):
            out["messages"] += float(value)
        elif name.startswith("latchwork_attempts_total{") and 'status="SUCCEEDED"' in name:
            out["succeeded"] = out.get("succeeded", 0.0) + float(value)
        elif name.startswith("latchwork_task_scans_total"):
            out["listings"] = float(value)
        elif name.startswith("latchwork_task_claims_total{"):
            result = name.split('result="', 1)[1].split('"', 1)[0]
            out[f"claims_{result}"] = out.get(f"claims_{result}", 0.0) + float(value)
    return out


@dataclass
class Snapshot:
    cpu: dict[str, float] = field(default_factory=dict)  # process name -> CPU seconds
    zk_packets: int = 0
    nodes: dict[str, float] = field(default_factory=dict)  # summed over the nodes' metrics


def snapshot(processes: dict[str, list[int]], zk: tuple[str, int],
             metrics_ports: list[int]) -> Snapshot:
    """``processes``: a name (``nodes``, ``zookeeper``, ``rabbitmq``, ``bench``) and its pids
    (the bench's own CPU without its children: every server and node is one of them)."""
    snap = Snapshot(zk_packets=zk_packets(*zk))
    for name, pids in processes.items():
        snap.cpu[name] = sum(cpu_seconds(p, descendants=name != "bench") for p in pids)
    for port in metrics_ports:
        for key, value in scrape(port).items():
            snap.nodes[key] = snap.nodes.get(key, 0.0) + value
    return snap


def per_task(before: Snapshot, after: Snapshot, tasks: int) -> dict[str, float]:
    """Per task: ZooKeeper requests, store reads and writes and their ms, broker messages
    consumed, the nodes' claims that did not start their task (``claims_lock_busy``: its lock
    held elsewhere; ``claims_stale``: the task moved on since it was listed, its claim
    refused by the store), the listings of ready tasks (each a page of up to 64), and the CPU
    ms of each process group."""
    out = {"zk_requests": (after.zk_packets - before.zk_packets) / tasks}
    for key in ("store_reads", "store_writes", "messages", "claims_lock_busy", "claims_stale",
                "listings"):
        out[key] = (after.nodes.get(key, 0.0) - before.nodes.get(key, 0.0)) / tasks
    for key in ("store_read_s", "store_write_s"):
        out[key.replace("_s", "_ms")] = (after.nodes.get(key, 0.0)
                                         - before.nodes.get(key, 0.0)) * 1000 / tasks
    for name in after.cpu:
        out[f"cpu_ms_{name}"] = (after.cpu[name] - before.cpu.get(name, 0.0)) * 1000 / tasks
    return out
