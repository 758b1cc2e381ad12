"""Task semantics on real servers: delayed tasks and the due-time index, retry policies,
ordering keys, resources and group limits; each through kill -9 of node processes.

Invariants are checked from the attempt records the graph keeps. An attempt of a node killed
-9 ends in the records when someone closes it (the master, or the claim that supersedes it);
the process itself was dead at the kill, so such an attempt counts as running until then only.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import textwrap
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from coord import Session
from coord.testing import NodeProcess, wait_until
from coord.testing.plugin import ZkNamespace
from messaging.testing.plugin import AmqpNamespace
from runner.errors import TaskNotFound
from runner.requests import TaskSubmit
from runner.store import Attempt, AttemptStatus, Task, codec, open_store
from runner.store.due import queue_of
from runner.tasks.due import ensure_cursor, promote
from runner.tasks.master.retention import Retention
from runner.tasks.master.schedules import GRACE, LOOKAHEAD, ScheduleFirer, ScheduleSpec
from runner.testing.cluster import Cluster

FLAKY = '''
    """Task types with retry policies, for the tests."""
    import os
    from pathlib import Path

    from runner.tasks import RetryPolicy, task


    def record(task, error):
        Path(os.environ["FLAKY_DIR"], f"exhausted-{task.id}").write_text(error)


    @task("flaky.op", retry=RetryPolicy(max_attempts=3, backoff=1.0, multiplier=2.0,
                                        jitter=0.0))
    def op(ctx, payload):
        if ctx.attempt.seq < payload["succeed_on"]:
            raise RuntimeError(f"attempt {ctx.attempt.seq} fails")


    @task("flaky.slow", retry=RetryPolicy(max_attempts=2, backoff=15.0, jitter=0.0))
    def slow(ctx, payload):
        if ctx.attempt.seq < 2:
            raise RuntimeError("the first attempt fails")


    @task("flaky.never", retry=RetryPolicy(max_attempts=2, backoff=0.2, jitter=0.0,
                                           retry_on=(ValueError,), on_exhausted=record))
    def never(ctx, payload):
        raise ValueError("never works")


    @task("flaky.other", retry=RetryPolicy(max_attempts=5, retry_on=(ValueError,)))
    def other(ctx, payload):
        raise KeyError("not a retried kind of error")
'''


@pytest.fixture
def flaky(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    (site / "flakytasks.py").write_text(textwrap.dedent(FLAKY))
    return site


def make_cluster(zk: ZkNamespace, amqp: AmqpNamespace, tmp_path: Path,
                 spawn: Callable[..., NodeProcess], site: Path | None = None,
                 **settings: str) -> Cluster:
    c = Cluster(zk.hosts, amqp, tmp_path, spawn, **settings)
    if site is not None:
        c.env["PYTHONPATH"] = os.pathsep.join([str(site), c.env.get("PYTHONPATH", "")])
        c.env["FLAKY_DIR"] = str(tmp_path)
    return c


@pytest.fixture
def make(zk_namespace: ZkNamespace, amqp_vhost: AmqpNamespace, tmp_path: Path,
         spawn_node: Callable[..., NodeProcess]) -> Iterator[Callable[..., Cluster]]:
    made: list[Cluster] = []

    def factory(site: Path | None = None, **settings: str) -> Cluster:
        c = make_cluster(zk_namespace, amqp_vhost, tmp_path, spawn_node, site, **settings)
        made.append(c)
        return c

    yield factory
    for c in made:
        c.store.close()


def intervals(c: Cluster, task_ids: list[str], killed: dict[str, float]
              ) -> list[tuple[float, float, str, Attempt]]:
    """(start, end, task id, attempt) of every attempt of these tasks; an attempt of a member
    killed at time T ends by T (see the module)."""
    found = []
    for task_id in task_ids:
        for a in c.store.attempts.for_task(task_id):
            assert a.ended_at is not None, a
            end = a.ended_at.timestamp()
            if a.executor in killed:
                end = min(end, killed[a.executor])
            found.append((a.started_at.timestamp(), end, task_id, a))
    return sorted(found, key=lambda i: i[0])


def most_at_once(spans: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans],
                    key=lambda ev: (ev[0], ev[1]))  # an end before a start at the same time
    now = top = 0
    for _, step in events:
        now += step
        top = max(top, now)
    return top


def test_far_future_tasks_wait_in_buckets_the_master_opens(zk_namespace: ZkNamespace,
                                                           tmp_path: Path) -> None:
    with open_store(str(tmp_path / "g.db")) as store, \
            Session(zk_namespace.hosts, "b1", timeout=4.0) as session:
        now = codec.now()
        assert promote(session, store.tasks, now) == 0  # no cursor: nothing was bucketed
        soon = store.tasks.create("diag.sleep", {"seconds": 0}, run_at=now + timedelta(seconds=30))
        ensure_cursor(session, now)
        later = store.tasks.create("diag.sleep", {"seconds": 0},
                                   run_at=now + timedelta(hours=2))
        listed = {t.id for t in store.tasks.unfinished()}
        assert soon.id in listed and later.id not in listed
        assert queue_of(store.tasks.get(later.id), now).startswith("at:")
        assert promote(session, store.tasks, now) == 0  # not within the horizon yet
        assert promote(session, store.tasks, now + timedelta(hours=2)) == 1
        assert later.id in {t.id for t in store.tasks.unfinished()}
        assert promote(session, store.tasks, now + timedelta(hours=2)) == 0  # cursor moved
        # a skipped task leaves the queue and says so
        skipped = store.tasks.skip(soon.id)
        assert skipped.finished and skipped.skipped
        assert soon.id not in {t.id for t in store.tasks.unfinished()}


def test_delayed_tasks_start_at_their_time_through_kill_9(make: Callable[..., Cluster]) -> None:
    """A 30 s scan interval: only the nodes' timers can start the tasks on time. One node is
    killed -9 before they are due; the other starts its tasks too, none before its time."""
    c = make(scan_interval="30")
    victim, survivor = c.start_node(), c.start_node()
    with c.client() as client:
        at = codec.now() + timedelta(seconds=8)
        ids = [client.submit("diag.sleep", {"seconds": 0.05}, run_at=at).id for _ in range(4)]
        ids += [client.submit("diag.sleep", {"seconds": 0.05}, delay=8.0).id for _ in range(4)]
    time.sleep(0.5)  # both nodes have listed them (the submission's TRIGGER_SCAN)
    c.nodes[victim].kill()
    # the test means something only if the kill came before the first task was due
    assert codec.now() < at, "the box was too slow: the victim was killed after the tasks' time"
    shown = c.cli("task", "show", ids[0])
    assert "waiting until" in shown.output, shown.output
    for task_id in ids:
        c.wait_finished(task_id, timeout=20)
    for task_id in ids:
        task = c.task(task_id)
        (attempt,) = c.store.attempts.for_task(task_id)
        assert task.run_at is not None and attempt.started_at >= task.run_at
        assert attempt.executor == survivor
        # far sooner than the 30 s interval: started by a timer
        assert attempt.started_at - task.run_at < timedelta(seconds=10)


def test_retry_policies_back_off_stop_and_survive_a_restart(make: Callable[..., Cluster],
                                                            flaky: Path,
                                                            tmp_path: Path) -> None:
    c = make(flaky, tasks=json.dumps(["flakytasks"]))
    first = c.start_node()
    with c.client() as client:
        op = client.submit("flaky.op", {"succeed_on": 3}).id
        never = client.submit("flaky.never", {}).id
        other = client.submit("flaky.other", {}).id
        slow = client.submit("flaky.slow", {}).id
        types = {t.name: t for t in client.task_types()}
        retry = types["flaky.op"].retry
        assert retry is not None and retry.max_attempts == 3
    # a retry waiting for its backoff survives kill -9 of every node: the backoff (15 s) is
    # several times what the CLI call and the kill take unloaded (4 s was outrun by a slow
    # CLI start in a fresh-clone run: the retry had run before `task show` read it)
    assert wait_until(lambda: c.task(slow).attempts == 1 and c.task(slow).status.value
                      == "WAITING", 20, 0.05)
    waiting = c.task(slow)
    assert waiting.active and waiting.run_at is not None and waiting.run_at > codec.now()
    shown = c.cli("task", "show", slow)
    assert "next attempt at" in shown.output, shown.output
    c.nodes[first].kill()
    assert codec.now() < waiting.run_at, "the retry was due before every node was killed"
    c.start_node()
    done = c.wait_finished(slow, timeout=45)
    _a1, a2 = c.store.attempts.for_task(slow)
    assert done.attempts == 2 and a2.status is AttemptStatus.SUCCEEDED
    assert a2.started_at >= waiting.run_at

    assert c.wait_finished(op, timeout=30).attempts == 3
    first_, second, third = c.store.attempts.for_task(op)
    assert [a.status for a in (first_, second, third)] == [
        AttemptStatus.FAILED, AttemptStatus.FAILED, AttemptStatus.SUCCEEDED]
    assert first_.ended_at is not None and second.ended_at is not None
    # the backoff counts from the end written on the attempt (when its handler returned),
    # however long its group commit took to write it
    assert second.started_at - first_.ended_at >= timedelta(seconds=1.0)
    assert third.started_at - second.ended_at >= timedelta(seconds=2.0)

    assert wait_until(lambda: not c.task(never).active, 20, 0.1)
    assert c.task(never).attempts == 2 and not c.task(never).finished
    hook = tmp_path / f"exhausted-{never}"
    assert wait_until(hook.exists, 10) and "never works" in hook.read_text()
    assert wait_until(lambda: not c.task(other).active, 20, 0.1)
    assert c.task(other).attempts == 1  # KeyError is not retried
    assert not (tmp_path / f"exhausted-{other}").exists()


def test_ordering_keys_run_one_at_a_time_in_order_through_kill_9(
        make: Callable[..., Cluster]) -> None:
    c = make()
    members = [c.start_node() for _ in range(3)]
    rng = random.Random(19)
    keys: dict[str, list[str]] = {f"key-{k}": [] for k in range(10)}
    with c.client() as client:
        for _n in range(30):
            for key in keys:
                seconds = rng.choice([0.0, 0.02, 0.05])
                keys[key].append(client.submit("diag.sleep", {"seconds": seconds},
                                               ordering_key=key).id)
        queue = c.cli("task", "list", "--ordering-key", "key-3", "--json")
        assert [t["id"] for t in json.loads(queue.output)][:1] == keys["key-3"][:1] or \
            c.task(keys["key-3"][0]).finished
    time.sleep(3)
    victim = rng.choice(members)
    c.nodes[victim].kill()
    killed = {victim: time.time()}
    every = [t for ids in keys.values() for t in ids]
    assert wait_until(lambda: all(c.task(t).finished for t in every), 180, 0.5), \
        sum(1 for t in every if not c.task(t).finished)
    for key, ids in keys.items():
        position = {task_id: n for n, task_id in enumerate(ids)}
        spans = intervals(c, ids, killed)
        order = [position[task_id] for _, _, task_id, _ in spans]
        assert order == sorted(order), f"{key}: attempts out of submission order: {order}"
        for (_, end, _, a), (start, _, _, b) in itertools.pairwise(spans):
            assert start >= end, f"{key}: attempt {b.id} started before {a.id} ended"
        assert all(c.task(t).attempts >= 1 for t in ids)
    # keys are exclusive holds (ephemeral): no persistent znode per key is left behind
    with Session(c.env["LATCHWORK_ZK_HOSTS"], c.env["LATCHWORK_CLUSTER"], timeout=4.0) as s:
        assert s.client.exists("/slots/key") is None
        assert s.client.get_children("/slots/held/key") == []


def test_a_stopped_task_blocks_its_key_until_skipped_or_reactivated(
        make: Callable[..., Cluster]) -> None:
    """The key's first task fails and stops: the tasks behind it do not run, whatever node
    lists them, until an operator skips it; a reactivated task runs again first."""
    c = make()
    for _ in range(2):
        c.start_node()
    with c.client() as client:
        broken = client.submit("diag.fail", {"message": "blocks k"}, ordering_key="k").id
        behind = [client.submit("diag.sleep", {"seconds": 0}, ordering_key="k").id
                  for _ in range(3)]
        other = client.submit("diag.sleep", {"seconds": 0}, ordering_key="other").id
    assert wait_until(lambda: not c.task(broken).active, 20, 0.1)
    c.wait_finished(other)  # another key is not held up
    time.sleep(2.5)  # two scan intervals and a follow-up scan on every node
    assert all(c.store.attempts.for_task(t) == [] for t in behind)
    queue = json.loads(c.cli("task", "list", "--ordering-key", "k", "--json").output)
    assert [t["id"] for t in queue] == [broken, *behind]
    # reactivated, it is the key's first again: it runs (and stops) before the others
    assert c.cli("task", "reactivate", broken).exit_code == 0
    assert wait_until(lambda: c.task(broken).attempts == 2 and not c.task(broken).active,
                      20, 0.1)
    assert all(c.store.attempts.for_task(t) == [] for t in behind)
    skipped = c.cli("task", "skip", broken)
    assert skipped.exit_code == 0, skipped.output
    for task_id in behind:
        c.wait_finished(task_id)
    starts = [c.store.attempts.for_task(t)[0].started_at for t in behind]
    assert starts == sorted(starts)
    assert c.task(broken).skipped and c.task(broken).finished


def test_resources_and_group_limits_hold_through_kill_9(make: Callable[..., Cluster]) -> None:
    c = make(concurrency=json.dumps({"diag": 3, "diag.effect": 1}), workers="3")
    members = [c.start_node() for _ in range(3)]
    rng = random.Random(20)
    names = ["ontology:brick", "aspect:geo", "aspect:time", "file:/x"]
    held: dict[str, list[str]] = {}
    with c.client() as client:
        resource_tasks = []
        for _ in range(24):
            chosen = rng.sample(names, 2)
            task_id = client.submit("diag.sleep", {"seconds": 0.3}, resources=chosen).id
            resource_tasks.append(task_id)
            held[task_id] = chosen
        effects = [client.submit("diag.effect", {"seconds": 0.2}).id for _ in range(8)]
        seen_status = []
        for _ in range(30):
            status = client.cluster_status()
            seen_status.append(status)
            if status.resources:
                break
            time.sleep(0.1)
    assert any(s.resources for s in seen_status), seen_status[-1]
    assert all(len(holders) == 1 for holders in seen_status[-1].resources.values())
    levels = {lv.group: lv for lv in seen_status[-1].concurrency}
    assert levels["diag"].limit == 3 and levels["diag"].used <= 3
    time.sleep(1.5)
    victim = rng.choice(members)
    c.nodes[victim].kill()
    killed = {victim: time.time()}
    every = resource_tasks + effects
    assert wait_until(lambda: all(c.task(t).finished for t in every), 120, 0.5), \
        sum(1 for t in every if not c.task(t).finished)
    spans = intervals(c, every, killed)
    for name in names:
        holding = [(s, e) for s, e, task_id, _ in spans if name in held.get(task_id, [])]
        assert most_at_once(holding) <= 1, f"two holders of {name} at once"
    assert most_at_once([(s, e) for s, e, _, _ in spans]) <= 3  # the "diag" group
    assert most_at_once([(s, e) for s, e, t, _ in spans if t in effects]) <= 1
    assert c.task(resource_tasks[0]).resources == tuple(sorted(held[resource_tasks[0]]))


def test_bad_submissions_get_clear_errors(make: Callable[..., Cluster]) -> None:
    c = make()
    c.start_node()
    both = c.cli("task", "submit", "diag.sleep", "--delay", "1", "--run-at",
                 "2030-01-01T00:00:00+00:00")
    assert both.exit_code == 2 and "not both" in both.output
    naive = c.cli("task", "submit", "diag.sleep", "--run-at", "2030-01-01T00:00:00")
    assert naive.exit_code == 2 and "timezone" in naive.output and "--run-at" in naive.output
    empty_key = c.cli("task", "submit", "diag.sleep", "--ordering-key", "")
    assert empty_key.exit_code == 2, empty_key.output
    two = c.cli("schedule", "add", "s", "--cron", "* * * * *", "--every", "5s", "--type",
                "diag.sleep")
    assert two.exit_code == 2 and "one of them" in two.output
    soon = c.cli("schedule", "add", "s", "--every", "soon", "--type", "diag.sleep")
    assert soon.exit_code == 2 and "not a duration" in soon.output
    unknown = c.cli("schedule", "add", "s", "--every", "5s", "--type", "no.such")
    assert unknown.exit_code == 2 and "unknown task type" in unknown.output
    missing = c.cli("schedule", "remove", "nothing-here")
    assert missing.exit_code == 1 and "no schedule" in missing.output
    no_payload = c.cli("schedule", "add", "s", "--every", "1h", "--type", "diag.sleep")
    assert no_payload.exit_code == 2 and "seconds" in no_payload.output
    assert c.cli("schedule", "add", "s", "--every", "1h", "--type", "diag.sleep",
                 "--payload", '{"seconds": 0}').exit_code == 0
    again = c.cli("schedule", "add", "s", "--every", "2h", "--type", "diag.sleep",
                  "--payload", '{"seconds": 0}')
    assert again.exit_code == 2 and "exists already" in again.output
    with c.client() as client:
        running = client.submit("diag.sleep", {"seconds": 15}).id  # running through the CLI
        c.wait_running_on(running)
        refused = c.cli("task", "skip", running)
        assert refused.exit_code != 0 and "cancel it first" in refused.output
        when = datetime.now().astimezone() + timedelta(days=3)
        far = client.submit("diag.sleep", {"seconds": 0}, run_at=when)
        assert far.run_at is not None and abs((far.run_at - when).total_seconds()) < 0.001
        assert far.id not in {t.id for t in client.list(unfinished=True)}
        assert c.cli("task", "skip", far.id).exit_code == 0
        assert c.task(far.id).skipped


def test_schedule_fires_missed_while_no_master_run_once_or_skip(tmp_path: Path) -> None:
    """The firer's rounds over a real graph; ``submit`` records what a node would create."""
    with open_store(str(tmp_path / "g.db")) as store:
        made: list[tuple[str, str | None, datetime]] = []

        def submit(req: TaskSubmit) -> Task:
            run_at = req.run_at
            assert isinstance(run_at, datetime)
            made.append((req.type, req.unique_key, run_at))
            return store.tasks.create(req.type, req.payload, unique_key=req.unique_key,
                                      run_at=run_at)

        firer = ScheduleFirer(store, submit)
        for name, misfire in (("once", "run_once"), ("skip", "skip")):
            store.schedules.add(name, ScheduleSpec(every=1.0, type="diag.sleep",
                                                   misfire=misfire).model_dump())
        created = store.schedules.get("once").created_at
        # no master for a minute (half a step off the fires: no fire on a boundary)
        later = created + timedelta(seconds=60.5)
        firer.tick(later)
        once = [m for m in made if m[1] and m[1].startswith("schedule:once:")]
        skip = [m for m in made if m[1] and m[1].startswith("schedule:skip:")]
        # fires in the last GRACE seconds and the next LOOKAHEAD ones, each once; of the
        # older ones, "run_once" runs the latest now and "skip" none
        recent = int(GRACE + LOOKAHEAD)
        assert len(skip) == recent and len(once) == recent + 1
        assert once[0][2] == later  # the latest missed fire, due now
        assert len({m[1] for m in made}) == len(made)
        made.clear()
        firer.tick(later)  # the same round again (a new master): nothing new
        firer.tick(later + timedelta(seconds=1))
        assert len(made) == 2  # one more fire each
        store.schedules.update(store.schedules.get("once"), paused=True)
        firer.tick(later + timedelta(seconds=30))
        assert [m for m in made if m[1] and m[1].startswith("schedule:once:")][-1][2] \
            <= later + timedelta(seconds=1 + LOOKAHEAD)  # paused: no fires after


