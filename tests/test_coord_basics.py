"""coord recipes against a real ZooKeeper: lifecycle, ownership, tokens, session loss."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from coord import (
    LeaderLatch,
    LifecycleError,
    LockBatch,
    LockNotHeld,
    MemberIdTaken,
    Membership,
    NotLeader,
    Session,
    SessionState,
    TaskLock,
    VersionConflict,
    VersionedRegister,
    force_release,
    held_locks,
    lock_owner,
    markers,
    read_leader,
    stamp_path,
)
from coord.testing import expire_session, lose_first_reply, lose_first_set_reply, wait_until
from coord.testing.plugin import ZkNamespace


@pytest.fixture
def session(zk_namespace: ZkNamespace) -> Iterator[Session]:
    with Session(zk_namespace.hosts, "c1", timeout=2.0) as s:
        yield s


def other_session(zk_namespace: ZkNamespace) -> Session:
    return Session(zk_namespace.hosts, "c1", timeout=2.0).start()


def test_session_lifecycle_chroot_and_negotiated_timeout(zk_namespace: ZkNamespace) -> None:
    s = Session(zk_namespace.hosts, "c1", timeout=2.0)
    with pytest.raises(LifecycleError):
        _ = s.client
    s.start()
    try:
        with pytest.raises(LifecycleError):
            s.start()
        assert s.state is SessionState.CONNECTED
        assert s.negotiated_timeout == 2.0
        s.client.create("/probe", b"x")
        raw = KazooClient(hosts=zk_namespace.hosts)
        raw.start()
        assert raw.get("/latchwork/c1/probe")[0] == b"x"
        raw.stop()
        raw.close()
    finally:
        s.close()
    assert s.state is SessionState.LOST


def test_session_digest_auth_protects_every_node(zk_namespace: ZkNamespace) -> None:
    from kazoo.exceptions import NoAuthError
    with Session(zk_namespace.hosts, "secure", timeout=2.0, auth="svc:pw") as s:
        s.client.create("/guarded", b"secret")
        intruder = KazooClient(hosts=zk_namespace.hosts + "/latchwork/secure")
        intruder.start()
        try:
            with pytest.raises(NoAuthError):
                intruder.get("/guarded")
        finally:
            intruder.stop()
            intruder.close()
    owner = KazooClient(hosts=zk_namespace.hosts, auth_data=[("digest", "svc:pw")])
    owner.start()
    owner.delete("/latchwork", recursive=True)  # every node we made is guarded, /latchwork too
    owner.stop()
    owner.close()


def test_listeners_see_suspended_and_lost_on_expiry_and_may_do_io(session: Session) -> None:
    seen: list[tuple[SessionState, bool]] = []
    connected_again = threading.Event()

    def listener(state: SessionState) -> None:
        # blocking ZooKeeper I/O is allowed here: this runs on the session's own thread
        seen.append((state, session.client.exists("/") is not None
                     if state is SessionState.CONNECTED else False))
        if state is SessionState.CONNECTED:
            connected_again.set()

    session.add_listener(listener)
    first = session.session_id
    expire_session(session.client)
    assert connected_again.wait(10)
    states = [state for state, _ in seen]
    assert SessionState.LOST in states
    assert states[-1] is SessionState.CONNECTED and seen[-1][1] is True
    assert session.session_id != first


def test_membership_join_leave_and_reregistration(zk_namespace: ZkNamespace,
                                                  session: Session) -> None:
    joined: list[str] = []
    left: list[str] = []
    observer = Membership(session, "observer:1:aaaa").start()
    observer.add_listener(joined.append, left.append)
    other = other_session(zk_namespace)
    member = Membership(other, "node-b:2:bbbb").start()
    try:
        deadline = time.monotonic() + 5
        while "node-b:2:bbbb" not in joined and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "node-b:2:bbbb" in joined
        assert observer.live_ids() == {"observer:1:aaaa", "node-b:2:bbbb"}
        info = observer.members()["node-b:2:bbbb"]
        assert info.host == "node-b" and info.pid > 0 and info.version
        with pytest.raises(MemberIdTaken):
            Membership(session, "node-b:2:bbbb").start()
        expire_session(other.client)
        assert other.wait_for(SessionState.CONNECTED, 10)
        deadline = time.monotonic() + 5
        while not observer.is_alive("node-b:2:bbbb") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert observer.is_alive("node-b:2:bbbb"), "not registered again after a new session"
        assert "node-b:2:bbbb" in left
    finally:
        member.close()
        other.close()
    assert not observer.is_alive("node-b:2:bbbb")
    deadline = time.monotonic() + 5
    while observer.live_ids() != {"observer:1:aaaa"} and time.monotonic() < deadline:
        time.sleep(0.02)
    assert observer.live_ids() == {"observer:1:aaaa"}  # the watch saw the leave


def test_leader_latch_handover_on_close_and_readable_by_anyone(
        zk_namespace: ZkNamespace, session: Session) -> None:
    s2 = other_session(zk_namespace)
    reader = other_session(zk_namespace)
    gained = threading.Event()
    a = LeaderLatch(session, "a").start()
    assert a.await_leadership(5)  # start() is asynchronous: let "a" lead before "b" joins
    b = LeaderLatch(s2, "b")
    b.add_listener(on_gain=gained.set)
    b.start()
    try:
        assert a.check_leadership() and not b.is_leader
        with pytest.raises(NotLeader):
            b.require_leadership()
        assert read_leader(reader) == "a" == b.leader_id()
        with pytest.raises(LifecycleError):
            a.start()
        started = time.monotonic()
        a.close()
        assert gained.wait(5)
        assert time.monotonic() - started < 1.0
        assert b.check_leadership()
        assert read_leader(reader) == "b"
    finally:
        b.close()
        s2.close()
        reader.close()


def test_latch_drops_leadership_on_lost_and_rejoins(session: Session) -> None:
    lost = threading.Event()
    latch = LeaderLatch(session, "solo")
    latch.add_listener(on_loss=lost.set)
    latch.start()
    try:
        assert latch.await_leadership(5)
        expire_session(session.client)
        assert lost.wait(5)
        assert latch.await_leadership(10), "did not rejoin after a new session"
        assert latch.check_leadership()
    finally:
        latch.close()


def test_kazoo_records_reach_handlers_only_at_kazoos_configured_level(
        zk_namespace: ZkNamespace) -> None:
    """The session reads the negotiated timeout from kazoo's BLATHER record, yet kazoo's
    per-request narration is dropped before a record is built unless ``kazoo.client`` asks
    for it."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    kazoo_log = logging.getLogger("kazoo.client")
    handler, level = Keep(logging.NOTSET), kazoo_log.level
    kazoo_log.addHandler(handler)
    try:
        kazoo_log.setLevel(logging.WARNING)
        with Session(zk_namespace.hosts, "c1", timeout=3.0) as s:
            s.client.exists("/")
            assert s.negotiated_timeout == 3.0  # read from a record nobody asked for
        assert [r for r in records if r.levelno < logging.WARNING] == []
        kazoo_log.setLevel(logging.DEBUG)
        with Session(zk_namespace.hosts, "c1", timeout=2.0) as s:
            s.client.exists("/")
            assert s.negotiated_timeout == 2.0
        assert any(r.levelno == logging.DEBUG for r in records)
    finally:
        kazoo_log.removeHandler(handler)
        kazoo_log.setLevel(level)


