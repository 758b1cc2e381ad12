"""Workflows on a real cluster (issue 72): chains, fan-out and a join submitted all or nothing
under an idempotency key, members released by their dependencies' ends (no scan waits), inputs
read from what they depend on, a failed member blocking its dependants until it is reactivated
or skipped, a cancel of what is left. The store's half (pages, commit, counts, the merged
decrement, the claim's guard) is in the store contract: ``test_store_contract.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from coord.testing import wait_until
from runner.client import TaskStopped
from runner.errors import RequestRefused
from runner.tasks import chain, chord, group, step
from runner.testing.cluster import Cluster
from runner.web.app import create_app
from runner.workflows import member_id, plan, workflow_id

WORKFLOW_MODULE = '''
import json
import os
from pathlib import Path

from runner.tasks import RetryPolicy, TaskContext, task


@task("wf.split")
def split(ctx: TaskContext, payload: dict) -> dict:
    return {"base": payload["base"]}


@task("wf.work")
def work(ctx: TaskContext, payload: dict) -> int:
    (before,) = ctx.inputs.values()
    return before["base"] + payload["i"]


@task("wf.join")
def join(ctx: TaskContext, payload: dict) -> dict:
    values = [value for _, value in ctx.results(page=7)]
    with open(payload["record"], "a") as f:
        f.write(json.dumps({"task": ctx.task.id, "n": len(values)}) + "\\n")
    return {"sum": sum(v for v in values if isinstance(v, int)), "n": len(values)}


@task("wf.flaky")
def flaky(ctx: TaskContext, payload: dict) -> str:
    if not Path(payload["flag"]).exists():
        raise RuntimeError("the flag is not there yet")
    return "fixed"


@task("wf.spawner", retry=RetryPolicy(max_attempts=2, backoff=0.1, retry_on=(RuntimeError,)))
def spawner(ctx: TaskContext, payload: dict) -> int:
    for i in range(payload["n"]):
        ctx.spawn("wf.child", {"i": i}, key=f"c{i}")
        if ctx.attempt.seq == 1 and i == payload["n"] // 2:
            raise RuntimeError("dies half-way through its children")
    return payload["n"]


@task("wf.spawner_iso", isolation="process")
def spawner_isolated(ctx: TaskContext, payload: dict) -> int:
    for i in range(payload["n"]):
        ctx.spawn("wf.child", {"i": 100 + i}, key=f"c{i}")
    return -1


@task("wf.child")
def child(ctx: TaskContext, payload: dict) -> int:
    return payload["i"] * 10


@task("wf.notify")
def notify(ctx: TaskContext, payload: dict) -> str:
    with open(payload["record"], "a") as f:
        f.write(ctx.task.id + "\\n")
    return "told"


@task("wf.slow")
def slow(ctx: TaskContext, payload: dict) -> str:
    ctx.cancel.wait(payload["seconds"])
    return "slept"


@task("wf.gate")
def gate(ctx: TaskContext, payload: dict) -> int:
    """Its first attempt marks that it runs and waits (to be killed with its node)."""
    if ctx.attempt.seq == 1:
        Path(payload["marker"]).write_text(ctx.member_id)
        ctx.cancel.wait(120)
    return payload["n"]


@task("wf.after", isolation="process")
def after(ctx: TaskContext, payload: dict) -> dict:
    return {"inputs": ctx.inputs, "pid": os.getpid()}
'''


def test_a_fan_out_and_its_join_run_once_from_one_submit_and_a_resend_adds_nothing(
        cluster: Cluster, tmp_path: Path) -> None:
    """A split, a fan-out of 20 reading its result, a join paging through their 20 results:
    submitted in pages of one call (the join's page alone), the join runs once with every
    member's result; the same call again answers the same ids and writes nothing; another
    workflow under the same key is refused; ``workflow show`` counts every member."""
    cluster.load_module(tmp_path / "site", "wfjobs", WORKFLOW_MODULE)
    cluster.start_node()
    cluster.start_node()
    record = tmp_path / "joins.jsonl"
    flow = chain(step("wf.split", {"base": 100}),
                 chord(group([step("wf.work", {"i": i}) for i in range(20)]),
                       then=step("wf.join", {"record": str(record)})))
    with cluster.client() as client:
        ref = client.submit_workflow(flow, key="fan-out-1")
        assert ref.id == workflow_id("fan-out-1") and len(ref.members) == 22
        assert ref.members[0] == member_id(ref.id, 0)
        joined = client.result(ref.members[-1], wait=90)
        assert joined == {"sum": sum(100 + i for i in range(20)), "n": 20}
        assert [client.result(m) for m in ref.members[1:4]] == [100, 101, 102]

        again = client.submit_workflow(flow, key="fan-out-1")
        assert again.members == ref.members
        with pytest.raises(RequestRefused) as refused:
            client.submit_workflow(chain(step("wf.split", {"base": 1})), key="fan-out-1")
        assert refused.value.code == "workflow_refused" and "taken by another" in str(
            refused.value)
        holder = client.submit("wf.split", {"base": 0}, unique_key="held-key")
        with pytest.raises(RequestRefused) as taken:
            client.submit_workflow(chain(step("wf.split", {"base": 2}),
                                         step("wf.split", {"base": 3}, unique_key="held-key")),
                                   key="held-1")
        assert taken.value.code == "workflow_refused"
        assert f"member 1 of the workflow: its unique key 'held-key' is held by task " \
            f"{holder.id}" in str(taken.value)
        # nothing of it is claimable: its first member waits for a commit that never came
        first = cluster.store.tasks.get(member_id(workflow_id("held-1"), 0))
        assert first.awaits_commit and cluster.store.workflows.get(
            workflow_id("held-1")).state.value == "open"
        report = client.workflow(ref.id)
        assert report.counts == {"succeeded": 22} and report.workflow.members == 22
        # the master's round marks it succeeded; the cluster's status counts it
        assert wait_until(lambda: client.workflow(ref.id).workflow.state == "succeeded", 30)
        assert client.cluster_status().workflows["succeeded"] >= 1
        assert {m.attempts for m in report.members} == {1}
    assert len(cluster.store.tasks.all("wf.work")) == 20
    assert [json.loads(line)["n"] for line in record.read_text().splitlines()] == [20]
    shown = cluster.cli("workflow", "show", ref.id)
    assert shown.exit_code == 0 and "22 succeeded" in shown.output, shown.output

    # a group over 50 members is one entry of the report, one box of the drawing
    with cluster.client() as client:
        wide = client.submit_workflow(chord(group([step("wf.split", {"base": i})
                                                   for i in range(60)]),
                                            then=step("wf.join", {"record": str(record)})),
                                      key="wide-1")
        assert client.result(wide.members[-1], wait=90)["n"] == 60
        report = client.workflow(wide.id)
        assert [(m.type, m.count) for m in report.members] == [("wf.split", 60),
                                                                ("wf.join", 1)]
        assert report.members[0].counts == {"succeeded": 60} and report.more == 0
        assert report.members[1].depends_on == [report.members[0].id]
    app = create_app(lambda: cluster.client(timeout=10), None, allow_actions=False)
    with TestClient(app) as web:
        page = web.get(f"/workflows/{ref.id}")
        assert page.status_code == 200 and page.text.count('<g class="member succeeded"') == 22
        assert page.text.count('<line class="edge"') == 20 + 20  # split -> 20, 20 -> join
        drawn = web.get(f"/workflows/{wide.id}")
        assert "60 x wf.split" in drawn.text and drawn.text.count("<g class=\"member") == 2
        member = web.get(f"/tasks/{ref.members[1]}")
        assert f'href="/workflows/{ref.id}"' in member.text
        assert web.get("/workflows/no-such-workflow").status_code == 404


def test_a_failed_member_blocks_its_dependants_until_reactivated_and_a_skip_lets_them_go(
        cluster: Cluster, tmp_path: Path) -> None:
    """A chain whose middle step fails: the step after it never starts and shows ``blocked``
    with the failure; reactivated once its cause is fixed, the failed step succeeds and the
    rest runs (what succeeded before is not run again). Another chain's failed step skipped:
    the step after it starts, its input for it absent, in a handler process. A cancel stops
    what is left of a third."""
    cluster.load_module(tmp_path / "site", "wfjobs", WORKFLOW_MODULE)
    cluster.start_node()
    flag = tmp_path / "flag"
    with cluster.client() as client:
        ref = client.submit_workflow(chain(step("wf.split", {"base": 5}),
                                           step("wf.flaky", {"flag": str(flag)}),
                                           step("wf.after")), key="blocked-1")
        first, middle, last = ref.members
        with pytest.raises(TaskStopped):
            client.result(middle, wait=60)
        report = client.workflow(ref.id)
        states = {m.id: (m.state, m.error) for m in report.members}
        assert states[first][0] == "succeeded" and states[middle][0] == "failed"
        assert states[last][0] == "blocked" and "the flag is not there yet" in (
            states[last][1] or ""), states
        shown = client.get(last)  # task show: the member's own state says it too
        assert shown.attempts == [] and shown.task.state == "blocked"
        assert "the flag is not there yet" in (shown.task.stop_reason or "")
        flag.write_text("1")
        client.reactivate(middle)
        done = client.result(last, wait=60)
        assert done["inputs"] == {middle: "fixed"} and done["pid"] != 0
        assert len(client.get(first).attempts) == 1  # not run again

        skipped = client.submit_workflow(chain(step("wf.flaky", {"flag": str(tmp_path / "no")}),
                                               step("wf.after")), key="skipped-1")
        failing, after = skipped.members
        with pytest.raises(TaskStopped):
            client.result(failing, wait=60)
        client.skip(failing)
        assert client.result(after, wait=60)["inputs"] == {}  # its input reads as absent

        stopped = client.submit_workflow(chain(step("wf.flaky", {"flag": str(tmp_path / "no")}),
                                               step("wf.after"), step("wf.after")),
                                         key="cancelled-1")
        with pytest.raises(TaskStopped):
            client.result(stopped.members[0], wait=60)
        cancelled = client.cancel_workflow(stopped.id)
        assert sorted(cancelled.cancelled) == sorted(stopped.members[1:])
        assert wait_until(lambda: {m.state for m in client.workflow(stopped.id).members}
                          == {"failed", "cancelled"}, 30)


def test_a_spawner_retried_half_way_finds_its_children_and_its_dependant_waits_for_them(
        cluster: Cluster, tmp_path: Path) -> None:
    """A handler spawns 6 children keyed c0..c5 and dies after c3; its retry spawns them again
    with the same keys: 6 children in all, each run once. The step after it starts once it and
    every child succeeded, and reads their 7 results; a process-isolated spawner's children
    cross the channel the same way."""
    cluster.load_module(tmp_path / "site", "wfjobs", WORKFLOW_MODULE)
    cluster.start_node()
    with cluster.client() as client:
        ref = client.submit_workflow(chain(step("wf.spawner", {"n": 6}), step("wf.after")),
                                     key="spawner-1")
        parent, after = ref.members
        done = client.result(after, wait=90)
        kids = cluster.store.workflows.children(parent)
        assert sorted(t.payload["i"] for t in kids) == list(range(6))
        assert [len(cluster.store.attempts.for_task(t.id)) for t in kids] == [1] * 6
        assert [a.status.value for a in cluster.store.attempts.for_task(parent)] == [
            "FAILED", "SUCCEEDED"]
        assert done["inputs"] == {parent: 6, **{t.id: t.payload["i"] * 10 for t in kids}}

        iso = client.submit_workflow(chain(step("wf.spawner_iso", {"n": 2}), step("wf.after")),
                                     key="spawner-2")
        inputs = client.result(iso.members[1], wait=90)["inputs"]
        assert sorted(inputs.values()) == [-1, 1000, 1010]


def test_on_failure_runs_once_when_a_member_stops_and_a_deadline_stops_what_has_not_started(
        cluster: Cluster, tmp_path: Path) -> None:
    """A workflow with an ``on_failure`` step: two members that fail past their retries start
    it once; in a workflow that succeeds it never runs (``standby``). A deadline passed while
    the first step of a chain still runs: the step after it is stopped unstarted (its reason
    the deadline), the running one finishes, and the on_failure step starts."""
    cluster.load_module(tmp_path / "site", "wfjobs", WORKFLOW_MODULE)
    cluster.start_node()
    told = tmp_path / "told.txt"
    notify = step("wf.notify", {"record": str(told)})
    missing = str(tmp_path / "never")
    with cluster.client() as client:
        failing = client.submit_workflow(
            chain(group([step("wf.flaky", {"flag": missing}), step("wf.flaky", {"flag": missing})]),
                  step("wf.after")), key="onfail-1", on_failure=notify)
        assert failing.on_failure is not None
        assert client.result(failing.on_failure, wait=60) == "told"
        for member in failing.members[:2]:
            with pytest.raises(TaskStopped):
                client.result(member, wait=60)
        assert told.read_text().splitlines() == [failing.on_failure]  # once, for two stops

        fine = client.submit_workflow(chain(step("wf.split", {"base": 1})), key="onfail-2",
                                      on_failure=notify)
        assert client.result(fine.members[0], wait=60) == {"base": 1}
        states = {m.id: m.state for m in client.workflow(fine.id).members}
        assert states[fine.on_failure] == "standby"

        late = client.submit_workflow(chain(step("wf.slow", {"seconds": 4}), step("wf.after")),
                                      key="deadline-1", on_failure=notify, deadline=1.0)
        assert client.result(late.on_failure, wait=60) == "told"
        assert client.result(late.members[0], wait=60) == "slept"  # it ran on and finished
        stopped = client.get(late.members[1])
        assert stopped.attempts == [] and not stopped.task.active
        assert "its workflow's deadline passed" in (stopped.task.stop_reason or "")
    assert len(told.read_text().splitlines()) == 2


def test_kill_9_of_the_node_running_the_last_member_before_a_join_runs_the_join_once(
        cluster: Cluster, tmp_path: Path) -> None:
    """A fan-out of 6 and a join; the last member's first attempt waits (made to: it marks
    that it runs) and its node is killed -9 then. The master closes that attempt, the other
    node runs the member again, its end releases the join: every member succeeded once, the
    join ran once with all 6 results, nothing waits."""
    cluster.load_module(tmp_path / "site", "wfjobs", WORKFLOW_MODULE)
    first = cluster.start_node()
    marker = tmp_path / "gate"
    record = tmp_path / "joins.jsonl"
    with cluster.client() as client:
        ref = client.submit_workflow(chord(group(
            [step("wf.split", {"base": i}) for i in range(5)]
            + [step("wf.gate", {"marker": str(marker), "n": 7})]),
            then=step("wf.join", {"record": str(record)})), key="kill-1")
        assert wait_until(marker.exists, 60)
        assert marker.read_text() == first
        cluster.start_node()
        cluster.nodes[first].kill()
        joined = client.result(ref.members[-1], wait=120)
    assert joined == {"sum": 7, "n": 6}
    assert [json.loads(line)["n"] for line in record.read_text().splitlines()] == [6]
    for task_id in ref.members:
        statuses = [a.status.value for a in cluster.store.attempts.for_task(task_id)]
        assert statuses.count("SUCCEEDED") == 1, (task_id, statuses)
    gated = [a.status.value for a in cluster.store.attempts.for_task(ref.members[5])]
    assert gated == ["CANCELLED_BY_SYSTEM", "SUCCEEDED"]


def test_a_plan_lists_every_member_after_what_it_depends_on() -> None:
    flow = chain(step("a"), group([chain(step("b"), step("c")), step("d")]),
                 chord(group([step("e"), step("f")]), then=step("g")))
    planned = plan(flow)
    assert [p.template.type for p in planned] == list("abcdefg")
    assert [p.after for p in planned] == [(), (0,), (1,), (0,), (2, 3), (2, 3), (4, 5)]
    with pytest.raises(ValueError, match="at least one step"):
        chain()
    with pytest.raises(ValueError, match="at least one step"):
        group([])
