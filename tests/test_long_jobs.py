"""Long jobs on real node processes (issue 44): checkpoints a retry resumes from, time limits
and heartbeats.

The task types live in modules of the test's own, loaded by the nodes with ``--tasks``, as a
user's would be: a job of numbered steps that records each step it starts in a file and
commits ``{"next": n}`` every ten steps; handlers that run past their ``timeout`` (honouring
their token, or ignoring it), and one that stops beating.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from coord.testing import wait_until
from runner.store import AttemptStatus, TaskStatus
from runner.tasks.registry import Isolation
from runner.testing.cluster import CLUSTER, Cluster

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


LIMITS_MODULE = textwrap.dedent('''
    import time
    from pydantic import BaseModel
    from runner.tasks import RetryPolicy, TaskContext, TaskTimedOut, task

    class Run(BaseModel):
        record: str
        seconds: float = 6.0

    def note(p, ctx, what):
        with open(p.record, "a") as f:
            f.write(f"{ctx.attempt.seq} {what} {time.time()}\\n")

    @task("test.forever", payload=Run, timeout=1.0, grace=1.0,
          retry=RetryPolicy(max_attempts=2, backoff=0.1, retry_on=(TaskTimedOut,)))
    def forever(ctx: TaskContext, p: Run) -> None:
        """Loops until its token is cancelled (the first attempt), then returns."""
        note(p, ctx, "start")
        while ctx.attempt.seq == 1 and not ctx.cancel.wait(0.05):
            pass
        note(p, ctx, "end")

    @task("test.stubborn", payload=Run, timeout=1.0, grace=1.0,
          retry=RetryPolicy(max_attempts=2, backoff=0.1))
    def stubborn(ctx: TaskContext, p: Run) -> None:
        """The first attempt ignores its token: it sleeps p.seconds whatever happens."""
        note(p, ctx, "start")
        if ctx.attempt.seq == 1:
            time.sleep(p.seconds)
        note(p, ctx, "end")

    @task("test.sleepy", payload=Run)
    def sleepy(ctx: TaskContext, p: Run) -> None:
        """No limit of its type: waits on its token up to p.seconds."""
        note(p, ctx, "start")
        ctx.cancel.wait(p.seconds)
        note(p, ctx, "end")

    @task("test.beats", payload=Run, heartbeat_timeout=1.0, heartbeat_persist=0.2)
    def beats(ctx: TaskContext, p: Run) -> None:
        """Beats ten times, then hangs (honouring its token)."""
        for i in range(10):
            ctx.heartbeat({"i": i})
            note(p, ctx, f"beat{i}")
            time.sleep(0.1)
        ctx.cancel.wait(60)
        note(p, ctx, "end")
''')


def with_module(cluster: Cluster, tmp_path: Path, name: str, code: str) -> None:
    cluster.load_module(tmp_path / "site", name, code)


def with_steps_module(cluster: Cluster, tmp_path: Path) -> None:
    with_module(cluster, tmp_path, "stepjob", STEPS_MODULE)


def notes(record: Path) -> list[tuple[int, str, float]]:
    """(attempt seq, what, when) of every note a limits handler wrote."""
    if not record.exists():
        return []
    return [(int(a), w, float(t)) for a, w, t in (line.split()
                                                  for line in record.read_text().splitlines())]


def lock_held(zk_client: KazooClient, task_id: str) -> bool:
    path = f"/latchwork/{CLUSTER}/locks/tasks/{task_id}"
    return bool(zk_client.exists(path) and zk_client.get_children(path))


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


def test_a_handler_past_its_timeout_ends_timed_out_and_its_retry_runs(
        cluster: Cluster, tmp_path: Path) -> None:
    """``timeout=1``: the first attempt's token is cancelled at the limit (the handler honours
    it and returns): TIMED_OUT, which the retry policy retries (``retry_on=(TaskTimedOut,)``),
    and the second attempt succeeds."""
    with_module(cluster, tmp_path, "limitjobs", LIMITS_MODULE)
    cluster.start_node()
    record = tmp_path / "forever.txt"
    with cluster.client() as client:  # its own 30 s: the type's 1 s caps it
        task_id = client.submit("test.forever", {"record": str(record)}, timeout=30).id
    done = cluster.wait_finished(task_id, timeout=60)
    first, second = cluster.store.attempts.for_task(task_id)
    assert (first.status, second.status) == (AttemptStatus.TIMED_OUT, AttemptStatus.SUCCEEDED)
    assert "timed out after 1 s" in (first.error or "") and done.finished
    ran = notes(record)
    assert 0.9 <= ran[1][2] - ran[0][2] <= 3.0, ran  # cancelled at its limit
    shown = cluster.cli("task", "show", task_id)
    assert "timed out" in shown.output

    # a type without a limit, given one at its submission
    sleepy = tmp_path / "sleepy.txt"
    submitted = cluster.cli("task", "submit", "test.sleepy", "--payload",
                            json.dumps({"record": str(sleepy), "seconds": 30}),
                            "--time-limit", "0.5")
    assert submitted.exit_code == 0, submitted.output
    own = submitted.output.strip().splitlines()[-1]
    assert wait_until(lambda: not cluster.task(own).active, 30, 0.05)
    (attempt,) = cluster.store.attempts.for_task(own)
    assert attempt.status is AttemptStatus.TIMED_OUT and cluster.task(own).timeout == 0.5
    assert "timed out after 0.5 s (its own timeout)" in (attempt.error or "")
    ran = notes(sleepy)
    assert ran[1][2] - ran[0][2] < 5, ran


def test_a_handler_that_ignores_its_timeout_is_fenced_off_and_keeps_its_lock_until_it_returns(
        cluster: Cluster, tmp_path: Path, zk_client: KazooClient) -> None:
    """A thread cannot be killed: grace seconds past its limit the attempt is written
    TIMED_OUT with the task's fence moved and the incident ``ignored_timeout`` raised, while
    the lock stays held; once the handler returns the lock goes, the incident is resolved,
    and the retry runs, never overlapping it."""
    with_module(cluster, tmp_path, "limitjobs", LIMITS_MODULE)
    cluster.start_node()
    record = tmp_path / "stubborn.txt"
    task_id = cluster.submit("test.stubborn", {"record": str(record), "seconds": 6})

    def closed() -> bool:
        attempts = cluster.store.attempts.for_task(task_id)
        return bool(attempts) and attempts[0].status is AttemptStatus.TIMED_OUT
    assert wait_until(closed, 30, 0.05)
    began = notes(record)[0][2]
    assert time.time() - began < 5.5  # written while the handler still sleeps
    (first,) = cluster.store.attempts.for_task(task_id)
    task = cluster.task(task_id)
    assert "ran on 1 s past it" in (first.error or "") and task.fence > first.fence
    assert task.status is TaskStatus.WAITING and lock_held(zk_client, task_id)
    # the watch raises the incident after the fence-off is written (its own next step)
    assert wait_until(lambda: [i for i in cluster.store.incidents.for_task(task_id)
                               if i.kind == "ignored_timeout"], 10, 0.05)
    (incident,) = [i for i in cluster.store.incidents.for_task(task_id)
                   if i.kind == "ignored_timeout"]
    assert incident.open
    done = cluster.wait_finished(task_id, timeout=60)
    ran = notes(record)
    first_end = next(t for a, w, t in ran if (a, w) == (1, "end"))
    second_start = next(t for a, w, t in ran if (a, w) == (2, "start"))
    assert first_end <= second_start, ran  # no second run overlapped the first
    assert done.finished and [a.status for a in cluster.store.attempts.for_task(task_id)] == [
        AttemptStatus.TIMED_OUT, AttemptStatus.SUCCEEDED]
    (incident,) = [i for i in cluster.store.incidents.for_task(task_id)
                   if i.kind == "ignored_timeout"]
    assert not incident.open


def test_an_attempt_that_stops_beating_is_timed_out_within_its_heartbeat_timeout(
        cluster: Cluster, tmp_path: Path) -> None:
    """``heartbeat_timeout=1``: ten beats, then none: the attempt is cancelled within
    heartbeat_timeout + 1 s of its last beat and ends TIMED_OUT "no heartbeat for ..."; the
    last details beaten are on the attempt."""
    with_module(cluster, tmp_path, "limitjobs", LIMITS_MODULE)
    cluster.start_node()
    record = tmp_path / "beats.txt"
    task_id = cluster.submit("test.beats", {"record": str(record)})
    assert wait_until(lambda: not cluster.task(task_id).active, 30, 0.05)
    (attempt,) = cluster.store.attempts.for_task(task_id)
    assert attempt.status is AttemptStatus.TIMED_OUT
    assert "no heartbeat for" in (attempt.error or ""), attempt.error
    ran = notes(record)
    last_beat = next(t for a, w, t in ran if w == "beat9")
    ended = next(t for a, w, t in ran if w == "end")
    assert 0.9 <= ended - last_beat <= 2.0, ran
    assert attempt.heartbeat is not None and attempt.heartbeat.details["i"] >= 5


def test_task_show_prints_the_checkpoint_the_last_heartbeat_and_timed_out() -> None:
    """The report as ``task show`` renders it (no server: the views of model values)."""
    from datetime import UTC, datetime, timedelta

    from rich.console import Console

    from runner.cli.console import render_task_report
    from runner.replies import AttemptView, TaskReport, TaskView
    from runner.store import Attempt, CheckpointInfo, Task
    from runner.store.model import Heartbeat

    now = datetime.now(UTC)
    task = Task("t1", "x.sync", {}, True, TaskStatus.RUNNING, False, 0, now, now, 3, 9,
                owner="h:1", attempts=2,
                checkpoint=CheckpointInfo(now - timedelta(seconds=40), 2048, 2))
    attempts = [Attempt("a1", "t1", 1, AttemptStatus.TIMED_OUT, "h:1", now, 7,
                        error="timed out after 1 s (its type's timeout)"),
                Attempt("a2", "t1", 2, AttemptStatus.RUNNING, "h:1", now, 9,
                        heartbeat=Heartbeat(now - timedelta(seconds=3), {"batch": 12}))]
    console = Console(record=True, width=200)
    report = TaskReport(task=TaskView.of(task), attempts=[AttemptView.of(a) for a in attempts])
    render_task_report(report.model_dump(mode="json"), console)
    out = console.export_text()
    assert "2.0 KiB, 40 s ago, by attempt 2" in out
    assert '3 s ago: {"batch": 12}' in out
    assert "timed out" in out and "its type's timeout" in out


ISOLATED_MODULE = textwrap.dedent('''
    import ctypes, os, time
    from pydantic import BaseModel
    from runner.tasks import TaskContext, task

    class Job(BaseModel):
        record: str
        what: str = "ok"  # ok, segfault, hog, hang, gil, sleep
        seconds: float = 0.0

    def note(p, ctx, what):
        with open(p.record, "a") as f:
            f.write(f"{ctx.attempt.seq} {what} {os.getpid()} {time.time()}\\n")

    def work(ctx, p):
        note(p, ctx, p.what)
        if p.what == "segfault":
            ctypes.string_at(0)
        elif p.what == "hog":
            blocks = []
            while True:  # touched pages: the RSS grows
                blocks.append(b"x" * (40 * 2**20))
                time.sleep(0.05)
        elif p.what == "hang":
            while True:  # ignores its token
                time.sleep(0.5)
        elif p.what == "gil":
            ctypes.PyDLL(None).sleep(int(p.seconds))  # libc sleep, the GIL held
        elif p.what == "sleep":
            ctx.cancel.wait(p.seconds)
        elif p.what == "raise":
            raise ValueError("bad row 7")
        elif p.what == "forkexit":  # a process it forked holds its channel; it exits
            if os.fork() == 0:
                time.sleep(4)
                os._exit(0)
            os._exit(3)
        elif p.what == "hang1":  # the first attempt hangs for good, ignoring everything
            while ctx.attempt.seq == 1:
                time.sleep(0.5)
        elif p.what == "complete":  # the effect built here, written by the node with the end
            ctx.complete(lambda g: g.add_v("iso_effect").property("effect_task", ctx.task.id)
                         .property("effect_pid", os.getpid()))
        elif p.what == "complete_run":  # runs its effect itself: refused in the child
            ctx.complete(lambda g: g.add_v("iso_effect").property("effect_task", ctx.task.id)
                         .iterate())
        elif p.what == "watch":  # notes when it first sees itself cancelled
            while not ctx.cancel.cancelled:
                time.sleep(0.01)
            note(p, ctx, "cancelled")
            time.sleep(p.seconds)
        else:
            ctx.progress(1, 2, "half")
            ctx.heartbeat({"at": "half"})
            ctx.checkpoint({"done": 1})
            ctx.check()
            assert ctx.resume == {"done": 1}
        note(p, ctx, "end")

    @task("iso.job", payload=Job, isolation="process", max_memory_mb=300, timeout=1.0,
          grace=1.0)
    def isolated(ctx: TaskContext, p: Job) -> None:
        work(ctx, p)

    @task("iso.thread", payload=Job)
    def threaded(ctx: TaskContext, p: Job) -> None:
        work(ctx, p)

    @task("iso.long", payload=Job, isolation="process", max_memory_mb=300)
    def long(ctx: TaskContext, p: Job) -> None:
        work(ctx, p)
''')


def children_of(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (the fork server's children: handlers)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry))
    return found


def handler_pids(record: Path) -> set[int]:
    return {int(line.split()[2]) for line in record.read_text().splitlines()} \
        if record.exists() else set()


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_isolated_crashes_end_their_attempt_failed_and_the_node_runs_on(
        cluster: Cluster, tmp_path: Path) -> None:
    """A handler process that segfaults, one that allocates past ``max_memory_mb``, one that
    ignores its ``timeout``, one that raises and one that exits while a process it forked
    holds its channel: each attempt ends with its cause (FAILED "killed by signal 11", FAILED
    "handler used ... MiB, limit 300", TIMED_OUT, FAILED with the handler's error and its
    traceback from the child, FAILED "exited with code 3" at once, not when the forked
    process lets the channel go) while the same node runs a normal
    isolated task (its context over the channel: progress, heartbeat, checkpoint, check,
    resume) and a threaded one to success; no handler process of the first three is left."""
    with_module(cluster, tmp_path, "isojobs", ISOLATED_MODULE)
    member = cluster.start_node()
    record = tmp_path / "iso.txt"
    # the hog and the segfault with no timeout to race (iso.job's 1 s once passed before a
    # handler process started on a loaded box: TIMED_OUT, not the segfault)
    ids = {what: cluster.submit("iso.long" if what in ("hog", "segfault") else "iso.job",
                                {"record": str(record), "what": what})
           for what in ("segfault", "hog", "hang")}
    ok = cluster.submit("iso.job", {"record": str(record), "what": "ok"})
    raised = cluster.submit("iso.job", {"record": str(record), "what": "raise"})
    forked = cluster.submit("iso.long", {"record": str(record), "what": "forkexit"})
    threaded = cluster.submit("iso.thread", {"record": str(record), "what": "ok"})
    for task_id in ids.values():
        assert wait_until(lambda t=task_id: not cluster.task(t).active, 60, 0.05), task_id
    cluster.wait_finished(ok, timeout=30)
    cluster.wait_finished(threaded, timeout=30)
    (segfault,) = cluster.store.attempts.for_task(ids["segfault"])
    assert segfault.status is AttemptStatus.FAILED
    assert "handler process killed by signal 11 (SIGSEGV)" in (segfault.error or "")
    (hog,) = cluster.store.attempts.for_task(ids["hog"])
    assert hog.status is AttemptStatus.FAILED and "limit 300" in (hog.error or ""), hog.error
    assert "handler used" in (hog.error or "")
    (hang,) = cluster.store.attempts.for_task(ids["hang"])
    assert hang.status is AttemptStatus.TIMED_OUT, hang.error
    assert hang.ended_at is not None and (hang.ended_at - hang.started_at).total_seconds() < 4
    assert wait_until(lambda: not cluster.task(raised).active, 30, 0.05)
    (failed,) = cluster.store.attempts.for_task(raised)  # the handler's own error, crossed
    assert failed.status is AttemptStatus.FAILED and failed.error == "ValueError: bad row 7"
    assert "in the handler process" in (failed.stack_trace or "")
    assert wait_until(lambda: not cluster.task(forked).active, 30, 0.05)
    (exited,) = cluster.store.attempts.for_task(forked)
    assert exited.status is AttemptStatus.FAILED, exited.error
    assert "handler process exited with code 3" in (exited.error or ""), exited.error
    assert exited.ended_at is not None
    assert (exited.ended_at - exited.started_at).total_seconds() < 3  # not the 4 s it held
    (good,) = cluster.store.attempts.for_task(ok)
    assert good.status is AttemptStatus.SUCCEEDED and good.progress is not None
    resumed = cluster.store.checkpoints.read(ok)
    assert resumed is not None and resumed.state == {"done": 1}
    lines = [line.split() for line in record.read_text().splitlines()]
    node_pid = cluster.nodes[member].pid
    threaded_pid = {int(f[2]) for f in lines if f[1] == "ok"} - {
        int(f[2]) for f in lines if f[1] in ("segfault", "hog", "hang")}
    assert node_pid in threaded_pid  # the threaded one ran in the node
    pids = {int(f[2]) for f in lines if f[1] in ("segfault", "hog", "hang")}
    assert node_pid not in pids and len(pids) >= 2  # the isolated ones in children
    dead = {int(line.split()[2]) for line in record.read_text().splitlines()
            if line.split()[1] in ("segfault", "hog", "hang")}
    assert wait_until(lambda: not any(alive(p) for p in dead), 10), [p for p in dead
                                                                      if alive(p)]
    with cluster.client() as client:  # the node ran on, on the same session
        assert pids and member in {m.id for m in client.cluster_status().members}


def test_ctx_complete_in_a_handler_process_writes_its_effect_with_the_success_on_the_node(
        cluster: Cluster, tmp_path: Path) -> None:
    """``ctx.complete(write)`` in a child: the effect is built there, its steps cross the
    channel and the node writes them with the attempt's success under its own guards (one
    write): the effect once, carrying the child's pid, the attempt SUCCEEDED. An effect that
    runs itself (``.iterate()``) is refused in the child with ``InvalidValue`` and nothing is
    written."""
    with_module(cluster, tmp_path, "isojobs", ISOLATED_MODULE)
    member = cluster.start_node()
    record = tmp_path / "complete.txt"
    done = cluster.submit("iso.long", {"record": str(record), "what": "complete"})
    refused = cluster.submit("iso.long", {"record": str(record), "what": "complete_run"})
    cluster.wait_finished(done, timeout=60)
    assert wait_until(lambda: not cluster.task(refused).active, 60, 0.05)

    def effects(task_id: str) -> list[int]:
        return cluster.store.graph.read(lambda g: g.V().has_label("iso_effect")
                                        .has("effect_task", task_id).values("effect_pid")
                                        .to_list())
    (pid,) = effects(done)
    assert pid != cluster.nodes[member].pid and pid in handler_pids(record)
    (attempt,) = cluster.store.attempts.for_task(done)
    assert attempt.status is AttemptStatus.SUCCEEDED
    assert effects(refused) == []
    (failed,) = cluster.store.attempts.for_task(refused)
    assert failed.status is AttemptStatus.FAILED, failed
    assert (failed.error or "").startswith("InvalidValue: ctx.complete(write)"), failed.error


def test_kill_9_of_a_node_leaves_no_handler_process_and_the_retries_run_elsewhere(
        cluster: Cluster, tmp_path: Path) -> None:
    """Two isolated handlers that would never end on their own (they ignore everything) run
    on a node killed -9 (the node's pid alone, not its process group): their processes die
    with it (the fork server exits when the node's copy of its pipe closes, and its children
    have PR_SET_PDEATHSIG), and both tasks run again on the other node, each retry starting
    after the handler it replaces was gone."""
    with_module(cluster, tmp_path, "isojobs", ISOLATED_MODULE)
    first = cluster.start_node()
    record = tmp_path / "long.txt"
    ids = [cluster.submit("iso.long", {"record": str(record), "what": "hang1"})
           for _ in range(2)]
    for task_id in ids:
        assert cluster.wait_running_on(task_id) == first
    assert wait_until(lambda: len(handler_pids(record)) == 2, 30, 0.02)
    cluster.start_node()
    children = handler_pids(record)
    os.kill(cluster.nodes[first].pid, signal.SIGKILL)
    killed = time.time()
    assert wait_until(lambda: not any(alive(p) for p in children), 5, 0.002)
    gone = time.time() - killed
    cluster.nodes[first].wait(10)
    assert gone < 0.1, gone  # 18-23 ms from the SIGKILL in 3 runs here
    for task_id in ids:
        cluster.wait_finished(task_id, timeout=60)
        attempts = cluster.store.attempts.for_task(task_id)
        assert [a.status for a in attempts] == [AttemptStatus.CANCELLED_BY_SYSTEM,
                                                AttemptStatus.SUCCEEDED]
        assert attempts[1].executor != first
    retried = [float(line.split()[3]) for line in record.read_text().splitlines()
               if line.split()[:2] == ["2", "hang1"]]
    assert len(retried) == 2 and min(retried) > killed + gone  # no overlap with the killed


def test_a_c_call_holding_the_gil_costs_an_isolated_node_nothing_and_a_threaded_one_its_session(
        cluster: Cluster, tmp_path: Path) -> None:
    """libc's sleep through ``ctypes.PyDLL`` keeps the GIL for 3 s (the session timeout is
    2 s): in a child the node's ZooKeeper pings go on and its session lives; in a thread of the
    node they cannot, and the node declares its session LOST (why isolation exists)."""
    with_module(cluster, tmp_path, "isojobs", ISOLATED_MODULE)
    member = cluster.start_node()
    record = tmp_path / "gil.txt"
    isolated = cluster.submit("iso.long", {"record": str(record), "what": "gil", "seconds": 3})
    cluster.wait_finished(isolated, timeout=60)
    (attempt,) = cluster.store.attempts.for_task(isolated)
    assert attempt.status is AttemptStatus.SUCCEEDED
    log = cluster.nodes[member].log_path.read_text(errors="replace")
    assert "declaring it LOST" not in log
    threaded = cluster.submit("iso.thread", {"record": str(record), "what": "gil",
                                             "seconds": 3})
    assert wait_until(lambda: "declaring it LOST" in cluster.nodes[member].log_path.read_text(
        errors="replace"), 30, 0.1)
    first = cluster.store.attempts.for_task(threaded)[0]
    assert wait_until(lambda: cluster.store.attempts.get(first.id).status
                      is not AttemptStatus.RUNNING, 30, 0.1)
    assert cluster.store.attempts.get(first.id).status is AttemptStatus.CANCELLED_BY_SYSTEM


def test_a_child_of_a_stopped_node_sees_itself_cancelled_once_the_session_deadline_passes(
        cluster: Cluster, tmp_path: Path) -> None:
    """SIGSTOP of the node (its threads frozen, its child not): the child reads the session's
    deadline from memory shared with the node and sees itself cancelled once it passes
    (within the 2 s session timeout of the stop, a little more for the last reply's age),
    with no round trip to the frozen node. The node is woken once ZooKeeper has expired its
    session (its member node gone; the server expires a session up to a tick after its
    timeout, and a node woken before that keeps its session, its task and its child)."""
    from coord import Session, live_member_ids

    with_module(cluster, tmp_path, "isojobs", ISOLATED_MODULE)
    member = cluster.start_node()
    record = tmp_path / "watch.txt"
    task_id = cluster.submit("iso.long", {"record": str(record), "what": "watch",
                                          "seconds": 30})
    assert wait_until(lambda: len(handler_pids(record)) == 1, 30, 0.02)
    with Session(cluster.env["LATCHWORK_ZK_HOSTS"], CLUSTER, timeout=4.0) as watcher:
        assert member in live_member_ids(watcher)
        cluster.pause(member)
        stopped = time.time()
        try:
            assert wait_until(lambda: " cancelled " in record.read_text(), 10, 0.02)
            seen = next(float(line.split()[3]) for line in record.read_text().splitlines()
                        if line.split()[1] == "cancelled")
            assert seen - stopped < 2.5, seen - stopped  # SESSION = 2 s
            assert wait_until(lambda: member not in live_member_ids(watcher), 10, 0.05)
        finally:
            cluster.nodes[member].resume()
    (child,) = handler_pids(record)
    assert wait_until(lambda: not alive(child), 30, 0.05)  # LOST: killed before its lock went
    first = cluster.store.attempts.for_task(task_id)[0]
    assert wait_until(lambda: cluster.store.attempts.get(first.id).status
                      is AttemptStatus.CANCELLED_BY_SYSTEM, 30, 0.1)


def test_a_type_whose_handler_cannot_cross_is_refused_process_isolation_when_declared() -> None:
    from runner.tasks import TaskContext, TaskRegistry, task

    with pytest.raises(ValueError, match=r"cannot give .* ctx\.services"):
        @task("bad.services", isolation="process")
        def uses_services(ctx: TaskContext, payload: dict) -> None:
            ctx.services.get(object)

        TaskRegistry().register("bad.services", uses_services,
                                isolation=uses_services.latchwork_task.isolation)
    with pytest.raises(ValueError, match=r"top of an importable module"):
        TaskRegistry().register("bad.lambda", lambda ctx, p: None,
                                isolation=Isolation())
    with pytest.raises(ValueError, match=r"isolation is 'thread' or 'process'"):
        task("bad.kind", isolation="fork")


class _Broadcasts:
    """What the ontology loader tells the cluster (UPDATE_CACHE), kept (no broker here: the
    loader's broadcast is covered against RabbitMQ in tests/test_runner.py)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict]] = []

    def broadcast(self, name: str, payload: dict) -> None:
        self.sent.append((name, payload))


def test_a_big_ontology_load_resumes_at_its_last_committed_part(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ontology.load`` of an ontology bigger than a part (here 10 classes, 25 in all) writes
    a part at a time with a checkpoint after each; a failure in the third part leaves two
    committed, and the next attempt loads the third part on, once each, then marks the
    ontology loaded (the classes and edges all there)."""
    from runner.ontology import sync as sync_module
    from runner.ontology.parse import checksum_of
    from runner.ontology.sync import LOAD_TASK, OntologySync, register_ontology_tasks
    from runner.tasks import TaskRegistry
    from runner.testing.stub import TaskStub

    monkeypatch.setattr(sync_module, "PART", 10)
    source = tmp_path / "onto"
    source.mkdir()
    lines = ["@prefix owl: <http://www.w3.org/2002/07/owl#> .",
             "@prefix rdfs: <http://www.w3.org/2000/01/rdf-schema#> .",
             "@prefix ex: <http://example.org/big#> .",
             "<http://example.org/big> a owl:Ontology .", "ex:C00 a owl:Class ."]
    lines += [f"ex:C{i:02d} a owl:Class ; rdfs:subClassOf ex:C{i - 1:02d} ."
              for i in range(1, 25)]
    (source / "big.ttl").write_text("\n".join(lines) + "\n")
    registry = TaskRegistry()
    register_ontology_tasks(registry)
    bus = _Broadcasts()
    with TaskStub(tmp_path / "stub") as stub:
        sync = OntologySync(str(source), stub.store, bus, stub.member_id)  # type: ignore[arg-type]
        stub.services.add(sync)
        parts: list[list[str]] = []
        real = stub.store.ontologies.load_part

        def counted(ontology, part, fence=None):  # type: ignore[no-untyped-def]
            if len(parts) == 2 and not hasattr(counted, "failed"):
                counted.failed = True  # type: ignore[attr-defined]
                raise OSError("the graph went away in part 3")
            parts.append([c.iri for c in part])
            return real(ontology, part, fence)
        monkeypatch.setattr(stub.store.ontologies, "load_part", counted)
        data = (source / "big.ttl").read_bytes()
        payload = {"ref": str(source / "big.ttl"), "checksum": checksum_of(data),
                   "iri": "http://example.org/big"}
        first = stub.run(registry.get(LOAD_TASK), payload)
        assert first.attempt.status is AttemptStatus.FAILED and "part 3" in (first.error or "")
        assert len(parts) == 2 and stub.store.ontologies.get("http://example.org/big") is None
        second = stub.run(registry.get(LOAD_TASK), task=first.task)
        assert second.succeeded, second.error
        assert len(parts) == 3  # the third part only: the first two were committed
        assert parts[2][0] == "http://example.org/big#C20"
        record = stub.store.ontologies.get("http://example.org/big")
        assert record is not None and record.class_count == 25
        assert len(stub.store.ontologies.classes("http://example.org/big")) == 25
        # the load answers what this attempt added (the last part); the sync's broadcast step
        # tells the cluster, once for the whole sync (issue 72): the load broadcasts nothing
        assert second.returned == {"iri": "http://example.org/big", "version": "",
                                   "classes_added": 5, "edges_added": 5}, second.returned
        assert bus.sent == []


def test_the_limit_watch_forgets_the_deadlines_of_ended_attempts() -> None:
    """Attempts of a type with an hour's timeout that end in a second leave no hour-long trail
    of deadlines: the heap is compacted once the ended ones are most of it (pure logic)."""
    from datetime import UTC, datetime

    from runner.store import Attempt, Task
    from runner.tasks.context import CancelToken
    from runner.tasks.registry import Limits, TaskType
    from runner.tasks.worker.limits import LimitWatch
    from runner.tasks.worker.running import Claimed, Slot

    now = datetime.now(UTC)
    task = Task("t", "x", {}, True, TaskStatus.RUNNING, False, 0, now, now, 1, 5)
    kind = TaskType("x", lambda ctx, p: None, limits=Limits(timeout=3600.0,
                                                           heartbeat_timeout=600.0))
    watch = LimitWatch("m", on_ignored=lambda w, why: None, persist=lambda w: None)
    try:
        for n in range(1000):
            claim = Claimed(task, Attempt(f"a{n}", "t", 1, AttemptStatus.RUNNING, "m", now), 5)
            w = watch.watch(Slot(task, None, None, CancelToken()), claim, kind)  # type: ignore[arg-type]
            assert w is not None and not watch.done(w)
        assert len(watch._heap) < 3 * 100, len(watch._heap)
    finally:
        watch.close()


def test_a_graph_out_of_reach_at_a_checkpoint_cancels_the_attempt_not_fails_the_task(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by ``make chaos`` (a graph cut under a checkpointing job stopped the task as
    FAILED): whether a checkpoint landed cannot be known then, and it is no fault of the
    handler, so the attempt ends CANCELLED_BY_SYSTEM and the task runs again from its last
    committed checkpoint."""
    from runner.errors import StoreUnavailable
    from runner.tasks import TaskContext, task
    from runner.tasks.outcomes import Outcome
    from runner.testing.stub import TaskStub

    @task("cut.steps")
    def steps(ctx: TaskContext, payload: dict) -> None:
        for n in range((ctx.resume or {}).get("next", 0), 4):
            ctx.checkpoint({"next": n + 1})

    with TaskStub(tmp_path) as stub:
        real = stub.store.checkpoints.commit
        calls: list[int] = []

        def cut(fence, seq, state):  # type: ignore[no-untyped-def]
            calls.append(state["next"])
            if state["next"] == 3 and len(calls) == 3:
                raise StoreUnavailable("the graph is out of reach")
            return real(fence, seq, state)
        monkeypatch.setattr(stub.store.checkpoints, "commit", cut)
        first = stub.run(steps)
        assert first.attempt.status is AttemptStatus.CANCELLED_BY_SYSTEM
        assert "out of reach at its checkpoint" in (first.error or "")
        assert first.outcome is Outcome.CANCELLED and first.task.active
        second = stub.run(steps, task=first.task)
        assert second.succeeded and calls == [1, 2, 3, 3, 4]  # resumed after 2


def test_a_job_carries_its_task_and_attempt_as_plain_values_that_come_back_equal() -> None:
    """What crosses to a handler process (pure logic): every field of a task and an attempt,
    times in any zone, enums, a checkpoint's and a heartbeat's records, comes back equal after
    the channel's pickling; a naive time is carried as it is."""
    import pickle
    from datetime import UTC, datetime, timedelta, timezone

    from runner.store import Attempt, Task
    from runner.store.model import CheckpointInfo, Heartbeat
    from runner.tasks.worker.child import ATTEMPT, TASK

    now = datetime.now(UTC)
    zoned = datetime(2026, 3, 29, 1, 59, 59, 999999, tzinfo=timezone(timedelta(hours=5)))
    task = Task("t", "x", {"a": [1, 2]}, True, TaskStatus.RUNNING, False, -3, now, zoned, 7,
                2**62, unique_key="k", owner="h:1", attempts=2, run_at=datetime(2026, 1, 1),
                ordering_key="o", resources=("r1", "r2"), skipped=False, stop_reason=None,
                checkpoint=CheckpointInfo(now, 10, 1), timeout=2.5)
    attempt = Attempt("a", "t", 2, AttemptStatus.TIMED_OUT, "h:1", zoned, 2**62,
                      ended_at=now, duration_ms=5, error="e", stack_trace="s",
                      heartbeat=Heartbeat(now, {"at": 3}))
    for flat, record in ((TASK, task), (ATTEMPT, attempt)):
        back = flat.unpack(pickle.loads(pickle.dumps(flat.pack(record))))
        assert back == record
        assert [type(v) for v in back.__dict__.values()] == \
            [type(v) for v in record.__dict__.values()]
    assert TASK.unpack(TASK.pack(task)).run_at.tzinfo is None


def test_a_child_at_max_tasks_per_child_has_its_successor_started_with_its_last_attempt(
        ) -> None:
    """A handler process runs at most ``max_tasks_per_child`` attempts; its successor starts
    while it runs its last one, so the attempt after it finds a process ready (three
    processes for six attempts of two each, none started on an attempt's path), and the ones
    that left end (real handler processes from the fork server, no cluster)."""
    import uuid
    from datetime import UTC, datetime

    from runner.store import Attempt, Task
    from runner.tasks.context import CancelToken, TaskContext
    from runner.tasks.features import diag
    from runner.tasks.registry import TaskRegistry
    from runner.tasks.worker.isolated import ChildPool

    class Session:
        state = None
        deadline = time.monotonic() + 3600

        def confirm(self) -> bool:
            return True

    registry = TaskRegistry()
    registry.register("iso.two", diag.sleep, diag.Sleep,
                      isolation=Isolation(max_tasks_per_child=2))
    kind = registry.get("iso.two")
    pool = ChildPool(Session(), "m:1", [])
    pool.start()
    spawned: list[int] = []
    used: list[int] = []
    spawn, take = pool._spawn, pool._take

    def counted_spawn():  # type: ignore[no-untyped-def]
        child = spawn()
        spawned.append(child.proc.pid)
        return child

    def recorded_take(*args):  # type: ignore[no-untyped-def]
        child = take(*args)
        used.append(child.proc.pid)
        return child
    pool._spawn, pool._take = counted_spawn, recorded_take  # type: ignore[method-assign]
    now = datetime.now(UTC)
    try:
        for _ in range(6):
            task = Task(str(uuid.uuid4()), "iso.two", {"seconds": 0.3}, True,
                        TaskStatus.RUNNING, False, 0, now, now, 1, 5, attempts=1)
            attempt = Attempt(str(uuid.uuid4()), task.id, 1, AttemptStatus.RUNNING, "m:1", now)
            pool.run(TaskContext(task=task, attempt=attempt, member_id="m:1", fence_token=5,
                                 cancel=CancelToken(), store=None), kind)  # type: ignore[arg-type]
        first, second, third = used[0], used[2], used[4]
        assert used == [first, first, second, second, third, third], used
        assert spawned[:3] == [first, second, third] and len(set(used)) == 3, spawned
        assert wait_until(lambda: not alive(first) and not alive(second), 10)
    finally:
        pool.close()
