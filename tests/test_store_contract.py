"""The graph store's contract, run against every available backend.

Two backends always run: the embedded one (gremlite on a SQLite file) and ``server``, a real
Gremlin Server (TinkerPop 3.5.1, TinkerGraph, one traversal at a time: the ``gremlin_server``
fixture), reached through the driver as a cluster on several hosts would. A third, ``remote``,
is added when ``LATCHWORK_TEST_GREMLIN_URL`` names a disposable transactional server
(JanusGraph, Neo4j: the suite drops its graph before each test); none can be installed here,
so CI runs the first two (docs/graph.md says what each proves).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from gremlin_python.process.traversal import Cardinality
from rdflib import RDFS, Graph, URIRef

from coord import Session, TaskLock, force_release
from coord.testing.plugin import ZkNamespace
from runner.errors import (
    AttemptAlreadyFinished,
    CommitConflict,
    InvalidValue,
    ResourceTaken,
    StaleFencingToken,
    TaskNotFound,
    UnknownStoreFormat,
)
from runner.ontology import parse_ontology
from runner.store import (
    CHECKPOINT_LIMIT,
    AttemptStatus,
    Avatar,
    Conclusion,
    Fence,
    NewMember,
    Ontology,
    OntologyClass,
    StopCause,
    Store,
    Task,
    TaskStatus,
    WorkflowState,
    attempt_end,
    codec,
    due,
    open_store,
    store_on,
)
from runner.store.server.graph import SERIAL
from runner.tasks.outcomes import Outcome, task_changes
from runner.testing.gremlinserver import GremlinServer

REMOTE_URL = os.environ.get("LATCHWORK_TEST_GREMLIN_URL")
FINISHED_CHANGE = {"status": TaskStatus.WAITING, "finished": True}
BRICK = Path(importlib.util.find_spec("brickschema").submodule_search_locations[0]) / (  # type: ignore[union-attr,index]
    "ontologies")


@pytest.fixture(params=["gremlite", "server", *(["remote"] if REMOTE_URL else [])])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "server":
        server: GremlinServer = request.getfixturevalue("gremlin_server")
        s = open_store(server.url, atomicity=SERIAL)
        s.clear()
    elif request.param == "remote":
        s = open_store(REMOTE_URL or "")
        s.clear()
    else:
        s = open_store(str(tmp_path / "graph.db"))
    try:
        yield s
    finally:
        s.close()


def counts(store: Store) -> tuple[int, int]:
    return store.graph.read(lambda g: (g.V().count().next(), g.E().count().next()))


# -- encodings ----------------------------------------------------------------------------------


def test_a_time_is_encoded_as_strftime_writes_it_in_every_zone_and_year() -> None:
    """``codec.encode_time``'s fast path writes the very text ``strftime`` wrote (the store's
    stored times sort as strings and are compared as text by version guards)."""
    from datetime import timezone

    from runner.store.codec import _TIME_FORMAT

    rng = __import__("random").Random(7)
    values = [datetime(1, 1, 1, tzinfo=UTC), datetime(999, 5, 6, tzinfo=UTC),
              datetime(1000, 1, 1, tzinfo=UTC),
              datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
              datetime(2026, 11, 28, 9, 0, 0, 0, tzinfo=UTC)]
    for _ in range(300):
        zone = timezone(timedelta(minutes=rng.randint(-900, 900)))
        values.append(datetime(rng.randint(1001, 9998), rng.randint(1, 12), rng.randint(1, 28),
                               rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59),
                               rng.choice([0, rng.randint(0, 999999)]), tzinfo=zone))
    for value in values:
        assert codec.encode_time(value) == \
            value.astimezone(UTC).strftime(_TIME_FORMAT), value
        if value.year >= 1000:
            assert codec.decode_time(codec.encode_time(value)) == value
    with pytest.raises(InvalidValue):
        codec.encode_time(datetime(2026, 1, 1))


def test_a_loop_change_writes_what_a_full_comparison_of_the_properties_finds() -> None:
    """A claim's or an end's change compares only the properties a change can move
    (``changing_props``): what it writes is what comparing every property found, for every
    kind of change the loop and the master make (the payload left out: it is not changed)."""
    from runner.store.gremlin.rows import TASK_FIXED, task_props
    from runner.store.gremlin.writes import task_change
    from runner.store.model import CheckpointInfo

    now = codec.now()
    base = Task(id="t1", type="etl", payload={"n": 1}, active=True, status=TaskStatus.WAITING,
                finished=False, priority=3, created_at=now - timedelta(hours=1),
                updated_at=now - timedelta(minutes=1), version=4, fence=9, unique_key="u",
                ordering_key="k", resources=("db", "gpu"), run_at=now - timedelta(seconds=5),
                checkpoint=CheckpointInfo(now, 10, 2), timeout=30.0)
    changes = [({"status": "RUNNING", "owner": "host:1"}, 12, True, False),
               ({"status": "WAITING", "finished": True}, 12, False, False),
               ({"status": "WAITING", "active": False, "stop_reason": "why"}, None, False, True),
               ({"status": "WAITING", "run_at": now + timedelta(hours=2), "owner": None},
                None, False, True),
               ({"priority": 7}, 9, False, False), ({"skipped": True, "finished": True},
                                                    None, False, False)]
    for task in (base, dataclasses.replace(base, ordering_key=None, resources=(),
                                           checkpoint=None, run_at=None, owner="h:2")):
        for change, token, new_attempt, move_fence in changes:
            made = task_change(task, token, change, new_attempt=new_attempt,
                               move_fence=move_fence)
            old, new = task_props(task, payload=False), task_props(made.task, payload=False)
            assert made.props == {k: v for k, v in new.items()
                                    if k not in TASK_FIXED and old.get(k) != v}, change


def test_a_started_attempt_is_the_attempt_a_read_of_its_properties_gives() -> None:
    """``attempt_start`` answers the attempt it writes without decoding its own properties:
    it equals what a read of them gives (``attempt_from_row``), field by field."""
    from runner.store.gremlin.rows import attempt_from_row
    from runner.store.gremlin.writes import attempt_start

    now = codec.now()
    task = Task(id="t1", type="etl", payload={}, active=True, status=TaskStatus.RUNNING,
                finished=False, priority=0, created_at=now, updated_at=now, version=2,
                fence=11, attempts=3)
    for token in (11, 10 ** 19):
        start = attempt_start(task, "host:42", token)
        assert start.attempt == attempt_from_row(start.props)
        assert (start.attempt.seq, start.attempt.fence) == (3, token)


# -- tasks --------------------------------------------------------------------------------------

def test_create_and_get_round_trip_every_field(store: Store) -> None:
    payload = {"iri": "https://brickschema.org/schema/Brick", "files": ["a.ttl", "b.ttl"],
               "nested": {"n": 2**70, "ok": True}}
    task = store.tasks.create("ontology.load", payload, priority=5)
    got = store.tasks.get(task.id)
    assert got == task
    assert got.payload == payload and got.status is TaskStatus.WAITING
    assert got.active and not got.finished and got.version == 0 and got.fence == 0
    assert got.created_at.tzinfo is not None
    with pytest.raises(TaskNotFound):
        store.tasks.get("no-such-task")


def test_a_uniqueness_key_returns_the_existing_task(store: Store) -> None:
    first = store.tasks.create("aspect.create", {"aspect": "geo"}, unique_key="aspect:geo")
    second = store.tasks.create("aspect.create", {"aspect": "geo"}, unique_key="aspect:geo")
    other = store.tasks.create("aspect.create", {"aspect": "ts"}, unique_key="aspect:ts")
    assert second.id == first.id and other.id != first.id
    assert len(store.tasks.unfinished()) == 2


def test_a_bulk_write_sent_again_finds_what_it_wrote_instead_of_writing_it_twice(
        store: Store) -> None:
    """``add_many(..., again=True)``, a keyed bulk submit page sent again after its answer was
    lost: the tasks its first write made are found by their ids (and one by its uniqueness
    key), the rest written, in order, each once; a second sending changes nothing."""
    from runner.requests import page_task_id

    def page(n: int) -> list[Task]:
        made = [store.tasks.new("t", {"n": i}) for i in range(n)]
        made[1] = store.tasks.new("t", {"n": 1}, unique_key="page-once")
        return [dataclasses.replace(t, id=page_task_id("k0000001", i))
                for i, t in enumerate(made)]

    first = store.tasks.add_many(page(3)[:2], again=True)  # the answer of this one was lost
    before = counts(store)
    whole = store.tasks.add_many(page(5), again=True)
    assert [t.id for t in whole[:2]] == [t.id for t in first]
    assert [t.payload["n"] for t in whole] == [0, 1, 2, 3, 4]
    assert counts(store)[0] == before[0] + 3
    assert [t.id for t in store.tasks.add_many(page(5), again=True)] == [t.id for t in whole]
    assert counts(store)[0] == before[0] + 3
    assert all(store.tasks.get(t.id) == t for t in whole)


def test_unfinished_lists_active_open_tasks_by_priority_then_age(store: Store) -> None:
    low = store.tasks.create("t", priority=0)
    high = store.tasks.create("t", priority=9)
    low2 = store.tasks.create("t", priority=0)
    done = store.tasks.create("t")
    store.tasks.update(done.id, 0, None, finished=True)
    stopped = store.tasks.create("t")
    store.tasks.deactivate(stopped.id)
    assert [t.id for t in store.tasks.unfinished()] == [high.id, low.id, low2.id]
    store.tasks.reactivate(stopped.id)
    assert stopped.id in {t.id for t in store.tasks.unfinished()}
    assert store.tasks.get(done.id).finished  # never deleted
    assert {t.id for t in store.tasks.all()} == {low.id, high.id, low2.id, done.id, stopped.id}
    other = store.tasks.create("other")
    assert [t.id for t in store.tasks.all(type="other")] == [other.id]


def test_conditional_update_needs_the_current_version(store: Store) -> None:
    task = store.tasks.create("t")
    claimed = store.tasks.update(task.id, 0, 7, status=TaskStatus.RUNNING, owner="m1")
    assert (claimed.version, claimed.fence, claimed.owner) == (1, 7, "m1")
    with pytest.raises(CommitConflict) as info:
        store.tasks.update(task.id, 0, 7, status=TaskStatus.WAITING)
    assert info.value.actual == 1
    assert store.tasks.get(task.id) == claimed
    with pytest.raises(InvalidValue, match="type"):
        store.tasks.update(task.id, 1, 7, type="other")


def test_versions_reports_current_versions_of_existing_tasks(store: Store) -> None:
    a, b = store.tasks.create("t"), store.tasks.create("t")
    store.tasks.update(a.id, 0, 3, status=TaskStatus.RUNNING, owner="m1")
    assert store.tasks.versions([a.id, b.id, "no-such-task"]) == {a.id: 1, b.id: 0}
    assert store.tasks.versions([]) == {}


def test_a_stale_fencing_token_is_rejected_and_changes_nothing(store: Store) -> None:
    task = store.tasks.create("t")
    big = 2**63 - 5  # ZooKeeper zxids are 64-bit; gremlite cannot hold this natively
    owned = store.tasks.update(task.id, 0, big, status=TaskStatus.RUNNING, owner="new")
    assert store.tasks.get(task.id).fence == big
    with pytest.raises(StaleFencingToken):
        store.tasks.update(task.id, owned.version, big - 1, finished=True, owner="old")
    assert store.tasks.get(task.id) == owned


def test_stale_owner_of_a_real_task_lock_is_stopped(store: Store,
                                                    zk_namespace: ZkNamespace) -> None:
    task = store.tasks.create("ontology.load")
    with Session(zk_namespace.hosts, "s1", timeout=4.0) as session:
        old_lock = TaskLock(session, task.id, "member-old")
        old_token = old_lock.try_acquire()
        assert old_token is not None
        v1 = store.tasks.update(task.id, 0, old_token, status=TaskStatus.RUNNING,
                                owner="member-old")
        # the master decides member-old is dead and frees its lock; another member takes it
        force_release(session, task.id)
        new_token = TaskLock(session, task.id, "member-new").try_acquire()
        assert new_token is not None and new_token > old_token
        v2 = store.tasks.update(task.id, v1.version, new_token, owner="member-new")
        with pytest.raises(StaleFencingToken):
            store.tasks.update(task.id, v2.version, old_token, finished=True)
    assert store.tasks.get(task.id) == v2


# -- attempts -----------------------------------------------------------------------------------

def test_attempts_are_written_closed_once_and_listed_in_order(store: Store) -> None:
    task = store.tasks.create("t")
    first = store.attempts.start(task.id, "host:1:a", fence_token=2**62 + 1)
    assert first.status is AttemptStatus.RUNNING and first.seq == 1 and first.ended_at is None
    assert first.fence == 2**62 + 1
    assert [a.id for a in store.attempts.running()] == [first.id]
    assert first.progress is None
    assert store.attempts.progress(first.id, 3, 10, "three")
    assert store.attempts.progress(first.id, 7, None, "seven of some")  # the last one wins
    (reported,) = store.attempts.running()
    assert reported.progress is not None
    assert (reported.progress.done, reported.progress.total, reported.progress.message) == (
        7, None, "seven of some")
    failed = store.attempts.finish(first.id, AttemptStatus.FAILED, "boom",
                                   "Traceback ...\nValueError: boom")
    assert failed.ended_at is not None and failed.duration_ms is not None
    assert (failed.error, failed.stack_trace) == ("boom", "Traceback ...\nValueError: boom")
    with pytest.raises(AttemptAlreadyFinished):
        store.attempts.finish(first.id, AttemptStatus.CANCELLED_BY_SYSTEM)
    assert not store.attempts.progress(first.id, 9, 10, "after its end")  # refused
    assert store.attempts.get(first.id).progress == reported.progress  # kept as it was
    second = store.attempts.start(task.id, "host:2:b")
    # the handler's last report, not written yet, goes with the end
    last = codec.progress_json(4, 5, "four", codec.now())
    ended = store.attempts.finish(second.id, AttemptStatus.CANCELLED_BY_SYSTEM, "owner died",
                                  progress=last)
    assert store.attempts.get(second.id).progress == ended.progress
    assert ended.progress is not None and (ended.progress.done, ended.progress.total) == (4, 5)
    third = store.attempts.start(task.id, "host:3:c")
    store.attempts.finish(third.id, AttemptStatus.SUCCEEDED)
    listed = store.attempts.for_task(task.id)
    assert [(a.seq, a.status, a.executor) for a in listed] == [
        (1, AttemptStatus.FAILED, "host:1:a"), (2, AttemptStatus.CANCELLED_BY_SYSTEM, "host:2:b"),
        (3, AttemptStatus.SUCCEEDED, "host:3:c")]
    assert store.attempts.running() == []
    assert [a.seq for a in store.attempts.recent(2)] == [3, 2]  # the last ends, newest first
    assert [a.seq for a in store.attempts.recent()] == [3, 2, 1]
    with pytest.raises(TaskNotFound):
        store.attempts.start("no-such-task", "m")
    with pytest.raises(InvalidValue):
        store.attempts.finish(third.id, AttemptStatus.RUNNING)


def test_attempts_are_numbered_by_their_task_whoever_starts_them(store: Store) -> None:
    """The task counts its attempts (a claim reads nothing): a standalone start counts too and
    moves the task on, so a claim from a listing older than that start is a conflict."""
    listed = store.tasks.create("t")
    first = store.attempts.start(listed.id, "m0")
    assert first.seq == 1 and store.tasks.get(listed.id).attempts == 1
    with pytest.raises(CommitConflict):
        store.claim(listed, 3, "m1")
    task, second = store.claim(store.tasks.get(listed.id), 3, "m1")
    assert (second.seq, task.attempts) == (2, 2)
    task, third = store.claim(task, 3, "m1")  # the owner's retry: a claim of what it wrote
    assert (third.seq, task.attempts) == (3, 3) and store.tasks.get(listed.id) == task
    assert [a.seq for a in store.attempts.for_task(listed.id)] == [1, 2, 3]


def test_vertices_of_an_unknown_format_are_refused_by_name(store: Store) -> None:
    """A task or attempt without the properties this version writes (an older, unreleased
    format) is a typed error naming it, not a guess or a KeyError."""
    store.graph.write(lambda g: g.add_v("task").property("task_id", "old-1")
                      .property("task_type", "t").property("task_status", "WAITING")
                      .add_v("attempt").property("attempt_id", "old-a")
                      .property("attempt_status", "RUNNING").iterate())
    with pytest.raises(UnknownStoreFormat, match="old-1"):
        store.tasks.get("old-1")
    with pytest.raises(UnknownStoreFormat, match="old-a"):
        store.attempts.get("old-a")


def test_a_new_task_written_claimed_is_what_a_create_and_a_claim_leave(
        store: Store) -> None:
    """``create_claimed``: the submitter's one write (the task RUNNING with its attempt) leaves
    the task and attempt that ``tasks.add`` and ``claim`` leave in two; the task is listed and
    found by its owner like any claimed task, and concluded the same way. A task that needs a
    look first (a uniqueness key, resources) is refused, nothing written."""
    new = store.tasks.new("t", {"n": 1}, priority=3)
    task, attempt = store.create_claimed(new, 7, "m1")
    twice = store.claim(store.tasks.add(store.tasks.new("t", {"n": 1}, priority=3)), 7, "m1")
    # the same but for ids and times
    assert dataclasses.replace(task, id=twice[0].id, created_at=twice[0].created_at,
                               updated_at=twice[0].updated_at) == twice[0]
    assert dataclasses.replace(attempt, id=twice[1].id, task_id=twice[1].task_id,
                               started_at=twice[1].started_at) == twice[1]
    assert (task.status, task.owner, task.fence, task.version, task.attempts, task.priority) \
        == (TaskStatus.RUNNING, "m1", 7, 1, 1, 3)
    assert store.tasks.get(new.id) == task
    assert store.attempts.for_task(new.id) == [attempt]
    assert (attempt.seq, attempt.status, attempt.fence, attempt.executor) == (
        1, AttemptStatus.RUNNING, 7, "m1")
    assert new.id in {t.id for t in store.tasks.unfinished()}
    done = store.conclude(Conclusion.of(attempt, AttemptStatus.SUCCEEDED, task,
                                        {"status": TaskStatus.WAITING, "finished": True},
                                        progress=codec.progress_json(10, 10, "done", codec.now())))
    assert store.tasks.get(new.id) == done and done.finished
    (ended,) = store.attempts.for_task(new.id)  # the last report went with the end
    assert ended.progress is not None and (ended.progress.done, ended.progress.message) == (
        10, "done")
    before = counts(store)
    for refused in (store.tasks.new("t", unique_key="u"), store.tasks.new("t", resources=["r"])):
        with pytest.raises(InvalidValue):
            store.create_claimed(refused, 8, "m1")
    assert counts(store) == before


def test_a_submit_sent_again_finds_the_task_its_first_sending_wrote(store: Store) -> None:
    """``create_claimed_again`` and ``add_many(..., again=True)``: a submit whose request was
    handled twice (redelivered after the node that wrote it was killed or cut off before its
    answer went) writes its task once, by the id the request's id makes; the second sending
    writes nothing, neither a task nor an attempt, whichever way either went."""
    new = store.tasks.new("t", {"n": 1})
    made = store.create_claimed_again(new, 7, "m1")
    assert made is not None
    task, attempt = made
    before = counts(store)
    assert store.create_claimed_again(new, 9, "m2") is None
    assert store.tasks.add_many([new], again=True) == [task]
    assert counts(store) == before
    assert store.tasks.get(new.id) == task and store.attempts.for_task(new.id) == [attempt]
    waiting = store.tasks.new("t", {"n": 2})  # the first sending wrote it WAITING
    (written,) = store.tasks.add_many([waiting], again=True)
    before = counts(store)
    assert store.create_claimed_again(waiting, 7, "m1") is None
    assert counts(store) == before and store.attempts.for_task(waiting.id) == []
    assert store.tasks.get(waiting.id) == written


def test_a_checkpoint_is_fenced_by_its_attempt_and_read_back_until_dropped(
        store: Store) -> None:
    """``ctx.checkpoint``'s write: guarded like the owner's end (its attempt RUNNING, its token
    the task's), the version left alone so that end still matches; an owner that lost the task
    writes nothing; the next attempt reads the last one; ``reactivate --fresh`` drops it."""
    listed = store.tasks.create("t")
    assert store.checkpoints.read(listed.id) is None and listed.checkpoint is None
    task, first = store.claim(listed, 7, "m1")
    fence = Fence(task.id, 7, first.id)
    big = {"cursor": "x" * (CHECKPOINT_LIMIT - 20)}  # just under the limit, on both graphs
    store.checkpoints.commit(fence, first.seq, big)
    info = store.checkpoints.commit(fence, first.seq, {"next": 50, "keys": ["a", "b"]})
    read = store.checkpoints.read(task.id)
    assert read is not None and read.state == {"next": 50, "keys": ["a", "b"]}
    shown = store.tasks.get(task.id)
    assert shown.checkpoint == read.info == info and info.seq == 1
    assert info.size == len('{"keys":["a","b"],"next":50}')
    assert shown.version == task.version  # so the owner's end, guarded by it, still matches
    before = counts(store)
    with pytest.raises(InvalidValue, match="at most 65536 bytes"):
        store.checkpoints.commit(fence, first.seq, {"cursor": "x" * CHECKPOINT_LIMIT})
    with pytest.raises(InvalidValue, match="not JSON"):
        store.checkpoints.commit(fence, first.seq, {"at": object()})
    assert store.checkpoints.read(task.id) == read and counts(store) == before

    # another owner took over (the first was frozen, its lock lost): its token is newer, and
    # the first's checkpoint, however late, is refused and changes nothing
    again, second = store.claim(store.tasks.get(task.id), 8, "m2")
    with pytest.raises((StaleFencingToken, AttemptAlreadyFinished)):
        store.checkpoints.commit(fence, first.seq, {"next": 90})
    assert store.checkpoints.read(task.id) == read
    store.checkpoints.commit(Fence(task.id, 8, second.id), second.seq, {"next": 60})
    failed = store.conclude(Conclusion.of(second, AttemptStatus.FAILED, again,
                                          {"status": TaskStatus.WAITING, "active": False},
                                          error="boom"))
    after = store.checkpoints.read(task.id)
    assert after is not None and after.state == {"next": 60} and after.info.seq == 2
    with pytest.raises(AttemptAlreadyFinished):  # its attempt ended: no checkpoint after it
        store.checkpoints.commit(Fence(task.id, 8, second.id), second.seq, {"next": 70})

    kept = store.tasks.reactivate(task.id)  # the next attempt resumes where the last got to
    assert kept.active and store.checkpoints.read(task.id) == after
    assert kept.checkpoint == after.info and failed.version < kept.version
    store.tasks.deactivate(task.id)
    fresh = store.tasks.reactivate(task.id, fresh=True)
    assert fresh.active and fresh.checkpoint is None and store.tasks.get(task.id) == fresh
    assert store.checkpoints.read(task.id) is None
    running, _ = store.claim(fresh, 9, "m1")
    with pytest.raises(InvalidValue, match="running on m1"):
        store.tasks.reactivate(task.id, fresh=True)
    assert store.tasks.get(task.id) == running


def member(store: Store, wf: str, name: str, deps: tuple[str, ...] = ()) -> NewMember:
    """A member ``name`` of workflow ``wf`` that waits for ``deps`` (a root: for the commit)."""
    task = dataclasses.replace(store.tasks.new("t", {"name": name}), workflow=wf,
                               pending=len(deps), awaits_commit=not deps)
    return NewMember(task, deps)


def test_a_workflow_is_claimable_only_once_committed_and_a_join_once_every_member_succeeded(
        store: Store) -> None:
    """Issue 72's store: a fan-out of three roots and a join written in two pages, a page sent
    again (nothing doubled); nothing claimable before the commit; the commit then the roots'
    activation make the roots claimable and not the join; two successes written together
    (one group commit) release the join by one change of it from 3 to 1; the third, written
    alone, releases it (its ready bucket), and a claim of it made from a read taken while it
    waited is refused."""
    wf = store.workflows.begin("wf-1", "key-1", 4)
    assert (wf.state, wf.members, wf.activated) == (WorkflowState.OPEN, 4, False)
    assert store.workflows.begin("wf-1", "key-1", 4) == wf  # again: as it is
    roots = [member(store, "wf-1", f"r{n}") for n in range(3)]
    join = member(store, "wf-1", "join", tuple(m.task.id for m in roots))
    store.workflows.add("wf-1", roots[:2])
    store.workflows.add("wf-1", roots)  # a resend of the first page, with the rest
    store.workflows.add("wf-1", [join])
    before = counts(store)
    store.workflows.add("wf-1", [join])  # again: nothing is added twice
    assert counts(store) == before and before[1] == 3  # three edges
    assert store.workflows.depends_on([join.task.id]) == {
        join.task.id: sorted(m.task.id for m in roots)}
    listed = {t.id: t for t in store.workflows.members("wf-1")}
    assert len(listed) == 4 and all(not t.open or t.pending or t.awaits_commit
                                    for t in listed.values())
    assert store.tasks.claimed() == [] and not ready_ids(store)
    with pytest.raises(InvalidValue, match="not committed"):
        store.workflows.activate("wf-1")
    with pytest.raises(CommitConflict):
        store.claim(listed[roots[0].task.id], 5, "m1")

    assert store.workflows.commit("wf-1").state is WorkflowState.RUNNING
    assert store.workflows.commit("wf-1").state is WorkflowState.RUNNING  # again: nothing
    assert store.workflows.activate("wf-1") == 3
    assert store.workflows.activate("wf-1") == 0 and store.workflows.get("wf-1").activated
    assert ready_ids(store) == {m.task.id for m in roots}
    waiting_join = store.tasks.get(join.task.id)
    assert waiting_join.pending == 3

    claims = [store.claim(store.tasks.get(m.task.id), 10 + n, "m1")
              for n, m in enumerate(roots)]
    done = store.conclude_many([Conclusion.success(a, t, FINISHED_CHANGE, result=f'"{t.id}"')
                                for t, a in claims[:2]])
    assert all(isinstance(d, Task) and d.finished for d in done)
    after_two = store.tasks.get(join.task.id)
    assert after_two.pending == 1 and after_two.version == waiting_join.version + 1
    assert join.task.id not in ready_ids(store)
    last_task, last_attempt = claims[2]
    store.conclude(Conclusion.success(last_attempt, last_task, FINISHED_CHANGE))
    ready = store.tasks.get(join.task.id)
    assert ready.pending == 0 and ready.open and join.task.id in ready_ids(store)
    with pytest.raises(CommitConflict):  # the read taken while it waited
        store.claim(waiting_join, 20, "m1")
    claimed, _ = store.claim(ready, 20, "m1")
    assert claimed.status is TaskStatus.RUNNING and claimed.pending == 0
    assert store.attempts.results([m.task.id for m in roots]).keys() == {
        claims[0][0].id, claims[1][0].id}


def test_the_masters_round_removes_a_workflow_left_open_and_activates_one_left_half_done(
        store: Store) -> None:
    """A submit cut off before its last page leaves its workflow open: the round removes its
    members and vertex once it is older than OPEN_FOR (not before), and a commit that comes
    during the removal is refused; a workflow committed whose roots were not activated (its
    node killed after the commit) has them activated by the round."""
    from runner.tasks.master.workflows import WorkflowRound

    store.workflows.begin("wf-left", "left", 2)
    left_root = member(store, "wf-left", "a")
    store.workflows.add("wf-left", [left_root, member(store, "wf-left", "b",
                                                      (left_root.task.id,))])
    store.workflows.begin("wf-half", "half", 1)
    half_root = member(store, "wf-half", "r")
    store.workflows.add("wf-half", [half_root])
    store.workflows.commit("wf-half")  # and no activation: its node was killed here
    assert half_root.task.id not in ready_ids(store)

    fresh = WorkflowRound(store, "m1", open_for=3600)
    assert fresh.tick() == (0, 1)  # too young to remove; the half-done one finished
    assert half_root.task.id in ready_ids(store) and store.workflows.get("wf-half").activated
    assert store.workflows.stale(codec.now() - timedelta(hours=1)) == ([], [])
    assert len(store.workflows.members("wf-left")) == 2

    assert WorkflowRound(store, "m1", open_for=0).tick() == (2, 0)
    assert store.workflows.members("wf-left") == []
    with pytest.raises(TaskNotFound):
        store.workflows.get("wf-left")
    assert store.graph.read(lambda g: g.V().has("task_wf", "wf-left").count().next()) == 0
    # begun again by a resend: a new open workflow, nothing of the old one
    assert store.workflows.begin("wf-left", "left", 2).state is WorkflowState.OPEN
    store.graph.write(lambda g: g.V().has("wf_id", "wf-left").property(
        Cardinality.single, "wf_open", WorkflowState.REMOVING.value).iterate())
    assert store.workflows.commit("wf-left").state is WorkflowState.REMOVING  # refused


def test_a_spawned_child_is_fenced_counted_in_the_parents_dependants_and_made_once(
        store: Store) -> None:
    """``ctx.spawn``'s write on both graphs: the child (claimable at once, a ``child_of``
    edge), and each of the parent's dependants one more to wait for (an edge to the child),
    fenced by the parent's attempt; the same key again finds it; a stale parent spawns
    nothing. A member's stop starts the on_failure step once; settle marks a finished
    workflow succeeded; counts and with_unique read what is there."""
    store.workflows.begin("wf-s", "s", 2)
    parent = member(store, "wf-s", "p")
    after = member(store, "wf-s", "a", (parent.task.id,))
    fail_step = dataclasses.replace(store.tasks.new("t", {"step": "on_failure"}),
                                    workflow="wf-s", pending=1, on_failure=True)
    store.workflows.add("wf-s", [parent, after, NewMember(fail_step)])
    store.workflows.commit("wf-s")
    store.workflows.activate("wf-s")
    task, attempt = store.claim(store.tasks.get(parent.task.id), 5, "m1")
    fence = Fence(task.id, 5, attempt.id)
    child = dataclasses.replace(store.tasks.new("t", {"child": 1}), id="child-1")
    made = store.workflows.spawn(fence, task, child)
    assert made.id == "child-1" and made.workflow == "wf-s" and made.open
    assert "child-1" in ready_ids(store)
    waiting = store.tasks.get(after.task.id)
    assert waiting.pending == 2 and sorted(store.workflows.depends_on([after.task.id])[
        after.task.id]) == sorted([parent.task.id, "child-1"])
    before = counts(store)
    assert store.workflows.spawn(fence, task, child).id == "child-1"  # again: found
    assert counts(store) == before and store.tasks.get(after.task.id).pending == 2
    assert [c.id for c in store.workflows.children(parent.task.id)] == ["child-1"]
    store.claim(store.tasks.get(parent.task.id), 6, "m2")  # another owner: fence moved
    with pytest.raises((StaleFencingToken, AttemptAlreadyFinished)):
        store.workflows.spawn(fence, task, dataclasses.replace(child, id="child-2"))
    with pytest.raises(TaskNotFound):  # nothing of it written
        store.tasks.get("child-2")
    assert store.tasks.with_unique(["nope"]) == {}

    # the child stops past its retries: the on_failure step starts, once
    c_task, c_attempt = store.claim(store.tasks.get("child-1"), 9, "m1")
    store.conclude_many([Conclusion.of(c_attempt, AttemptStatus.FAILED, c_task,
                                       task_changes(Outcome.STOPPED), error="boom")])
    started = store.tasks.get(fail_step.id)
    assert started.pending == 0 and started.open and fail_step.id in ready_ids(store)
    assert store.workflows.start_on_failure("wf-s") is False  # once
    assert store.workflows.counts()["running"] >= 1
    assert store.workflows.settle() == []  # members left: not succeeded


def ready_ids(store: Store) -> set[str]:
    """The ids of the tasks in a ready bucket now (any lane)."""
    rows = store.graph.read(lambda g: g.V().has_label("task").value_map(
        "task_id", "task_queue").to_list())
    return {str(r["task_id"][0]) for r in rows if due.is_ready_key(str(r["task_queue"][0]))}


def test_a_result_lands_with_its_succeeded_attempt_only_and_a_stale_owners_never(
        store: Store) -> None:
    """A handler's result rides in the end's guarded write (``attempt_result``): written with
    its SUCCEEDED attempt in the same write (one or several in a batch, each read back by
    ``results``), never with another attempt's end, never by an owner whose attempt was
    closed or whose token was superseded; attempt rows never carry it."""
    big = '{"rows":"' + "x" * (64 * 1024 - 20) + '"}'  # a result at its limit, on both graphs
    tasks = [store.tasks.create("t") for _ in range(3)]
    claims = [store.claim(t, 7 + n, "m1") for n, t in enumerate(tasks)]
    texts = [big, '{"count":3}', '["a","b"]']
    done = store.conclude_many([
        Conclusion.success(a, t, FINISHED_CHANGE, result=text)
        for (t, a), text in zip(claims, texts, strict=True)])
    assert all(isinstance(d, Task) and d.finished for d in done)
    found = store.attempts.results([t.id for t in tasks] + ["no-such-task"])
    assert {k: (v.attempt_id, v.text) for k, v in found.items()} == {
        t.id: (a.id, text) for (t, a), text in zip(claims, texts, strict=True)}
    one = store.attempts.result(tasks[1].id)
    assert one is not None and one.text == '{"count":3}' and one.size == 11
    assert store.attempts.results([]) == {}
    # rows are read without it (a listing of attempts stays small whatever handlers return)
    (row,) = store.attempts.for_task(tasks[0].id)
    assert row.status is AttemptStatus.SUCCEEDED and not hasattr(row, "result")

    # only a success has one; a failed attempt's end refuses one before anything is written
    failing = store.tasks.create("t")
    task, attempt = store.claim(failing, 20, "m1")
    with pytest.raises(InvalidValue, match="FAILED attempt has no result"):
        attempt_end(attempt, AttemptStatus.FAILED, "x", result='{"a":1}')
    store.conclude(Conclusion.of(attempt, AttemptStatus.FAILED, task,
                                 {"status": TaskStatus.WAITING, "active": False}, error="x"))
    assert store.attempts.result(failing.id) is None

    # a stale owner (another claimed it with a newer token) writes no result; the new owner's
    # success does, and a read finds that one alone
    taken = store.tasks.create("t")
    task, stale = store.claim(taken, 30, "m1")
    newer, fresh = store.claim(store.tasks.get(taken.id), 31, "m2")
    with pytest.raises(AttemptAlreadyFinished):
        store.conclude(Conclusion.success(stale, task, FINISHED_CHANGE, result='"stale"'))
    assert store.attempts.result(taken.id) is None
    store.conclude(Conclusion.success(fresh, newer, FINISHED_CHANGE, result='"fresh"'))
    kept = store.attempts.result(taken.id)
    assert kept is not None and (kept.attempt_id, kept.text) == (fresh.id, '"fresh"')
    # closed by the master meanwhile: its owner's success, result and all, is refused
    closed = store.tasks.create("t")
    task, attempt = store.claim(closed, 40, "m1")
    store.close_attempts(closed.id, AttemptStatus.CANCELLED_BY_SYSTEM, "owner left",
                         executor="m1")
    with pytest.raises((AttemptAlreadyFinished, StaleFencingToken)):
        store.conclude(Conclusion.success(attempt, task, FINISHED_CHANGE, result='"late"'))
    assert store.attempts.result(closed.id) is None


def test_claim_and_conclude_write_together_or_say_why(store: Store) -> None:
    """The task loop's two writes: a claim from a listing, and the attempt's end with the
    task's new state. Neither reads first, so the guards decide; what they refuse is left
    unchanged, and the attempt is never lost with a refused task update."""
    listed = store.tasks.create("t")
    task, attempt = store.claim(listed, 7, "m1")
    assert (task.status, task.owner, task.fence, task.version) == (TaskStatus.RUNNING, "m1", 7, 1)
    assert store.tasks.get(listed.id) == task
    assert store.attempts.for_task(listed.id) == [attempt]
    assert (attempt.seq, attempt.status, attempt.fence) == (1, AttemptStatus.RUNNING, 7)
    before = counts(store)
    with pytest.raises(CommitConflict):  # listed before the claim above: stale
        store.claim(listed, 8, "m2")
    with pytest.raises(StaleFencingToken):  # current version, older token
        store.claim(task, 6, "m2")
    assert counts(store) == before and store.tasks.get(listed.id) == task

    done = store.conclude(Conclusion.of(attempt, AttemptStatus.SUCCEEDED, task,
                                        {"status": TaskStatus.WAITING, "finished": True}))
    assert store.tasks.get(listed.id) == done and done.finished and not done.open
    (ended,) = store.attempts.for_task(listed.id)
    assert ended.status is AttemptStatus.SUCCEEDED and ended.ended_at is not None
    assert (ended.error, ended.stack_trace) == (None, None)

    # the task moved on (a plain deactivation) while the token is still its own: the end and
    # the change are written again on the task as it now stands
    other = store.tasks.create("t")
    task, attempt = store.claim(other, 9, "m1")
    moved = store.tasks.deactivate(other.id)
    after = store.conclude(Conclusion.of(attempt, AttemptStatus.FAILED, task,
                                         {"status": TaskStatus.WAITING}, error="boom",
                                         stack="Traceback"))
    (ended,) = store.attempts.for_task(other.id)
    assert (ended.status, ended.error, ended.stack_trace) == (AttemptStatus.FAILED, "boom",
                                                              "Traceback")
    assert store.tasks.get(other.id) == after and after.version == moved.version + 1
    assert not after.active and after.status is TaskStatus.WAITING

    # another owner claimed the task (a newer token): that claim closed the old owner's
    # attempt as superseded, so the old owner's conclude changes nothing and it is told
    taken = store.tasks.create("t")
    task, attempt = store.claim(taken, 20, "m1")
    newer, _ = store.claim(store.tasks.get(taken.id), 21, "m2")
    with pytest.raises(AttemptAlreadyFinished):
        store.conclude(Conclusion.of(attempt, AttemptStatus.SUCCEEDED, task,
                                     {"status": TaskStatus.WAITING, "finished": True}))
    assert store.tasks.get(taken.id) == newer and not newer.finished
    first, second = store.attempts.for_task(taken.id)
    assert first.status is AttemptStatus.CANCELLED_BY_SYSTEM and "superseded" in (first.error
                                                                                   or "")
    assert second.status is AttemptStatus.RUNNING
    # a newer token recorded by a plain update (no claim closed the attempt): the old owner's
    # attempt is closed as superseded, whatever its handler did, and the task is not touched
    later = store.tasks.create("t")
    task, attempt = store.claim(later, 30, "m1")
    newer = store.tasks.update(later.id, task.version, 31, owner="m2")
    with pytest.raises(StaleFencingToken):
        store.conclude(Conclusion.of(attempt, AttemptStatus.SUCCEEDED, task,
                                     {"status": TaskStatus.WAITING, "finished": True}))
    assert store.tasks.get(later.id) == newer
    (superseded,) = store.attempts.for_task(later.id)
    assert superseded.status is AttemptStatus.CANCELLED_BY_SYSTEM

    # the master closed the attempt meanwhile: nothing changes, and the caller is told
    third = store.tasks.create("t")
    task, attempt = store.claim(third, 10, "m1")
    store.attempts.finish(attempt.id, AttemptStatus.CANCELLED_BY_SYSTEM, "owner left")
    with pytest.raises(AttemptAlreadyFinished):
        store.conclude(Conclusion.of(attempt, AttemptStatus.SUCCEEDED, task,
                                     {"status": TaskStatus.WAITING, "finished": True}))
    assert store.tasks.get(third.id) == task
    (closed,) = store.attempts.for_task(third.id)
    assert closed.status is AttemptStatus.CANCELLED_BY_SYSTEM
    assert store.attempts.get(closed.id) == closed

    # both: the master closed the attempt and put the task back (a frozen owner wakes up); the
    # closed attempt is what the owner hears of first, as before
    fourth = store.tasks.create("t")
    task, attempt = store.claim(fourth, 11, "m1")
    back, closed_now = store.close_attempts(fourth.id, AttemptStatus.CANCELLED_BY_SYSTEM,
                                            "owner left", executor="m1")
    assert [a.id for a in closed_now] == [attempt.id]
    with pytest.raises(AttemptAlreadyFinished):
        store.conclude(Conclusion.of(attempt, AttemptStatus.SUCCEEDED, task,
                                     {"status": TaskStatus.WAITING, "finished": True}))
    assert store.tasks.get(fourth.id) == back
    with pytest.raises(TaskNotFound):
        store.attempts.get("no-such-attempt")


def test_closing_the_owners_attempt_moves_the_fence_so_the_owner_can_write_nothing(
        store: Store) -> None:
    """The first-round defect: the master reset a task without moving its fence, and the woken
    owner, told its attempt was closed, re-read the task and finished it with its old token
    (its only attempt CANCELLED_BY_SYSTEM). Every owner write now fails on the moved fence,
    inside the guarded write."""
    listed = store.tasks.create("t")
    store.claim(listed, 40, "m1")
    back, _ = store.close_attempts(listed.id, AttemptStatus.CANCELLED_BY_SYSTEM, "owner left",
                                   executor="m1")
    assert (back.status, back.fence, back.finished) == (TaskStatus.WAITING, 41, False)
    # the woken owner tries everything it could write as itself
    with pytest.raises(StaleFencingToken):
        store.release(listed.id, 40, {"status": TaskStatus.WAITING, "finished": True})
    with pytest.raises(StaleFencingToken):
        store.tasks.update(listed.id, back.version, 40, finished=True)
    with pytest.raises(StaleFencingToken):
        store.claim(back, 40, "m1")  # its conflict retry: a claim with its old token
    with pytest.raises(StaleFencingToken):
        store.fenced_write(Fence(listed.id, 40), lambda g: g.add_v("effect").iterate())
    assert store.tasks.get(listed.id) == back
    assert int(store.graph.read(lambda g: g.V().has_label("effect").count().next())) == 0
    # any later lock holder (a later czxid) still claims it and writes as its owner
    again, second = store.claim(back, 55, "m2")
    store.fenced_write(Fence(listed.id, 55), lambda g: g.add_v("effect").iterate())
    done = store.conclude(Conclusion.of(second, AttemptStatus.SUCCEEDED, again,
                                        {"status": TaskStatus.WAITING, "finished": True}))
    assert done.finished
    assert [a.status for a in store.attempts.for_task(listed.id)] == [
        AttemptStatus.CANCELLED_BY_SYSTEM, AttemptStatus.SUCCEEDED]


def test_a_resource_claimed_by_another_attempt_refuses_the_previous_holders_success(
        store: Store) -> None:
    """Each claim records its attempt as the holder of the task's resources, in the claim's
    write. A holder that lost its ZooKeeper hold (frozen, cut off) and has not learned it yet
    can then record no success, complete nothing and make no fenced write that needs them
    (ResourceTaken, nothing written), while its token is still the task's; a failure or a
    cancel it may still record. A holder that wrote its success before the next claim keeps
    it, and the next claim starts after that end."""
    first = store.tasks.create("t", resources=["ontology:brick", "aspect:geo"])
    second = store.tasks.create("t", resources=["aspect:geo"])
    third = store.tasks.create("t", resources=["ontology:brick"])
    task, attempt = store.claim(first, 7, "m1")
    mine = Fence(task.id, 7, attempt.id, task.resources)
    store.fenced_write(mine, lambda g: g.add_v("effect").iterate())  # still the holder
    # m1's hold on aspect:geo expired meanwhile; the next claimant's lock is newer (tokens are
    # lock czxids: they grow)
    _, other = store.claim(second, 9, "m2")
    finished = {"status": TaskStatus.WAITING, "finished": True}
    with pytest.raises(ResourceTaken) as refused:
        store.conclude(Conclusion.of(attempt, AttemptStatus.SUCCEEDED, task, finished))
    assert refused.value.resource == "aspect:geo" and refused.value.attempt_id == attempt.id
    with pytest.raises(ResourceTaken):
        store.complete(attempt, task, 7, lambda g: g.add_v("effect"))
    with pytest.raises(ResourceTaken):
        store.fenced_write(mine, lambda g: g.add_v("effect").iterate())
    assert int(store.graph.read(lambda g: g.V().has_label("effect").count().next())) == 1
    assert store.attempts.get(attempt.id).status is AttemptStatus.RUNNING
    assert store.tasks.get(first.id) == task
    # a fenced write without the attempt (an older caller) is guarded by the token alone
    store.fenced_write(Fence(task.id, 7), lambda g: g.add_v("effect").iterate())
    back = store.conclude(Conclusion.of(attempt, AttemptStatus.CANCELLED_BY_SYSTEM, task,
                                        {"status": TaskStatus.WAITING}, error="lost its hold"))
    assert not back.finished and store.attempts.get(attempt.id).ended_at is not None
    # the next holder's success stands; a success written before the next claim stands too
    other_task = store.tasks.get(second.id)
    done = store.conclude(Conclusion.of(other, AttemptStatus.SUCCEEDED, other_task, finished))
    assert done.finished
    task3, attempt3 = store.claim(third, 10, "m3")
    store.conclude(Conclusion.of(attempt3, AttemptStatus.SUCCEEDED, task3, finished))
    again, retried = store.claim(back, 11, "m1")
    assert retried.started_at >= store.attempts.get(attempt3.id).ended_at  # type: ignore[operator]
    store.conclude(Conclusion.of(retried, AttemptStatus.SUCCEEDED, again, finished))
    assert store.tasks.get(first.id).finished


def test_a_claim_with_an_older_token_cannot_take_a_resource_from_a_newer_holder(
        store: Store) -> None:
    """Tokens are task-lock czxids, so they grow with time. A claimant whose claim commits
    only after a newer one's (its write was slow, or it lost its session between its hold and
    its write) is refused, nothing written, and the newer holder keeps the resource and its
    success; the same token again (a retry of the same claim's task) is not refused."""
    late = store.tasks.create("t", resources=["aspect:geo"])
    newer = store.tasks.create("t", resources=["aspect:geo"])
    _, attempt = store.claim(newer, 20, "m2")
    with pytest.raises(CommitConflict):
        store.claim(late, 15, "m1")
    assert store.attempts.for_task(late.id) == [] and store.tasks.get(late.id) == late
    store.attempts.finish(attempt.id, AttemptStatus.FAILED, "commit conflict: retried")
    again, retried = store.claim(store.tasks.get(newer.id), 20, "m2")  # the same token
    finished = {"status": TaskStatus.WAITING, "finished": True}
    assert store.conclude(Conclusion.of(retried, AttemptStatus.SUCCEEDED, again,
                                        finished)).finished


def test_an_operator_cancel_closes_the_running_attempt_and_fences_its_owner(
        store: Store) -> None:
    listed = store.tasks.create("t")
    task, attempt = store.claim(listed, 70, "m1")
    stopped, closed = store.cancel(listed.id, "alice@ops")
    assert not stopped.active and stopped.status is TaskStatus.WAITING and stopped.fence == 71
    (ended,) = closed
    assert ended.status is AttemptStatus.CANCELLED and "cancelled by operator alice@ops" in (
        ended.error or "")
    with pytest.raises(AttemptAlreadyFinished):
        store.conclude(Conclusion.of(attempt, AttemptStatus.SUCCEEDED, task,
                                     {"status": TaskStatus.WAITING, "finished": True}))
    assert store.tasks.get(listed.id) == stopped
    # cancelling what is not running only deactivates it; twice changes nothing
    idle = store.tasks.create("t")
    first, none = store.cancel(idle.id, "bob")
    assert none == [] and not first.active and first.fence == 0
    assert store.cancel(idle.id, "bob")[0] == first


def test_stop_unstarted_stops_a_waiting_task_with_its_reason_and_never_a_started_one(
        store: Store) -> None:
    waiting = store.tasks.create("t", unique_key="schedule:s:1")
    stopped = store.tasks.stop_unstarted(waiting.id, "schedule s paused")
    assert stopped is not None and not stopped.active and not stopped.finished
    assert store.tasks.get(waiting.id).stop_reason == "schedule s paused"
    assert store.tasks.stop_unstarted(waiting.id, "again") is None  # stopped already
    assert store.tasks.reactivate(waiting.id).stop_reason is None
    running = store.tasks.create("t")
    store.claim(running, 7, "m1")
    assert store.tasks.stop_unstarted(running.id, "schedule s paused") is None
    assert store.tasks.get(running.id).active
    # interrupted (its attempt closed by the master, the task waiting again): it has started
    store.close_attempts(running.id, AttemptStatus.CANCELLED_BY_SYSTEM, "master: owner gone",
                         executor="m1")
    assert store.tasks.get(running.id).status is TaskStatus.WAITING
    assert store.tasks.stop_unstarted(running.id, "schedule s paused") is None
    assert store.tasks.get(running.id).active


def test_a_claim_of_a_task_left_running_closes_the_old_attempt_in_the_same_write(
        store: Store) -> None:
    listed = store.tasks.create("t")
    task, old = store.claim(listed, 80, "gone")
    taken, new = store.claim(task, 90, "m2")
    first, second = store.attempts.for_task(listed.id)
    assert (first.id, first.status) == (old.id, AttemptStatus.CANCELLED_BY_SYSTEM)
    assert "superseded by m2" in (first.error or "") and second.id == new.id
    assert first.ended_at is not None and first.ended_at <= second.started_at
    assert taken.fence == 90 and store.attempts.running() == [new]


# -- ontologies ---------------------------------------------------------------------------------

BASE = "https://example.org/base#"
EXT = "https://example.org/ext#"


def small_ontologies() -> tuple[Ontology, Ontology]:
    base = Ontology("https://example.org/base", "1", "sum-1", (
        OntologyClass(BASE + "Thing", "Thing"),
        OntologyClass(BASE + "Equipment", "Equipment", (BASE + "Thing",)),
        OntologyClass(BASE + "AHU", "AHU", (BASE + "Equipment",)),
    ))
    ext = Ontology("https://example.org/ext", "1", "sum-x", (
        OntologyClass(EXT + "SmartAHU", "Smart AHU", (BASE + "AHU", EXT + "Smart")),
        OntologyClass(EXT + "Smart", "Smart", (EXT + "Cyclic",)),
        OntologyClass(EXT + "Cyclic", "Cyclic", (EXT + "Smart",)),  # cycles exist in the wild
    ))
    return base, ext


def test_ontology_load_is_idempotent_and_links_across_ontologies(store: Store) -> None:
    base, ext = small_ontologies()
    loaded = store.ontologies.load(ext)  # its parent AHU arrives as a placeholder
    assert loaded.changed and loaded.added_classes == 4 and loaded.added_edges == 4
    store.ontologies.load(base)
    before = counts(store)
    again = store.ontologies.load(ext)
    assert not again.changed and counts(store) == before
    new_checksum = Ontology(ext.iri, "2", "sum-x2", ext.classes)
    assert store.ontologies.load(new_checksum).changed
    assert counts(store) == before  # same content: nothing new
    assert store.ontologies.ancestors(EXT + "SmartAHU") == {
        BASE + "AHU", BASE + "Equipment", BASE + "Thing", EXT + "Smart", EXT + "Cyclic"}
    assert store.ontologies.ancestors(BASE + "Thing") == set()
    records = {o.iri: o for o in store.ontologies.all()}
    assert records[base.iri].class_count == 3  # the placeholder AHU was adopted by base
    assert records[ext.iri].version == "2"
    assert store.ontologies.get("https://example.org/none") is None
    assert (EXT + "SmartAHU", BASE + "AHU") in store.ontologies.subclass_edges()
    assert store.ontologies.classes(base.iri) == sorted(base.classes, key=lambda c: c.iri)
    assert [(c.iri, c.parents) for c in store.ontologies.classes(ext.iri)] == [
        (EXT + "Cyclic", (EXT + "Smart",)), (EXT + "Smart", (EXT + "Cyclic",)),
        (EXT + "SmartAHU", (BASE + "AHU", EXT + "Smart"))]
    assert store.ontologies.classes("https://example.org/none") == []


def test_brick_loads_idempotently_with_correct_ancestors(store: Store) -> None:
    path = BRICK / "1.2" / "Brick.ttl"
    brick = parse_ontology(path)
    result = store.ontologies.load(brick)
    assert result.added_classes >= len(brick.classes)
    before = counts(store)
    assert not store.ontologies.load(parse_ontology(path)).changed
    assert counts(store) == before
    # the oracle: rdflib's own transitive closure over the same file
    rdf = Graph().parse(path)
    for name in ("AHU", "Supply_Air_Temperature_Sensor", "Room", "Chiller"):
        cls = URIRef(f"https://brickschema.org/schema/Brick#{name}")
        expected = {str(o) for o in rdf.transitive_objects(cls, RDFS.subClassOf)
                    if isinstance(o, URIRef) and o != cls}
        assert store.ontologies.ancestors(str(cls)) == expected
        assert expected
    ahu = store.ontologies.ancestors("https://brickschema.org/schema/Brick#AHU")
    assert "https://brickschema.org/schema/Brick#Equipment" in ahu


# -- avatars ------------------------------------------------------------------------------------

def test_aspect_bulk_upsert_is_idempotent_and_removable(store: Store) -> None:
    avatars = [Avatar(f"av{i:04d}", BASE + "AHU", {"lat": 52.0 + i / 1000, "lon": 4.0})
               for i in range(450)]  # more than two batches
    assert store.avatars.upsert(avatars) == 450
    assert store.avatars.upsert(avatars) == 450 and store.avatars.count() == 450
    geo = {a.id: {"type": "Point", "coordinates": [a.properties["lon"], a.properties["lat"]]}
           for a in avatars}
    assert store.avatars.upsert_aspect("geo", {**geo, "missing-avatar": {}}) == 450
    before = counts(store)
    assert store.avatars.upsert_aspect("geo", geo) == 450
    assert counts(store) == before
    got = store.avatars.get("av0007")
    assert got.aspects == {"geo": geo["av0007"]} and got.properties["lon"] == 4.0
    assert store.avatars.remove_aspect("geo", ["av0000", "av0001", "nope"]) == 2
    assert store.avatars.get("av0000").aspects == {}
    assert store.avatars.remove_aspect("geo") == 448
    assert store.avatars.get("av0007").aspects == {}
    with pytest.raises(InvalidValue):
        store.avatars.upsert_aspect("Bad Name", {})


def test_the_export_pages_every_eligible_avatar_once_in_bounded_pages(
        store: Store) -> None:
    """Pages of at most twice the limit, every avatar of the classes once, none of the
    others; resumable from any page's cursor."""
    wanted = [Avatar(f"av{i:05d}", BASE + ("AHU" if i % 3 else "Room"), {"n": i})
              for i in range(1200)]
    store.avatars.upsert(wanted)
    store.avatars.upsert_aspect("geo", {a.id: {"x": 1} for a in wanted[:100]})
    classes = [BASE + "AHU"]
    pages, cursors, after = [], [], None
    while True:
        rows, after = store.avatars.export_page(classes, after, 150)
        pages.append(rows)
        cursors.append(after)
        assert len(rows) <= 2 * 150
        if after is None:
            break
    got = [r for page in pages for r in page]
    assert sorted(r[0] for r in got) == sorted(a.id for a in wanted if int(a.id[2:]) % 3)
    assert len({r[0] for r in got}) == len(got) == 800
    assert all(r[1] == BASE + "AHU" and r[2] == f'{{"n":{int(r[0][2:])}}}' for r in got)
    assert len(pages) > 1
    # from the second page's cursor on, the same rows again
    again, after = [], cursors[0]
    while after is not None:
        rows, after = store.avatars.export_page(classes, after, 150)
        again.extend(rows)
    assert again == [r for page in pages[1:] for r in page]
    assert store.avatars.export_page([], None, 10) == ([], None)


# -- the portable subset ------------------------------------------------------------------------

FORBIDDEN = re.compile(r"\.(merge_v|merge_e|has_not|dedup|range_|group|group_count)\(|"
                       r"P\.(gt|gte|lt|lte|between|inside|outside|neq)\(")


def test_the_store_uses_only_the_portable_subset() -> None:
    """Every query module, gremlin/ included. A comparison on strings that only the remote
    path sends (the export keyset: gremlite answers it with a scan of every string, so the
    embedded path pages by vertex id instead) says so on its line with "remote only"."""
    sources = Path(__file__).resolve().parent.parent / "runner" / "store"
    offenders = [f"{p.name}:{n}: {line.strip()}" for p in sorted(sources.rglob("*.py"))
                 for n, line in enumerate(p.read_text().splitlines(), 1)
                 if FORBIDDEN.search(line) and not line.lstrip().startswith("#")
                 and "remote only" not in line]
    assert offenders == []


def test_gremlite_still_silently_ignores_numeric_comparisons(tmp_path: Path) -> None:
    """Why the subset matters: a numeric P.gt returns nothing instead of failing."""
    from gremlin_python.process.traversal import P

    with open_store(str(tmp_path / "g.db")) as s:
        s.graph.write(lambda g: g.add_v("n").property("x", 5).iterate())
        found = s.graph.read(lambda g: g.V().has("x", P.gt(1)).count().next())
    assert found == 0


# -- a remote server's transactions, or their absence -------------------------------------------

def test_a_server_without_transactions_says_so_in_time_and_a_node_decides(
        gremlin_server: GremlinServer, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """TinkerPop 3.5 never answers a commit on a graph without transactions (TINKERPOP-2751):
    the probe has a deadline and says False instead of hanging. A node refuses such a server
    in one line naming both ways out, accepts it as a server that runs one traversal at a
    time when told (no probe), or with a WARNING when the risk is accepted; the password
    never appears."""
    import time

    from runner import connect
    from runner.config import Settings
    from runner.errors import GraphNotTransactional
    from runner.store.server import probe as server_graph
    from runner.store.server.graph import NONE, RemoteGraph

    graph = RemoteGraph(gremlin_server.url, timeout=10.0)
    try:
        began = time.monotonic()
        assert graph.supports_transactions(deadline=2.0) is False
        assert time.monotonic() - began < 5.0
        assert graph.read(lambda g: g.inject(1).to_list()) == [1]  # the connection still works
    finally:
        graph.close()
    url = gremlin_server.url
    monkeypatch.setattr(server_graph, "TX_PROBE_DEADLINE", 1.0)
    with pytest.raises(GraphNotTransactional) as refused:
        connect.graph_store(Settings(graph=url, graph_username="lw",
                                     graph_password="s3cret-graph"))
    message = str(refused.value)
    assert "graph_serial_server" in message and "allow_untransactional_graph" in message
    assert "s3cret-graph" not in message and "\n" not in message
    with connect.graph_store(Settings(graph=url, graph_serial_server=True)) as serial:
        assert isinstance(serial.graph, RemoteGraph) and serial.graph.atomicity == SERIAL
        assert serial.tasks.create("t").type == "t"
    with connect.graph_store(Settings(graph=url, allow_untransactional_graph=True)) as risky:
        assert isinstance(risky.graph, RemoteGraph) and risky.graph.atomicity == NONE
    assert "no transactions" in caplog.text and "check-then-act" in caplog.text


def test_a_remote_call_is_answered_in_its_callers_thread_and_inside_an_event_loop(
        gremlin_server: GremlinServer) -> None:
    """The store's requests are written and their answers read in the calling thread (the
    driver's hand-overs to its thread pool cost a node a tenth of its CPU): with the pool's
    threads refused, a read of several answer frames comes back whole; a server's error is
    raised and leaves the connection in the pool; a caller inside a running event loop (where
    the transport's own loop cannot run) is answered the driver's way, as it was before (on
    a connection already made: the driver makes one in its caller's thread)."""
    import asyncio

    from gremlin_python.driver.protocol import GremlinServerError

    from runner.store.server.graph import RemoteGraph

    graph = RemoteGraph(gremlin_server.url, atomicity="serial", timeout=10.0)
    try:
        graph.read(lambda g: g.inject(0).to_list())
        client = graph._remote._client
        connections = list(client._pool.queue)
        executors = {id(c._executor): c._executor for c in connections}.values()
        for executor in executors:  # no hand-over: the pool's threads are never asked
            executor.submit = _refused
        # more than one frame (the server sends 64 results a frame)
        assert graph.read(lambda g: g.inject(*range(200)).to_list()) == list(range(200))
        with pytest.raises(GremlinServerError):
            graph.read(lambda g: g.inject("a").math("_ + 1").to_list())
        assert client._pool.qsize() == len(connections)
        assert graph.read(lambda g: g.inject(7).to_list()) == [7]
        for executor in executors:
            del executor.submit
        for connection in connections:  # the driver connects in the caller's thread
            if not connection._inited:
                connection.connect()

        async def inside_a_loop() -> list[int]:
            return graph.read(lambda g: g.inject(1, 2).to_list())
        assert asyncio.run(inside_a_loop()) == [1, 2]
    finally:
        graph.close()


def test_after_a_server_restart_a_read_then_a_write_go_on_new_connections(
        tmp_path: Path) -> None:
    """A server stopped and started again: the first read finds its connection dead and asks
    again on new connections, and the write that follows goes on them too. (A try at reads
    on a pool of their own broke this: the read met a fresh connection, the write a dead
    one; the chaos suite's harness saw it.)"""
    from runner.store.server.graph import RemoteGraph

    server = GremlinServer(tmp_path / "restarted")
    server.start()
    try:
        graph = RemoteGraph(server.url, atomicity="serial", timeout=10.0)
        try:
            for _ in range(10):  # every connection of the write pool made (8)
                graph.write(lambda g: g.V().has("probe_id", "x").drop().iterate())
            graph.write(lambda g: g.add_v("probe").property("probe_id", "x").iterate())
            assert graph.read(lambda g: g.V().has("probe_id", "x").count().next()) == 1
            server.stop()
            server.start()
            assert graph.read(lambda g: g.V().has("probe_id", "x").count().next()) == 1
            graph.write(lambda g: g.add_v("probe").property("probe_id", "y").iterate())
            assert graph.read(lambda g: g.V().has_label("probe").count().next()) == 2
            assert graph._g_read is not graph._g  # reads as GraphSON on the one pool
        finally:
            graph.close()
    finally:
        server.stop()


def test_a_remote_read_decodes_its_answers_as_the_drivers_own_reader_does(
        gremlin_server: GremlinServer) -> None:
    """Reads are answered in GraphSON and decoded by the C JSON parser with a hook per typed
    object: every kind of answer comes back equal to what the driver's own reader makes of
    it, types included (a long stays a long, a map key stays ``T.id``); what the hook does not
    know (a vertex, a double, a date, a set) goes the driver's way whole."""
    from gremlin_python.driver.driver_remote_connection import DriverRemoteConnection
    from gremlin_python.driver.serializer import GraphSONSerializersV3d0
    from gremlin_python.process.anonymous_traversal import traversal
    from gremlin_python.process.graph_traversal import __
    from gremlin_python.statics import long

    from runner.store.server.graph import RemoteGraph

    graph = RemoteGraph(gremlin_server.url, atomicity="serial", timeout=10.0)
    plain = DriverRemoteConnection(gremlin_server.url, "g",
                                   message_serializer=GraphSONSerializersV3d0())
    try:
        # vertices of their own label (the server's graph is shared: its format stays)
        graph.write(lambda g: g.V().has_label("probe").drop().iterate())
        graph.write(lambda g: g.add_v("probe").property("probe_id", "a").property("n", 7)
                    .property("big", long(2 ** 40)).property("task_state", '{"x": [1, "y"]}')
                    .add_v("probe").property("probe_id", "b").property("n", -3).iterate())
        reads = [
            lambda g: g.V().has("probe_id", "a").element_map("probe_id", "n", "big").to_list(),
            lambda g: g.V().has_label("probe").value_map(True).to_list(),
            lambda g: g.V().has_label("probe").values("n").to_list(),
            lambda g: g.V().has_label("probe").count().to_list(),
            lambda g: g.V().has_label("probe").group().by("probe_id")
            .by(__.values("n").fold()).to_list(),
            lambda g: g.inject(1, 1, 2).to_list(),  # bulked traversers
            lambda g: g.V().has("probe_id", "zz").to_list(),  # nothing
            lambda g: g.V().has_label("probe").to_list(),  # vertices: the driver's way
            lambda g: g.inject(1.5, "NaN").to_list(),  # a double: the driver's way
            lambda g: g.V().has_label("probe").values("probe_id").to_set(),
        ]
        source = traversal().with_remote(plain)
        for read in reads:
            fast, slow = graph.read(read), read(source)
            assert _typed(fast) == _typed(slow), (fast, slow)
        assert graph._g_read is not graph._g  # the reads went as GraphSON
    finally:
        graph.write(lambda g: g.V().has_label("probe").drop().iterate())
        plain.close()
        graph.close()


def test_a_server_that_speaks_graphbinary_only_is_read_in_graphbinary(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A Gremlin Server configured without GraphSON 3 answers a GraphSON request in
    GraphBinary: the read connection finds out with its first request and reads in
    GraphBinary from then on (said once, at INFO); the store works on it as on any."""
    import logging

    from runner.store.server.graph import RemoteGraph

    server = GremlinServer(tmp_path / "binary-only", graphson=False)
    server.start()
    try:
        with caplog.at_level(logging.INFO, logger="latchwork.store"):
            graph = RemoteGraph(server.url, atomicity="serial", timeout=10.0)
            store = store_on(graph)
            try:
                task = store.tasks.create("t", {"n": 1})
                assert store.tasks.get(task.id).payload == {"n": 1}
                assert graph.read(lambda g: g.inject(1, 2).to_list()) == [1, 2]
                assert graph._g_read is graph._g
            finally:
                store.close()
        assert caplog.text.count("does not answer GraphSON 3") == 1
    finally:
        server.stop()


def _typed(value: Any) -> Any:
    """``value`` with the type of every part beside it (``1 == 1.0``, a long equals an int)."""
    if isinstance(value, dict):
        return sorted(((_typed(k), _typed(v)) for k, v in value.items()), key=repr)
    if isinstance(value, list | tuple | set):
        parts = [_typed(v) for v in value]
        return (type(value).__name__, sorted(parts, key=repr) if isinstance(value, set)
                else parts)
    return (type(value).__name__, repr(value))


def _refused(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a request went through the driver's thread pool")


if REMOTE_URL:  # only a transactional server has this half; none can be installed here
    def test_a_remote_write_commits_or_rolls_back_as_one_transaction() -> None:
        """A write that fails after its first change leaves nothing (the server rolled the
        transaction back), and the server says it has transactions."""
        from runner.store.server.graph import RemoteGraph
        graph = RemoteGraph(REMOTE_URL or "")
        try:
            assert graph.supports_transactions()
            graph.write(lambda g: g.V().drop().iterate())

            def half(g: object) -> None:
                g.add_v("probe").property("n", 1).iterate()  # type: ignore[attr-defined]
                raise RuntimeError("fails after its first change")

            with pytest.raises(RuntimeError):
                graph.write(half)
            assert graph.read(lambda g: g.V().has_label("probe").count().next()) == 0
        finally:
            graph.close()


@pytest.mark.parametrize("read_at_most", [200, 3])
def test_search_pages_newest_first_by_filters_and_counts_per_state(
        store: Store, read_at_most: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's list (the web console's): equality filters on indexed properties,
    newest first, pages joined by a cursor with nothing lost or repeated, counts per state.
    With buckets read whole only up to 3 tasks, the walk splits the day into hours, minutes
    and seconds, as a burst of thousands does at the real bound."""
    from runner.store.gremlin import search
    from runner.store.gremlin.search import TaskFilter

    monkeypatch.setattr(search, "READ_AT_MOST", read_at_most)

    made = []
    for i in range(23):
        task = store.tasks.create("kind.a" if i % 2 else "kind.b", {"i": i},
                                  ordering_key="k1" if i < 5 else None,
                                  resources=["printer"] if i % 3 == 0 else [])
        made.append(task)
    claimed, _ = store.claim(made[-1], 5, "m1")  # running, owned by m1
    stopped = store.tasks.deactivate(made[-2].id)
    second, _ = store.claim(made[-3], 6, "m2")
    store.tasks.skip(made[-4].id)
    failing, _ = store.claim(made[-5], 7, "m2")  # its owner's end after a failure: failed
    failed = store.release(failing.id, 7, task_changes(Outcome.STOPPED))
    assert failed.stored_state().value == "failed" and stopped.stored_state().value == \
        "cancelled"
    assert store.tasks.get(failed.id).stop is StopCause.FAILED  # read back as written
    newest_first = [t.id for t in reversed(made)]

    def walk(where: TaskFilter, size: int) -> list[str]:
        seen: list[str] = []
        cursor = None
        while True:
            page = store.search.page(where, cursor, size)
            assert len(page.tasks) <= size
            seen += [t.id for t in page.tasks]
            if page.next is None:
                return seen
            cursor = page.next

    assert walk(TaskFilter(), 5) == newest_first
    assert walk(TaskFilter(), 50) == newest_first
    assert walk(TaskFilter(type="kind.a"), 4) == [i for i in newest_first
                                                  if store.tasks.get(i).type == "kind.a"]
    assert walk(TaskFilter(state="running"), 5) == [claimed.id, second.id]
    assert walk(TaskFilter(owner="m1"), 5) == [claimed.id]
    assert walk(TaskFilter(state="failed"), 5) == [failed.id]
    assert walk(TaskFilter(state="cancelled"), 5) == [stopped.id]
    assert walk(TaskFilter(state="stopped"), 5) == [stopped.id, failed.id]  # format 4's word
    assert walk(TaskFilter(state="delayed"), 50) == walk(TaskFilter(state="waiting"), 50)
    assert walk(TaskFilter(state="skipped"), 5) == [made[-4].id]
    assert walk(TaskFilter(ordering_key="k1"), 2) == [t.id for t in reversed(made[:5])]
    assert walk(TaskFilter(resource="printer"), 3) == [
        t.id for t in reversed(made) if t.resources == ("printer",)]
    assert walk(TaskFilter(type="kind.a", resource="nothing"), 5) == []
    # several values: any of them, still one index lookup
    assert walk(TaskFilter(type=("kind.a", "kind.b")), 7) == newest_first
    assert walk(TaskFilter(state=("running", "stopped")), 2) == [
        claimed.id, stopped.id, second.id, failed.id]
    assert walk(TaskFilter(owner=("m1", "m2"), type=("kind.b", "kind.c")), 5) == [
        i for i in (claimed.id, second.id, failed.id) if store.tasks.get(i).type == "kind.b"]
    assert store.search.counts(TaskFilter()) == {
        "waiting": 18, "running": 2, "succeeded": 0, "failed": 1, "cancelled": 1, "skipped": 1}
    assert store.search.counts(TaskFilter(type="kind.b", state="running")) == {
        "waiting": 9, "running": 2, "succeeded": 0, "failed": 1, "cancelled": 0, "skipped": 0}
    with pytest.raises(InvalidValue):
        store.search.page(TaskFilter(), "not a cursor", 5)
    with pytest.raises(InvalidValue):
        TaskFilter(state="lost")
    with pytest.raises(InvalidValue):
        TaskFilter(state=("running", "lost"))


def test_claims_and_ends_of_several_tasks_are_one_write_each_refusal_its_own(
        store: Store) -> None:
    """``claim_many`` and ``conclude_many``: one write (one traversal) for the batch; a task
    that moved on since it was listed, or one whose fence is newer, is refused alone (its
    error in its place, nothing of it written) and the others are written; an end whose
    attempt someone closed, or whose task another owner took, is refused alone too."""
    tasks = [store.tasks.create("t", {"n": n}) for n in range(5)]
    store.tasks.update(tasks[1].id, tasks[1].version, None, priority=3)  # moved on
    tasks[3] = store.tasks.update(tasks[3].id, tasks[3].version, 50)  # a newer owner's fence
    writes = store.graph.stats.snapshot()["writes"]
    claimed = store.claim_many([(t, 20 + n) for n, t in enumerate(tasks)], "m1")
    assert store.graph.stats.snapshot()["writes"] == writes + 1
    assert isinstance(claimed[1], CommitConflict) and isinstance(claimed[3], StaleFencingToken)
    won = [(n, c) for n, c in enumerate(claimed) if isinstance(c, tuple)]
    assert [n for n, _ in won] == [0, 2, 4]
    for n, (task, attempt) in won:
        assert store.tasks.get(task.id) == task and task.status is TaskStatus.RUNNING
        assert (task.fence, task.owner, attempt.seq) == (20 + n, "m1", 1)
        assert store.attempts.for_task(task.id) == [attempt]
    assert store.attempts.for_task(tasks[1].id) == []
    assert store.tasks.get(tasks[3].id).fence == 50
    with pytest.raises(ValueError):
        store.claim_many([(store.tasks.create("r", resources=["printer"]), 1)], "m1")

    (_, (t0, a0)), (_, (t2, a2)), (_, (t4, a4)) = won
    store.attempts.finish(a2.id, AttemptStatus.CANCELLED, "cancelled by an operator")
    store.tasks.update(t4.id, t4.version, 99)  # another owner took it since
    ends = [Conclusion.of(a, AttemptStatus.SUCCEEDED, t, FINISHED_CHANGE)
            for t, a in ((t0, a0), (t2, a2), (t4, a4))]
    writes = store.graph.stats.snapshot()["writes"]
    done = store.conclude_many(ends)
    assert isinstance(done[0], Task) and done[0].finished
    assert store.tasks.get(t0.id) == done[0]  # the task a write returns is the one it wrote
    assert isinstance(done[1], AttemptAlreadyFinished)
    assert isinstance(done[2], StaleFencingToken)
    assert store.attempts.get(a0.id).status is AttemptStatus.SUCCEEDED
    assert store.attempts.get(a2.id).status is AttemptStatus.CANCELLED
    assert store.attempts.get(a4.id).status is AttemptStatus.CANCELLED_BY_SYSTEM  # superseded
    assert not store.tasks.get(t4.id).finished
    assert store.graph.stats.snapshot()["writes"] >= writes + 1
    later = datetime.now(timezone(timedelta(hours=2))) + timedelta(hours=1)  # not in UTC
    moved = store.tasks.update(tasks[1].id, store.tasks.get(tasks[1].id).version, None,
                               run_at=later, owner="", stop_reason="")
    assert moved == store.tasks.get(tasks[1].id) and moved.run_at == later


def test_the_stores_requests_are_written_byte_for_byte_as_the_drivers_writer_writes_them(
        gremlin_server: GremlinServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """``QuickWriter`` writes a remote graph's requests: every traversal the store sends for
    creates, claims, ends, refusals and reads is the very bytes gremlinpython's own GraphBinary
    writer makes of it (checked as it is sent), and so is every value of every type, out of
    its range or unknown to it included (the same bytes, or the same error)."""
    from gremlin_python.process.anonymous_traversal import traversal
    from gremlin_python.process.graph_traversal import __
    from gremlin_python.process.traversal import Cardinality, Order, P, T, TextP
    from gremlin_python.statics import long
    from gremlin_python.structure.io.graphbinaryV1 import GraphBinaryWriter

    from runner.store.server import wire
    from runner.store.server.graph import SKIPPED_STRATEGIES

    driver, sent = GraphBinaryWriter(), []
    quick = wire.QuickWriter._bytecode

    def compared(self: wire.QuickWriter, obj: Any, out: bytearray) -> None:
        start = len(out)
        quick(self, obj, out)
        assert bytes(out[start:]) == bytes(driver.to_dict(obj)), obj
        sent.append(obj)

    monkeypatch.setattr(wire.QuickWriter, "_bytecode", compared)
    store = open_store(gremlin_server.url, atomicity=SERIAL)
    try:
        store.clear()
        test_claims_and_ends_of_several_tasks_are_one_write_each_refusal_its_own(store)
        assert store.tasks.unfinished()
    finally:
        store.clear()
        store.close()
    assert len(sent) > 10

    writer = wire.QuickWriter()
    g = traversal().with_remote(None).without_strategies(*SKIPPED_STRATEGIES)  # type: ignore
    values: list[Any] = [
        g.V().has("a", P.within(["x", "y"])).property(Cardinality.single, "k", long(2 ** 40))
        .property("b", True).property("c", -7).order().by("p", Order.desc)
        .union(__.constant("@f"), __.V().has(T.id, 3).fold()).where(P.gt(1).and_(P.lt(9)))
        .has("z", TextP.containing("q")).inject([1, "é", {"x": None}], None, 1.5, {1, 2}),
        2 ** 31 - 1, -2 ** 31, long(-2 ** 63), False, "", {"k": [T.label, T.id]},
        datetime(2026, 1, 1, tzinfo=UTC)]
    for value in values:
        assert bytes(writer.to_dict(value)) == bytes(driver.to_dict(value)), value
    for value in (2 ** 31, long(2 ** 63)):  # out of range: the driver's error
        with pytest.raises(Exception) as ours:
            writer.to_dict(value)
        with pytest.raises(Exception) as theirs:
            driver.to_dict(value)
        assert type(ours.value) is type(theirs.value)


def test_the_stores_reads_are_written_in_the_json_the_drivers_graphson_writer_makes(
        gremlin_server: GremlinServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """``QuickGraphSON`` writes a remote graph's read requests: every traversal the store
    sends to be answered in GraphSON (the lanes' probe, a lane's seconds, a ready page with
    its shards, versions, a task, the unfinished ones, the reads of claims and ends refused)
    is the very JSON gremlinpython's own GraphSON 3 writer makes of it (checked as it is
    sent), and so is every value of every type, out of its range or unknown to it included."""
    import json

    from gremlin_python.process.anonymous_traversal import traversal
    from gremlin_python.process.graph_traversal import __
    from gremlin_python.process.traversal import Cardinality, Direction, Order, P, T, TextP
    from gremlin_python.statics import long
    from gremlin_python.structure.io.graphsonV3d0 import GraphSONWriter

    from runner.store import due
    from runner.store.server import wire
    from runner.store.server.graph import SKIPPED_STRATEGIES

    driver, sent = GraphSONWriter(), []
    quick = wire.QuickGraphSON._bytecode

    def compared(self: wire.QuickGraphSON, obj: Any) -> Any:
        out = quick(self, obj)
        assert json.dumps(out) == json.dumps(driver.to_dict(obj)), obj
        sent.append(obj)
        return out

    monkeypatch.setattr(wire.QuickGraphSON, "_bytecode", compared)
    store = open_store(gremlin_server.url, atomicity=SERIAL)
    try:
        store.clear()
        made = [store.tasks.create("t", {"n": n}, priority=n % 2) for n in range(4)]
        lanes = store.tasks.lanes()
        assert lanes
        seconds = store.tasks.lane_seconds(lanes[0])
        page = store.tasks.ready_page(lanes[0], seconds, 10, shards=due.shards_of(0, 1))
        assert {t.id for t in page} <= {t.id for t in made} and page
        assert set(store.tasks.versions([t.id for t in made])) == {t.id for t in made}
        assert store.tasks.get(made[0].id).id == made[0].id
        assert len(store.tasks.unfinished()) == 4
        store.clear()
        test_claims_and_ends_of_several_tasks_are_one_write_each_refusal_its_own(store)
    finally:
        store.clear()
        store.close()
    assert len(sent) > 10

    writer = wire.QuickGraphSON()
    g = traversal().with_remote(None).without_strategies(*SKIPPED_STRATEGIES)  # type: ignore
    values: list[Any] = [
        g.V().has("a", P.within(["x", "y"])).property(Cardinality.single, "k", long(2 ** 40))
        .property("b", True).property("c", -7).order().by("p", Order.desc).to_e(Direction.OUT)
        .union(__.constant("@f"), __.V().has(T.id, 3).fold()).where(P.gt(1).and_(P.lt(9)))
        .has("z", TextP.containing("q")).inject([1, "é", {"x": None}], None, 1.5, {1, 2}),
        2 ** 31 - 1, -2 ** 31, 2 ** 31, long(-2 ** 63), long(2 ** 63), 2 ** 70, False, "",
        None, {"k": [T.label, T.id]}, datetime(2026, 1, 1, tzinfo=UTC)]
    for value in values:
        assert json.dumps(writer.to_dict(value)) == json.dumps(driver.to_dict(value)), value


def test_steps_appended_directly_are_the_steps_gremlinpython_adds() -> None:
    """``set_props``, ``add_vertex`` and ``has_all`` append plain steps to the bytecode
    themselves: what they build equals what gremlinpython's step methods build, for every
    kind of value (a list, a dict, a traversal, a binding go through the step methods)."""
    from gremlin_python.process.anonymous_traversal import traversal
    from gremlin_python.process.graph_traversal import __
    from gremlin_python.process.traversal import Binding, Cardinality, T
    from gremlin_python.statics import long

    from runner.store.gremlin.steps import add_vertex, has_all, set_props

    values: dict[str, Any] = {"s": "x", "i": 3, "l": long(2 ** 40), "b": False, "f": 1.5,
                              "n": None, "list": [1, __.V()], "d": {"k": 1},
                              "t": __.constant(1), "bind": Binding("x", 2), "e": T.id}
    g = traversal().with_remote(None)  # type: ignore[arg-type]  # built, never run
    ours = set_props(add_vertex(g, "v", values).as_("a"), values)
    theirs = g.add_v("v")
    for key, value in values.items():
        theirs = theirs.property(key, value)
    theirs = theirs.as_("a")
    for key, value in values.items():
        theirs = theirs.property(Cardinality.single, key, value)
    assert ours.bytecode == theirs.bytecode and ours.bytecode.bindings == \
        theirs.bytecode.bindings
    pairs = list(values.items())
    built = g.V()
    for key, value in pairs:
        built = built.has(key, value)
    assert has_all(g.V(), *pairs).bytecode == built.bytecode


def _create_waiting(store: Store, count: int, priority: int = 0,
                    at: datetime | None = None) -> list[str]:
    """``count`` WAITING tasks in one write, each ready at its own second from ``at`` on."""
    from runner.store.gremlin.rows import task_props
    from runner.store.gremlin.steps import add_vertex

    start = at or codec.now() - timedelta(hours=2)
    made = []
    for first in range(0, count, 200):
        def write(g: Any, first: int = first) -> None:
            for n in range(first, min(first + 200, count)):
                task = store.tasks.new("t", {"n": n}, priority=priority)
                when = start + timedelta(seconds=n)
                task = dataclasses.replace(task, created_at=when, updated_at=when)
                add_vertex(g, "task", task_props(task)).iterate()
                made.append(task.id)
        store.graph.write(write)
    return made


def test_the_ready_scan_reads_a_page_whatever_the_backlog(store: Store) -> None:
    """The task loop's listing (``ReadyScan``): the highest lane first, in it the oldest
    ready seconds first, a page of a size asked for; its reads do not grow with the tasks that
    wait (300 then 3,000 waiting: the same number of reads for a page); a claimed task leaves
    the ready buckets (``claimed()`` has it) and one put back is ready again at the moment it
    was put back."""
    from runner.tasks.worker.ready import ReadyScan

    old = _create_waiting(store, 300)
    urgent = _create_waiting(store, 3, priority=5, at=codec.now() - timedelta(minutes=1))
    scan = ReadyScan(store.tasks)
    before = store.graph.stats.snapshot()["reads"]
    page = scan.read(20)
    small = store.graph.stats.snapshot()["reads"] - before
    assert [t.id for t in page[:3]] == urgent  # its lane first
    assert [t.id for t in page[3:]] == old[:17]  # then the oldest
    _create_waiting(store, 2700, at=codec.now() - timedelta(hours=1))
    before = store.graph.stats.snapshot()["reads"]
    again = ReadyScan(store.tasks).read(20)
    big = store.graph.stats.snapshot()["reads"] - before
    assert [t.id for t in again] == urgent + old[:17]
    assert big <= small + 1, (small, big)
    before = store.graph.stats.snapshot()["reads"]
    assert [t.id for t in scan.read(20)] == urgent + old[:17]  # the cursors kept: fewer reads
    assert store.graph.stats.snapshot()["reads"] - before <= small

    first = store.tasks.get(old[0])
    store.claim(first, 7, "m1")
    assert [t.id for t in store.tasks.claimed()] == [first.id]
    assert first.id not in [t.id for t in ReadyScan(store.tasks).read(25)]
    put_back = codec.now()
    back = store.release(first.id, 7, {"status": TaskStatus.WAITING})
    assert back.status is TaskStatus.WAITING and store.tasks.claimed() == []
    (queue,) = store.graph.read(lambda g: g.V().has("task_id", first.id)
                                .values("task_queue").to_list())
    assert queue.startswith("r09:") and queue[4:] >= due.second(put_back)  # ready again now


def test_an_own_read_finds_only_the_members_shards_and_moves_no_cursor(
        store: Store) -> None:
    """A node's own read (``shards``): only its shards' tasks, the oldest first, on every graph
    (a filter after the index lookup, each window's lookup still limited); a window it reads
    empty keeps the cursor (the others' tasks there are not seen), and the full read after it
    still finds the oldest task of all."""
    from runner.tasks.worker.ready import ReadyScan

    start = codec.now() - timedelta(hours=2)  # one start: a second boundary may pass meanwhile
    made = _create_waiting(store, 120, at=start)
    mine = due.shards_of(0, 3)
    own = [t for t in made if due.shard_of(t) in mine]
    assert 0 < len(own) < len(made)
    row = store.graph.read(lambda g: g.V().has("task_id", made[0]).element_map().to_list())[0]
    assert row["task_shard"] == due.shard_of(made[0])  # written when the task is made
    assert due.preferred_index(made[0], 3) == int(due.shard_of(made[0])) % 3
    page = store.tasks.ready_page(due.lane_of(0), [due.second(start + timedelta(seconds=n))
                                                   for n in range(120)], 500, mine)
    assert sorted(t.id for t in page) == sorted(own)
    scan = ReadyScan(store.tasks)
    assert [t.id for t in scan.read(5, shards=mine)] == own[:5]
    for task_id in own:  # this member's run out: its windows read empty from now
        store.claim(store.tasks.get(task_id), 7, "m1")
    cursor = scan.cursors[due.lane_of(0)][0]
    assert scan.read(5, shards=mine) == []
    assert scan.cursors[due.lane_of(0)][0] == cursor  # an own read moved no cursor
    others = [t for t in made if t not in own]
    assert [t.id for t in scan.read(5)] == others[:5]  # the full read: the oldest of all


def test_a_node_starts_a_lane_at_its_shared_floor_and_reads_behind_it_for_late_writes(
        store: Store, zk_namespace: ZkNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lanes' floors in ZooKeeper (real server): the first node with no floor reads the
    lane once (every waiting task's queue) and writes the floor; a node that starts later
    begins at the floor, with no read of the whole lane, and lists the same oldest tasks. A
    task written late, behind every cursor (a clock behind), is found by the read behind the
    cursor after ``REFIND``, which moves the floor back; a lane that empties moves its cursor
    to now; with ZooKeeper out of reach the node reads the lane itself."""
    from runner.tasks import due as task_due
    from runner.tasks.worker import ready
    from runner.tasks.worker.ready import ReadyScan

    waiting = _create_waiting(store, 400, at=codec.now() - timedelta(minutes=30))
    with Session(zk_namespace.hosts, "c1", timeout=4.0) as one, \
            Session(zk_namespace.hosts, "c1", timeout=4.0) as two:  # two nodes, one cluster
        first = ReadyScan(store.tasks, task_due.LaneFloors(one))
        assert [t.id for t in first.read(10)] == waiting[:10]
        assert first.lane_reads == 1
        floor = task_due.LaneFloors(two).get("r09")
        assert floor is not None and due.second(floor) == due.second(
            store.tasks.get(waiting[0]).created_at)
        for task_id in waiting[:300]:  # the oldest run and finish: the walks move on
            store.graph.write(lambda g, i=task_id: g.V().has("task_id", i).property(
                "task_queue", "closed").property("task_lane", "").iterate())
        monkeypatch.setattr(ready, "PUBLISH_EVERY", 0.0)
        assert [t.id for t in first.read(10)] == waiting[300:310]
        moved = task_due.LaneFloors(two).get("r09")
        assert moved is not None and moved > floor  # the floor followed the cursor

        second = ReadyScan(store.tasks, task_due.LaneFloors(two))
        assert [t.id for t in second.read(10)] == waiting[300:310]
        assert second.lane_reads == 0  # started at the floor

        late = dataclasses.replace(store.tasks.new("t", {"late": True}),
                                   created_at=moved - timedelta(minutes=5),
                                   updated_at=moved - timedelta(minutes=5))
        from runner.store.gremlin.rows import task_props
        from runner.store.gremlin.steps import add_vertex
        store.graph.write(lambda g: add_vertex(g, "task", task_props(late)).iterate())
        assert late.id not in [t.id for t in second.read(10)]  # behind the cursor
        monkeypatch.setattr(ready, "REFIND", 0.0)
        assert second.read(10)[0].id == late.id  # the read behind found it
        back = task_due.LaneFloors(one).get("r09")
        assert back is not None and back <= late.created_at
        assert second.lane_reads == 0

        for task_id in [late.id, *waiting[300:]]:
            store.graph.write(lambda g, i=task_id: g.V().has("task_id", i).property(
                "task_queue", "closed").property("task_lane", "").iterate())
        before = codec.now()
        assert second.read(10) == []  # its walk finds the lane empty...
        assert second.read(10) == []  # ...and the next listing asks about it again
        # an empty lane: its cursor at now (but the seconds left for writes under way)
        assert second.cursors["r09"][0] >= before - timedelta(seconds=ready.LAG)

    fresh = store.tasks.add(store.tasks.new("t", {}))
    with Session(zk_namespace.hosts, "c1", timeout=4.0) as three:
        floors = task_due.LaneFloors(three)
    blind = ReadyScan(store.tasks, floors)  # its session closed: no floor can be read
    assert [t.id for t in blind.read(10)] == [fresh.id] and blind.lane_reads == 1


def test_a_walk_crosses_hours_without_tasks_in_a_few_reads_and_keeps_the_order(
        store: Store) -> None:
    """A lane's cursor three hours before its first task (a cluster stopped for hours, then a
    backlog): the walk crosses the gap in wider and wider windows (no read of the whole lane),
    and the dense second where the tasks begin is read again narrow, so the oldest come first;
    the cursor ends past the gap."""
    from runner.tasks.worker.ready import ReadyScan

    waiting = _create_waiting(store, 200, at=codec.now() - timedelta(minutes=20))
    scan = ReadyScan(store.tasks)
    gap_start = codec.now() - timedelta(hours=3, minutes=20)
    scan.cursors["r09"] = (gap_start, time.monotonic())
    page = scan.read(10)
    assert [t.id for t in page] == waiting[:10]
    assert scan.lane_reads == 0 and scan.reads <= 24
    assert scan.cursors["r09"][0] > gap_start + timedelta(hours=2, minutes=50)


def test_a_lane_whose_oldest_task_is_due_later_still_reads_a_task_written_now(
        store: Store) -> None:
    """A lane whose oldest waiting task is due in 40 s, walked first by a node with no floor
    (a new cluster), or with a floor that an older node moved to that second: the cursor
    stays at now less ``LAG``, so a task written now, with no rewind, is read by the next
    walk (a cursor put at the due task's second left a task written now to the backstop's
    read, 300 s later)."""
    from runner.tasks.worker.ready import LAG, ReadyScan

    soon = store.tasks.create("t", run_at=codec.now() + timedelta(seconds=40))

    class Ahead:
        def get(self, lane: str) -> datetime | None:
            return soon.run_at

        def move(self, lane: str, at: datetime, *, back: bool = False) -> None:
            pass

    fresh, floored = ReadyScan(store.tasks), ReadyScan(store.tasks, Ahead())
    for scan in (fresh, floored):
        assert [t.id for t in scan.read(5)] == [soon.id]
        assert scan.cursors["r09"][0] <= codec.now() - timedelta(seconds=LAG)
    now = store.tasks.create("t")
    for scan in (fresh, floored):
        assert [t.id for t in scan.read(5)] == [now.id, soon.id]


def test_a_write_that_lands_seconds_behind_the_cursor_is_read_within_a_second(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task whose ready second is 3 s behind a lane's cursor (a write that took that long to
    land, a clock 3 s behind): the walks that start ``SKEW`` before the cursor, one every
    ``SKEW_EVERY`` seconds, read it."""
    from runner.tasks.worker import ready
    from runner.tasks.worker.ready import ReadyScan

    monkeypatch.setattr(ready, "SKEW_EVERY", 0.3)
    scan = ReadyScan(store.tasks)
    now, late = _a_task_read_then_one_written_behind(store, scan, seconds=3)
    time.sleep(0.3)
    assert {t.id for t in scan.read(5)} == {now.id, late.id}


def test_a_write_that_landed_long_behind_the_cursor_is_read_once_its_writer_says_so(
        store: Store) -> None:
    """A task whose ready second is 20 s behind a lane's cursor (its writer paused after it
    stamped it, as a SIGSTOP of the node writing a bulk page does): no walk reaches back that
    far (``SKEW``); once the writer says where its tasks are ready from (``rewind``: what a
    TRIGGER_SCAN with ``behind`` does), the next read starts there and finds it, and the
    lane's shared floor moves back with it."""
    from runner.tasks.worker.ready import ReadyScan

    class Floors:
        def __init__(self) -> None:
            self.moved: list[tuple[str, datetime, bool]] = []

        def get(self, lane: str) -> datetime | None:
            return None

        def move(self, lane: str, at: datetime, *, back: bool = False) -> None:
            self.moved.append((lane, at, back))

    floors = Floors()
    scan = ReadyScan(store.tasks, floors)
    now, late = _a_task_read_then_one_written_behind(store, scan, seconds=20)
    when = late.created_at
    assert [t.id for t in scan.read(5)] == [now.id]  # too far behind for any walk
    scan.rewind(when + timedelta(seconds=30))  # ahead of the cursor: nothing moves
    assert [t.id for t in scan.read(5)] == [now.id]
    scan.rewind(when)
    assert {t.id for t in scan.read(5)} == {now.id, late.id}
    assert ("r09", when, True) in floors.moved


def _a_task_read_then_one_written_behind(store: Store, scan: Any, seconds: float
                                         ) -> tuple[Task, Task]:
    """A task that ``scan`` reads (its lane's cursor at it), then one written with its ready
    second ``seconds`` behind that cursor, as a write that landed late leaves it."""
    from runner.store.gremlin.rows import task_props
    from runner.store.gremlin.steps import add_vertex

    now = store.tasks.add(store.tasks.new("t", {}))
    assert [t.id for t in scan.read(5)] == [now.id]
    when = scan.cursors["r09"][0] - timedelta(seconds=seconds)
    late = dataclasses.replace(store.tasks.new("t", {}), created_at=when, updated_at=when)
    store.graph.write(lambda g: add_vertex(g, "task", task_props(late)).iterate())
    return now, late


def test_a_lane_whose_walk_found_tasks_is_not_asked_about_again(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Which lanes hold tasks, asked of the lanes whose last walk found none only (on
    TinkerGraph a lookup of a lane's tasks costs as many as it holds): a listing after one that
    found tasks in ``r09`` asks about the 18 others; ``lanes(among)`` answers for those."""
    from runner.tasks.worker.ready import ReadyScan

    waiting = _create_waiting(store, 30, at=codec.now() - timedelta(minutes=2))
    assert store.tasks.lanes() == ["r09"] and store.tasks.lanes(["r00", "r09"]) == ["r09"]
    assert store.tasks.lanes(["r00"]) == [] and store.tasks.lanes([]) == []
    asked: list[list[str] | None] = []
    lanes = store.tasks.lanes

    def spy(among: list[str] | None = None) -> list[str]:
        asked.append(among)
        return lanes(among)
    monkeypatch.setattr(store.tasks, "lanes", spy)
    scan = ReadyScan(store.tasks)
    assert [t.id for t in scan.read(5)] == waiting[:5]
    assert [t.id for t in scan.read(5)] == waiting[:5]
    assert asked[0] is not None and "r09" in asked[0]
    assert asked[1] is not None and "r09" not in asked[1] and len(asked[1]) == 18


def test_a_graph_that_lost_its_format_vertex_under_a_node_still_lists_and_takes_tasks(
        store: Store) -> None:
    """The lanes' probe stands on the format vertex (gremlite has no ``inject``). A graph
    emptied under running nodes (an in-memory Gremlin Server killed and started again) has
    none: every lane asked about is then walked, and a task written since is listed (before,
    the probe said no lane held a task, and such a task never started:
    tests/test_graph_server.py's killed server, now and then)."""
    from runner.store.format import FORMAT_KEY, FORMAT_KEY_VALUE
    from runner.tasks.worker.ready import ReadyScan

    scan = ReadyScan(store.tasks)
    assert scan.read(5) == []
    store.graph.write(lambda g: g.V().has(FORMAT_KEY, FORMAT_KEY_VALUE).drop().iterate())
    try:
        assert set(store.tasks.lanes(["r00", "r09"])) == {"r00", "r09"}
        task = store.tasks.add(store.tasks.new("t", {}))
        assert [t.id for t in scan.read(5)] == [task.id]
        # a submit's writes do not stand on it either (before, a submit sent WAITING and a
        # bulk submit wrote nothing there and failed: "a bulk create wrote 0 of 1 tasks")
        plain, keyed, again = (store.tasks.new("t", {"n": 1}),
                               store.tasks.new("t", {"n": 2}, unique_key="k"),
                               store.tasks.new("t", {"n": 3}))
        assert [t.id for t in store.tasks.add_many([plain, keyed])] == [plain.id, keyed.id]
        assert [t.id for t in store.tasks.add_many([again], again=True)] == [again.id]
        assert store.tasks.add_many([again], again=True) == [store.tasks.get(again.id)]
        claimed = store.tasks.new("t", {"n": 4})
        assert store.create_claimed_again(claimed, 7, "m1") is not None
        assert {t.id for t in store.tasks.all()} == {task.id, plain.id, keyed.id, again.id,
                                                     claimed.id}
    finally:
        store.clear()  # the format stamped again: the server's graph is the next test's


def test_a_task_due_in_the_past_is_ready_from_when_it_is_written(store: Store) -> None:
    """A task submitted with a ``run_at`` long past, while a node's walk of its lane is under
    way (the cursor at the lane's tasks of now): it is read with them, not left behind the
    cursor until the lane's cursor is found again (minutes)."""
    from runner.tasks.worker.ready import ReadyScan

    scan = ReadyScan(store.tasks)
    now = store.tasks.add(store.tasks.new("t", {}))
    assert [t.id for t in scan.read(5)] == [now.id]
    late = store.tasks.add(store.tasks.new("t", {}, run_at=codec.now() - timedelta(days=1)))
    assert {t.id for t in scan.read(5)} == {now.id, late.id}


def test_tasks_that_cannot_start_do_not_stop_the_tasks_behind_them(store: Store) -> None:
    """A lane led by 150 tasks of one ordering key (only the first may run) and a type no node
    here has: a listing walks past them to the plain tasks behind, a few reads."""
    from runner.tasks.worker.ready import ReadyScan

    start = codec.now() - timedelta(minutes=10)
    keyed, foreign, plain = [], [], []
    for n in range(160):
        when = start + timedelta(seconds=n // 20)  # 20 a second: dense, as a burst
        kind, key = ("k.t", "k1") if n < 150 else ("foreign.t", None)
        task = dataclasses.replace(store.tasks.new(kind, {}, ordering_key=key),
                                   created_at=when, updated_at=when)
        (keyed if key else foreign).append(store.tasks.add(task).id)
    for _ in range(5):
        plain.append(store.tasks.add(dataclasses.replace(
            store.tasks.new("k.t", {}), created_at=start + timedelta(seconds=30),
            updated_at=start + timedelta(seconds=30))).id)
    keys: set[str] = set()

    def startable(task: Any) -> bool:
        if task.type == "foreign.t":
            return False
        if task.ordering_key is not None:
            if task.ordering_key in keys:
                return False
            keys.add(task.ordering_key)
        return True

    scan = ReadyScan(store.tasks)
    page = scan.read(10, startable)
    assert len([t for t in page if t.id in keyed]) == 1  # the key's first as read
    assert set(plain) <= {t.id for t in page} and not set(foreign) & {t.id for t in page}
    assert len(page) == 6 and scan.reads < 40