def test_a_schedule_fires_once_per_fire_through_kill_9_of_the_master(
        make: Callable[..., Cluster]) -> None:
    c = make()
    members = [c.start_node() for _ in range(2)]
    added = c.cli("schedule", "add", "tick", "--every", "1s", "--type", "diag.sleep",
                  "--payload", '{"seconds": 0}')
    assert added.exit_code == 0, added.output
    bad = c.cli("schedule", "add", "bad", "--cron", "61 * * * *", "--type", "diag.sleep")
    assert bad.exit_code != 0 and "cron" in bad.output
    time.sleep(4)
    with c.client() as client:
        master = client.cluster_status().master
    assert master in members
    c.nodes[master].kill()
    killed = time.time()
    time.sleep(8)
    listing = c.cli("schedule", "list", "--json")
    (tick,) = json.loads(listing.output)
    assert tick["last_fire"] is not None and tick["next_fire"] is not None
    c.cli("schedule", "pause", "tick")
    time.sleep(1)
    tasks = [t for t in c.store.tasks.all("diag.sleep")
             if t.unique_key and t.unique_key.startswith("schedule:tick:")]
    fires = sorted(codec.decode_time(t.unique_key.split(":", 2)[2]) for t in tasks)
    assert len(fires) == len(set(fires)) >= 8
    # every fire from the first to the last has its task, across the master's death
    steps = [(b - a).total_seconds() for a, b in itertools.pairwise(fires)]
    assert all(abs(s - 1.0) < 0.01 for s in steps), steps
    assert fires[-1].timestamp() > killed + 3  # the new master went on
    for t in tasks:
        assert t.run_at is not None
        for a in c.store.attempts.for_task(t.id):
            assert a.started_at >= t.run_at


