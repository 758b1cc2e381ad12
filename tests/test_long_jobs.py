"""Long jobs on real node processes (issue 44): checkpoints a retry resumes from.

The task type lives in a module of the test's own, loaded by the nodes with ``--tasks``, as a
user's would be: a job of numbered steps that records each step it starts in a file and
commits ``{"next": n}`` every ten steps.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

from coord.testing import wait_until
from runner.store import AttemptStatus
from runner.testing.cluster import Cluster

STEPS_MODULE = textwrap.dedent('''
    from pydantic import BaseModel
    from runner.tasks import TaskContext, task

    class Steps(BaseModel):
        record: str
        steps: int = 100
        every: int = 10
        hold_at: int | None = None  # the first attempt stops here, before the step, and waits
        fail_at: int | None = None  # the first attempt raises here, before the step

    @task("test.steps", payload=Steps)
    def steps(ctx: TaskContext, p: Steps) -> None:
        start = (ctx.resume or {}).get("next", 0)
        for i in range(start, p.steps):
            ctx.cancel.raise_if_cancelled()
            if ctx.attempt.seq == 1 and i == p.hold_at:
                with open(p.record + ".held", "w") as f:
                    f.write(str(i))
                ctx.cancel.wait(600)  # killed -9 meanwhile
            if ctx.attempt.seq == 1 and i == p.fail_at:
                raise RuntimeError(f"failed at step {i}")
            with open(p.record, "a") as f:
                f.write(f"{ctx.attempt.seq} {i}\\n")
            if (i + 1) % p.every == 0:
                ctx.checkpoint({"next": i + 1})
''')


def steps_run(record: Path) -> list[tuple[int, int]]:
    """(attempt seq, step) of every step started, in order."""
    if not record.exists():
        return []
    return [(int(a), int(s)) for a, s in (line.split() for line in record.read_text().split("\n")
                                          if line)]


def with_steps_module(cluster: Cluster, tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "stepjob.py").write_text(STEPS_MODULE)
    cluster.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site),
                                                          cluster.env.get("PYTHONPATH")]))
    cluster.env["LATCHWORK_TASKS"] = json.dumps(["stepjob"])


def test_a_job_killed_at_step_57_resumes_at_its_checkpoint_on_another_node(
        cluster: Cluster, tmp_path: Path) -> None:
    """kill -9 of the node running a job of 100 steps that checkpoints every 10, at step 57:
    its next attempt, on the other node, starts at step 50. Steps 0-49 ran once, 50-56 twice,
    none is missing; ``task show`` shows the checkpoint."""
    with_steps_module(cluster, tmp_path)
    for _ in range(2):
        cluster.start_node()
    record = tmp_path / "steps.txt"
    task_id = cluster.submit("test.steps", {"record": str(record), "hold_at": 57})
    assert wait_until(lambda: Path(str(record) + ".held").exists(), 60, 0.05)
    victim = cluster.wait_running_on(task_id)
    cluster.nodes[victim].kill()
    done = cluster.wait_finished(task_id, timeout=90)

    ran = steps_run(record)
    first = [s for a, s in ran if a == 1]
    second = [s for a, s in ran if a == 2]
    assert first == list(range(57)) and second == list(range(50, 100)), ran
    counted = {s: sum(1 for _, x in ran if x == s) for s in range(100)}
    assert all(counted[s] == 1 for s in range(50)) and all(counted[s] == 2
                                                             for s in range(50, 57))
    assert all(counted[s] == 1 for s in range(57, 100))
    attempts = cluster.store.attempts.for_task(task_id)
    assert [a.status for a in attempts] == [AttemptStatus.CANCELLED_BY_SYSTEM,
                                            AttemptStatus.SUCCEEDED]
    assert attempts[1].executor != victim
    assert done.checkpoint is not None and done.checkpoint.seq == 2
    shown = cluster.cli("task", "show", task_id)
    assert shown.exit_code == 0 and "checkpoint" in shown.output
    assert "by attempt 2" in shown.output, shown.output


def test_reactivate_fresh_drops_the_checkpoint_a_failed_job_left(
        cluster: Cluster, tmp_path: Path) -> None:
    """A job that fails at step 23 (no retry policy: the task stops) keeps its checkpoint at
    20; ``task reactivate --fresh`` drops it, so the next attempt starts at step 0."""
    with_steps_module(cluster, tmp_path)
    cluster.start_node()
    record = tmp_path / "failing.txt"
    task_id = cluster.submit("test.steps", {"record": str(record), "fail_at": 23,
                                            "steps": 30})
    assert wait_until(lambda: not cluster.task(task_id).active, 60, 0.05)
    stopped = cluster.task(task_id)
    assert stopped.checkpoint is not None and stopped.checkpoint.seq == 1
    resume = cluster.store.checkpoints.read(task_id)
    assert resume is not None and resume.state == {"next": 20}
    assert "checkpoint" in cluster.cli("task", "show", task_id).output

    again = cluster.cli("task", "reactivate", task_id, "--fresh")
    assert again.exit_code == 0 and "its checkpoint dropped" in again.output, again.output
    cluster.wait_finished(task_id, timeout=60)
    ran = steps_run(record)
    assert [s for a, s in ran if a == 1] == list(range(23))
    assert [s for a, s in ran if a == 2] == list(range(30)), ran  # from the start again