def test_task_lock_owner_tokens_release_and_no_leftovers(zk_namespace: ZkNamespace,
                                                         session: Session) -> None:
    s2 = other_session(zk_namespace)
    try:
        a = TaskLock(session, "task-1", "member-a")
        b = TaskLock(s2, "task-1", "member-b")
        t1 = a.try_acquire()
        assert t1 is not None and a.is_held
        assert b.try_acquire() is None
        assert lock_owner(s2, "task-1") == "member-a"
        assert [h.owner for h in held_locks(s2)] == ["member-a"]
        # the loser left no contender node behind
        assert len(session.client.get_children("/locks/tasks/task-1")) == 1
        a.release()
        assert session.client.exists("/locks/tasks/task-1") is None
        t2 = b.try_acquire()
        assert t2 is not None and t2 > t1
        b.release()
        with pytest.raises(LockNotHeld):
            _ = b.token
        assert session.client.get_children("/locks/tasks") == []
    finally:
        s2.close()


def test_locks_tried_together_win_what_is_free_and_hold_like_single_ones(
        zk_namespace: ZkNamespace, session: Session) -> None:
    """``LockBatch.try_acquire``: the free locks won (tokens that grow, watched: a force
    release still reaches the listener), one held elsewhere refused with no node left behind,
    one whose parent an expired holder left empty taken (the single path), and the first lock
    ever in the namespace too (no /locks/tasks yet)."""
    other = other_session(zk_namespace)
    lost: list[str] = []
    try:
        assert session.client.exists("/locks/tasks") is None
        first = LockBatch([TaskLock(session, "t0", "a")]).try_acquire()
        assert first[0] is not None
        held = TaskLock(other, "held", "b")
        assert held.try_acquire() is not None
        other.client.create("/locks/tasks/empty")  # what an expired holder leaves
        names = ["free-1", "held", "free-2", "empty", "free-3"]
        locks = [TaskLock(session, name, "a") for name in names]
        for lock in locks:
            lock.add_lost_listener(lost.append)
        tokens = LockBatch(locks).try_acquire()
        won = dict(zip(names, tokens, strict=True))
        assert won["held"] is None and not locks[1].is_held
        assert all(won[n] is not None for n in ("free-1", "free-2", "empty", "free-3"))
        assert all(t > first[0] for t in tokens if t is not None)  # type: ignore[operator]
        assert lock_owner(other, "held") == "b"
        assert len(other.client.get_children("/locks/tasks/held")) == 1
        for name in ("free-1", "free-2", "empty", "free-3"):
            assert lock_owner(other, name) == "a"
        assert locks[0].verify() and locks[2].token == won["free-2"]
        assert force_release(other, "free-2") == "a"
        assert wait_until(lambda: lost == ["free-2"], 5)
        for lock in locks:
            lock.release()
        held.release()
        assert sorted(session.client.get_children("/locks/tasks")) == ["t0"]
        with pytest.raises(ValueError):
            LockBatch([TaskLock(session, "x", "a"), TaskLock(other, "y", "a")]).try_acquire()
    finally:
        other.close()