def test_retention_archives_old_finished_tasks_through_kill_9_of_the_master(
        make: Callable[..., Cluster], tmp_path: Path) -> None:
    data = tmp_path / "data"
    c = make(retention_days=str(6 / 86400), retention_interval="0.3", retention_batch="3",
             data_dir=str(data))
    members = [c.start_node() for _ in range(2)]
    with c.client() as client:
        done = [client.submit("diag.sleep", {"seconds": 0}).id for _ in range(7)]
        stopped = client.submit("diag.fail", {"message": "kept: not finished"}).id
    for task_id in done:
        c.wait_finished(task_id)
    assert wait_until(lambda: not c.task(stopped).active, 20, 0.1)

    def gone(task_id: str) -> bool:
        try:
            c.task(task_id)
        except TaskNotFound:
            return True
        return False

    # the first batch goes about 6 s after the tasks finished; then the master dies
    assert wait_until(lambda: any(gone(t) for t in done), 30, 0.05)
    with c.client() as client:
        master = client.cluster_status().master
    assert master in members
    c.nodes[master].kill()
    assert wait_until(lambda: all(gone(t) for t in done), 60, 0.2)
    assert not gone(stopped)  # stopped, not finished: kept
    shown = c.cli("task", "show", done[0])
    assert shown.exit_code == 1 and "archived to" in shown.output, shown.output

    import pyarrow.parquet as pq
    rows = [row for f in sorted((data / "archive").glob("*.parquet"))
            for row in pq.read_table(f).to_pylist()]
    assert sorted(r["id"] for r in rows) == sorted(done)  # each once, across the failover
    for row in rows:
        (attempt,) = json.loads(row["attempts"])
        assert attempt["status"] == "SUCCEEDED"
        assert json.loads(row["task"])["type"] == "diag.sleep"
    assert not list((data / "archive").glob("*.partial"))


