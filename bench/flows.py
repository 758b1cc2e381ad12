"""The workflow bench's task types, loaded by its nodes through the ``tasks`` setting
(bench/bench_workflows.py).

``bench.flow_step`` appends ``began ended`` to a file of its node process in
``LATCHWORK_BENCH_MARKS`` (``step-<pid>``); ``bench.flow_join`` appends when it began to
``join-<pid>``; ``bench.flow_spawner`` spawns ``children`` ``bench.flow_step`` children
(``ctx.spawn``, keyed c0, c1, ...) and appends how long that took to ``spawn-<pid>``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from runner.tasks import TaskContext, task


def _line(name: str, text: str) -> None:
    path = os.path.join(os.environ["LATCHWORK_BENCH_MARKS"], f"{name}-{os.getpid()}")
    with open(path, "a") as out:
        out.write(text + "\n")


@task("bench.flow_step", description="record when it began and ended")
def flow_step(ctx: TaskContext, payload: dict[str, Any]) -> None:
    began = time.time()
    _line("step", f"{began} {time.time()}")


@task("bench.flow_join", description="record when it began")
def flow_join(ctx: TaskContext, payload: dict[str, Any]) -> int:
    _line("join", f"{time.time()}")
    return len(payload)


@task("bench.flow_spawner", description="spawn children, record how long it took")
def flow_spawner(ctx: TaskContext, payload: dict[str, Any]) -> int:
    began = time.time()
    for i in range(int(payload["children"])):
        ctx.spawn("bench.flow_step", {}, key=f"c{i}")
    _line("spawn", f"{began} {time.time()}")
    return int(payload["children"])