def test_a_batch_of_locks_is_one_transaction_whose_stamp_is_every_token(
        zk_namespace: ZkNamespace, session: Session) -> None:
    """``LockBatch.try_acquire(watch=False)``: the free locks are created in one transaction (one
    czxid for all, read from the session's stamp node written in it: no request per lock);
    one held elsewhere and one whose parent an expired holder left empty, in the middle of
    the batch, drop out of it (the first refused, the second taken the single way) and the
    rest are sent again together. ``LockBatch.release``: the nodes and parents go in one
    transaction; a lock whose parent holds a contender's node too is released alone (ours
    deleted, the contender's and its parent kept); a lock lost meanwhile is skipped."""
    other = other_session(zk_namespace)
    try:
        held = TaskLock(other, "held", "b")
        assert held.try_acquire() is not None
        other.client.create("/locks/tasks/empty", makepath=True)
        names = ["f1", "held", "f2", "empty", "f3", "f4"]
        locks = [TaskLock(session, name, "a") for name in names]
        tokens = LockBatch(locks).try_acquire(watch=False)
        won = dict(zip(names, tokens, strict=True))
        assert won["held"] is None and not locks[1].is_held
        together = {won[n] for n in ("f1", "f2", "f3", "f4")}
        assert len(together) == 1  # one transaction
        (token,) = together
        for name in ("f1", "f2", "f3", "f4", "empty"):
            (node,) = other.client.get_children(f"/locks/tasks/{name}")
            czxid = other.client.exists(f"/locks/tasks/{name}/{node}").czxid
            assert czxid == won[name] and lock_owner(other, name) == "a"
        assert won["empty"] is not None and won["empty"] != token  # taken alone
        assert other.client.exists(stamp_path(session)).mzxid == token
        assert all(locks[n].verify() for n in (0, 2, 3, 4, 5))
        # a contender raced into f2's parent; f3 was taken away (an operator's cancel)
        other.client.create("/locks/tasks/f2/zzz-lock-", b"c", ephemeral=True, sequence=True)
        assert force_release(other, "f3") == "a"
        LockBatch(locks).release()
        assert not any(lock.is_held for lock in locks)
        assert sorted(other.client.get_children("/locks/tasks")) == ["f2", "held"]
        assert [c.startswith("zzz-lock-") for c in
                other.client.get_children("/locks/tasks/f2")] == [True]
        assert lock_owner(other, "held") == "b"
    finally:
        other.close()