def test_retention_delete_mode_and_the_default_keep_everything(zk_namespace: ZkNamespace,
                                                               tmp_path: Path) -> None:
    with open_store(str(tmp_path / "g.db")) as store, \
            Session(zk_namespace.hosts, "ret", timeout=4.0) as session:
        task = store.tasks.create("diag.sleep", {"seconds": 0})
        store.tasks.update(task.id, task.version, None, finished=True)
        retention = Retention(session, store, "me", days=1, mode="delete",
                              data_dir=str(tmp_path / "data"), batch=10)
        assert retention.tick(force=True) == 0  # finished today: not a day old
        later = codec.now() + timedelta(days=2)
        assert retention.tick(later, force=True) == 1
        tomb = store.retention.tombstone(task.id)
        assert tomb is not None and tomb.where == ""
        assert not (tmp_path / "data" / "archive").exists()
        assert retention.tick(later, force=True) == 0


def test_retention_removes_a_workflow_as_a_unit_once_every_member_finished(
        zk_namespace: ZkNamespace, tmp_path: Path) -> None:
    """Issue 72: a workflow's finished members stay while one of its members is unfinished (a
    pending join may still need their results; a stopped member may be reactivated), and go
    together, with the workflow's vertex, once the last one finished, whatever day each
    finished on; a plain task of the same day goes on its own."""
    import dataclasses

    from runner.store import NewMember

    with open_store(str(tmp_path / "g.db")) as store, \
            Session(zk_namespace.hosts, "ret", timeout=4.0) as session:
        store.workflows.begin("wf-r", "r", 3)
        made = []
        for n in range(3):
            task = dataclasses.replace(store.tasks.new("t", {"n": n}), workflow="wf-r",
                                       pending=1 if n else 0, awaits_commit=n == 0)
            made.append(NewMember(task, (made[-1].task.id,) if n else ()))
        store.workflows.add("wf-r", made)
        for m in made[:2]:
            current = store.tasks.get(m.task.id)
            store.tasks.update(m.task.id, current.version, None, finished=True)
        plain = store.tasks.create("diag.sleep", {"seconds": 0})
        store.tasks.update(plain.id, plain.version, None, finished=True)
        retention = Retention(session, store, "me", days=1, mode="delete",
                              data_dir=str(tmp_path / "data"), batch=10)
        later = codec.now() + timedelta(days=2)
        assert retention.tick(later, force=True) == 1  # the plain task alone
        assert len(store.workflows.members("wf-r")) == 3
        assert store.retention.tombstone(plain.id) is not None

        last = store.tasks.get(made[2].task.id)
        store.tasks.update(last.id, last.version, None, finished=True)
        even_later = codec.now() + timedelta(days=4)
        retention = Retention(session, store, "me", days=1, mode="delete",
                              data_dir=str(tmp_path / "data"), batch=2)
        assert retention.tick(even_later, force=True) == 3  # a unit, over the batch of 2
        assert store.workflows.members("wf-r") == []
        with pytest.raises(TaskNotFound):
            store.workflows.get("wf-r")
        assert all(store.retention.tombstone(m.task.id) is not None for m in made)


def test_two_masters_in_a_failover_move_the_retention_cursor_once(zk_namespace: ZkNamespace,
                                                                  tmp_path: Path) -> None:
    """The cursor is moved by compare-and-set: a master whose view is stale (another moved it
    meanwhile) reads it again instead of writing over it."""
    with open_store(str(tmp_path / "g.db")) as store, \
            Session(zk_namespace.hosts, "ret", timeout=4.0) as session:
        task = store.tasks.create("diag.sleep", {"seconds": 0})
        store.tasks.update(task.id, task.version, None, finished=True)
        old, new = (Retention(session, store, name, days=1, mode="delete",
                              data_dir=str(tmp_path / "data"), batch=10)
                    for name in ("old", "new"))
        today = old._cursor()
        assert today == new._cursor() == codec.now().strftime("%Y-%m-%d")
        tomorrow = new._advance(today)  # the new master moves on
        # the old master's write from its stale view is refused; it reads where the cursor is
        assert old._advance(today) == tomorrow
        assert new._cursor() == tomorrow