def test_a_release_that_fails_while_its_session_lives_is_done_later(
        zk_namespace: ZkNamespace, session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lock's delete that fails (a connection lost past its retries, as in a ZooKeeper
    leader election during a group commit's release) on a session that lives on: the lock
    was held by a live member for ever (the chaos suite's ``lock_znodes_left``: the master
    reaps only the locks of members that are gone). The release still raises, and the delete
    is tried again until done: alone (``release``), and in a batch whose transaction a
    contender's node refused (``LockBatch.release``: that lock alone); a slot booking's leases too.
    Each delete here fails twice (the release and the first try again) before it goes."""
    from kazoo.exceptions import ConnectionLoss

    from coord import ConnectionLost, Slots
    from coord.late import late_deletes_pending

    real_remove = TaskLock._remove
    failures: dict[str, int] = {}

    def flaky_remove(self: TaskLock, node: str) -> None:
        failures[self.task_id] = failures.get(self.task_id, 0) + 1
        if failures[self.task_id] <= 2:
            raise ConnectionLoss("lost in an election (injected)")
        real_remove(self, node)

    other = other_session(zk_namespace)
    try:
        alone = TaskLock(session, "alone", "a")
        batch = [TaskLock(session, name, "a") for name in ("b1", "b2", "b3")]
        assert alone.try_acquire() is not None
        assert all(LockBatch(batch).try_acquire(watch=False))
        other.client.create("/locks/tasks/b2/zzz-lock-", b"c", ephemeral=True, sequence=True)
        booking = Slots(session, "a").try_book([], ["resource/r1"])
        assert booking is not None
        leases = list(booking.leases)
        monkeypatch.setattr(TaskLock, "_remove", flaky_remove)
        with pytest.raises(ConnectionLost):
            alone.release()
        with pytest.raises(ConnectionLost):  # b2 refused the transaction: alone, and fails
            LockBatch(batch).release()
        monkeypatch.setattr("coord.slots.retry_policy", lambda: _failing_retry)
        with pytest.raises(ConnectionLost):
            booking.release()
        session_id = session.session_id
        assert lock_owner(other, "alone") == "a" and lock_owner(other, "b2") == "a"
        assert wait_until(lambda: sorted(other.client.get_children("/locks/tasks")) == ["b2"]
                          and len(other.client.get_children("/locks/tasks/b2")) == 1
                          and not any(other.client.exists(lease) for lease in leases), 10)
        assert lock_owner(other, "b2") == "c"  # the contender's node stays
        assert session.session_id == session_id  # the same session: released, not expired
        assert failures == {"alone": 3, "b2": 3} and late_deletes_pending() == 0
    finally:
        other.close()


def _failing_retry(attempt: object) -> None:
    """A retry policy that gave up (the connection lost past its deadline)."""
    from kazoo.exceptions import ConnectionLoss

    raise ConnectionLoss("lost past the retries (injected)")


def test_the_lock_of_a_task_nobody_knows_yet_is_taken_watched_in_one_go(
        zk_namespace: ZkNamespace, session: Session) -> None:
    """``TaskLock.try_acquire_new``: the parent-and-node transaction and the watch on the
    node it makes are sent together (a new parent's first child is numbered 0); the token is
    that node's czxid and a force release reaches the listener through that watch. The first
    lock ever in the namespace, a parent someone holds after all and an empty parent left by
    an expired holder go the single path's way: taken, refused (no node left), taken."""
    other = other_session(zk_namespace)
    lost: list[str] = []
    try:
        assert session.client.exists("/locks/tasks") is None
        first = TaskLock(session, "first", "a")
        assert first.try_acquire_new() is not None  # no /locks/tasks yet
        lock = TaskLock(session, "new", "a")
        lock.add_lost_listener(lost.append)
        token = lock.try_acquire_new()
        (node,) = other.client.get_children("/locks/tasks/new")
        assert node.endswith("-lock-0000000000")
        assert token == other.client.exists(f"/locks/tasks/new/{node}").czxid == lock.token
        assert token > first.token and lock.verify() and lock_owner(other, "new") == "a"
        assert force_release(other, "new") == "a"
        assert wait_until(lambda: lost == ["new"], 5) and not lock.is_held

        held = TaskLock(other, "held", "b")
        assert held.try_acquire() is not None
        assert TaskLock(session, "held", "a").try_acquire_new() is None
        assert len(other.client.get_children("/locks/tasks/held")) == 1
        other.client.create("/locks/tasks/empty")  # what an expired holder leaves
        empty = TaskLock(session, "empty", "a")
        assert empty.try_acquire_new() is not None and lock_owner(other, "empty") == "a"
        for each in (first, empty, held):
            each.release()
        assert session.client.get_children("/locks/tasks") == []
    finally:
        other.close()


def test_lock_loss_is_reported_on_force_release_and_on_session_loss(
        zk_namespace: ZkNamespace, session: Session) -> None:
    master = other_session(zk_namespace)
    lost: list[str] = []
    try:
        lock = TaskLock(session, "task-2", "member-a")
        lock.add_lost_listener(lost.append)
        assert lock.try_acquire() is not None
        assert force_release(master, "task-2") == "member-a"
        deadline = time.monotonic() + 5
        while not lost and time.monotonic() < deadline:
            time.sleep(0.02)
        assert lost == ["task-2"] and not lock.is_held
        assert lock_owner(master, "task-2") is None
        lock.release()  # a lost lock releases without error

        again = TaskLock(session, "task-3", "member-a")
        again.add_lost_listener(lost.append)
        assert again.try_acquire() is not None
        expire_session(session.client)
        deadline = time.monotonic() + 5
        while "task-3" not in lost and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "task-3" in lost
        assert lock_owner(master, "task-3") is None
        # the expired holder's node is gone but the lock's parent stays, empty: it is free
        assert master.client.get_children("/locks/tasks/task-3") == []
        successor = TaskLock(master, "task-3", "member-b")
        assert successor.try_acquire() is not None
        successor.release()
        assert master.client.exists("/locks/tasks/task-3") is None
    finally:
        master.close()


def test_versioned_register_cas(session: Session) -> None:
    reg = VersionedRegister(session, "/series/s1/state")
    assert reg.get() == (None, -1)
    assert reg.compare_and_set(-1, {"n": 1}) == 0
    with pytest.raises(VersionConflict):
        reg.compare_and_set(-1, {"n": 2})
    assert reg.compare_and_set(0, {"n": 2}) == 1
    with pytest.raises(VersionConflict) as info:
        reg.compare_and_set(0, {"n": 3})
    assert info.value.actual == 1
    assert reg.get() == ({"n": 2}, 1)


def test_register_recognises_its_own_write_after_a_lost_reply(
        session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server applies the write, the reply is lost, the retry must not see a conflict."""
    reg = VersionedRegister(session, "/reg")
    reg.compare_and_set(-1, 0)
    calls = lose_first_set_reply(monkeypatch, session.client)
    assert reg.compare_and_set(0, 1) == 1
    assert calls["n"] == 1  # applied once, recognised on retry
    assert reg.get() == (1, 1)


def test_markers_are_ephemeral_named_entries_one_session_each(session: Session,
                                                              zk_namespace: ZkNamespace) -> None:
    assert markers.read(session, "streams/s/copies") == {}
    assert markers.place(session, "streams/s/copies", "m1", {"copy": 0})
    # taken, even by this session: one holder per name (a second copy on one node declines)
    assert not markers.place(session, "streams/s/copies", "m1", {"copy": 1})
    other = other_session(zk_namespace)
    try:
        assert not markers.place(other, "streams/s/copies", "m1", {"copy": 1})
        assert markers.place(other, "streams/s/copies", "m2", {"copy": 1})
        assert markers.read(session, "streams/s/copies") == {"m1": {"copy": 0},
                                                             "m2": {"copy": 1}}
    finally:
        other.close()  # its marker goes with its session
    assert markers.read(session, "streams/s/copies") == {"m1": {"copy": 0}}
    markers.remove(session, "streams/s/copies", "m1")
    markers.remove(session, "streams/s/copies", "m1")  # gone already: no error
    assert markers.read(session, "streams/s/copies") == {}


def test_a_marker_placed_again_after_a_lost_reply_is_recognised(
        session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    """The create reached the server but its reply was lost: the retry finds the name taken
    by its own create (same session, same value) and says True, not False."""
    calls = lose_first_reply(monkeypatch, session.client, "create")
    assert markers.place(session, "copies", "m1", {"copy": 0})
    assert calls["n"] == 2 and markers.read(session, "copies") == {"m1": {"copy": 0}}



def test_a_mailbox_delivers_each_message_once_and_is_pruned_with_its_member(
        zk_namespace: ZkNamespace, session: Session) -> None:
    """``Mailbox``: messages posted to a member reach its listener once each, on a thread of
    the mailbox's (the listener may use ZooKeeper), and are deleted; one posted twice under a
    name is one; one posted while the owner's mailbox was not watched yet is delivered at its
    start; no mailbox: ``post`` is False; ``prune`` deletes the mailboxes of members gone."""
    from coord.mailbox import Mailbox, mailbox_path, post, prune

    other = other_session(zk_namespace)
    got: list[tuple[str, bytes, bool]] = []
    try:
        assert post(other, "m1", "early") is False  # no mailbox yet
        session.client.ensure_path(mailbox_path("m1"))
        assert post(other, "m1", "early", b"0")  # waits for the owner
        box = Mailbox(session, "m1", lambda name, data: got.append(
            (name, data, session.client.exists(mailbox_path("m1")) is not None))).start()
        assert wait_until(lambda: [g[0] for g in got] == ["early"], 5)
        assert post(other, "m1", "cancel-t1", b"because") and post(other, "m1", "cancel-t2")
        assert wait_until(lambda: len(got) == 3, 5), got
        assert got[1:] == [("cancel-t1", b"because", True), ("cancel-t2", b"", True)]
        assert wait_until(lambda: other.client.get_children(mailbox_path("m1")) == [], 5)
        other.client.ensure_path(mailbox_path("gone"))
        assert post(other, "gone", "x")
        assert prune(other, {"m1"}) == ["gone"]
        assert other.client.exists(mailbox_path("gone")) is None
        box.close()
        assert other.client.exists(mailbox_path("m1")) is None
        assert post(other, "m1", "late") is False
    finally:
        other.close()
