"""Taking a task: its slots, its lock, and the claim that writes the RUNNING attempt.

:meth:`Claimer.claim` books every slot level the task needs, all-or-nothing in one ZooKeeper
transaction: the counted levels (:func:`levels`: its type's cluster-wide limit, the configured
limits of the groups its type belongs to, ``{"aspect": 2, "aspect.create": 1}``: a type
``aspect.create`` books both) and the exclusive holds (:func:`holds`: each resource it
declares, and its ordering key). One transaction means no deadlock and no partial holding,
whatever the order resources are named in. For a task with an ordering key it then checks,
holding its key, that the task is the first unfinished one of its key (submission order): so
one task of a key runs at a time even if clocks disagree on submission order, and in order
when they agree. It then registers the task as
running here (with a lost-lock listener, before the lock is tried, so a lost lock or
session during the try or the claim still cancels it), tries the lock without waiting, and
claims the task with a version- and token-guarded update that writes the RUNNING attempt in the
same transaction, before any handler runs. Plain tasks (nothing to book) are claimed in batches
(:meth:`Claimer.claim_many`): their locks in one ZooKeeper transaction, their claims in one
store write.

Failure behaviour: a slot or lock held elsewhere, a task that is not its key's first, a task
that changed since it was listed (CommitConflict, StaleFencingToken, or a resource claimed since
with a newer lock token), or a session that changed between the booking and the lock, gives
None with everything taken released; ZooKeeper and store errors propagate after the same
release. Slot leases are ephemeral: a holder killed -9 frees them with its session.

Why one module: the three ways a task is taken (one with its bookings, a new one written
claimed, a batch of plain ones) share how a slot is registered before its lock is tried and
how everything taken is let go when a step fails; apart, each would repeat that order.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from urllib.parse import quote

from coord import (
    Acquiring,
    Booking,
    CoordError,
    LockBatch,
    LockNotHeld,
    Session,
    SlotLevel,
    Slots,
    TaskLock,
)
from runner.errors import CommitConflict, StaleFencingToken, StoreError
from runner.store import Store, Task
from runner.tasks.context import CancelToken
from runner.tasks.registry import TaskType
from runner.tasks.worker.running import Claimed, RunningSet, Slot

log = logging.getLogger("latchwork.tasks")

#: how long a redelivered submit's new task waits for its lock when another node held it as
#: the task was written (the other copy's own try, which lets go once it finds the task
#: written): seconds
RETAKE_WAIT = 2.0


def release(lock: TaskLock, booking: Booking | None, member_id: str) -> None:
    """Release the lock and the slot; either already gone is logged, not raised."""
    try:
        lock.release()
    except (LockNotHeld, CoordError) as exc:
        log.info("member %s: lock of task %s already gone: %s", member_id, lock.task_id, exc)
    if booking is not None:
        release_booking(booking, member_id)


def release_booking(booking: Booking, member_id: str) -> None:
    """Release a booking; one already gone is logged, not raised."""
    try:
        booking.release()
    except CoordError as exc:
        log.info("member %s: slot booking already gone: %s", member_id, exc)


def _settled(taking: Acquiring) -> int | None:
    """The one lock's token of ``taking``; None when it cannot be had (held elsewhere, or the
    try failed: logged)."""
    try:
        (token,) = taking.tokens()
    except CoordError as exc:
        log.warning("task lock %s: %s", taking.locks[0].task_id, exc)
        return None
    return token


def _retake(lock: TaskLock, member_id: str) -> int | None:
    """The lock of a new task written claimed here, tried again until :data:`RETAKE_WAIT` has
    passed (:meth:`Claimer.claim_new`, ``again``); its token, None when it is still held
    elsewhere or a try fails (logged). Its token is above the one the task's claim was written
    with, which stays the attempt's: nothing was written with the other holder's."""
    deadline, pause = time.monotonic() + RETAKE_WAIT, 0.005
    while True:
        try:
            token = lock.try_acquire()
        except CoordError as exc:
            log.warning("member %s: task lock %s: %s", member_id, lock.task_id, exc)
            return None
        if token is not None or time.monotonic() + pause > deadline:
            return token
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def slot_name(value: str) -> str:
    """A key or resource as one znode name (any text: '/' and '..' are safe)."""
    return quote(value, safe="").replace(".", "%2E")


def group_limits(task_type: str, limits: Mapping[str, int]) -> list[tuple[str, int]]:
    """The configured limits that apply to ``task_type``: its own name and every dotted
    prefix of it (``aspect`` and ``aspect.create`` for ``aspect.create``), widest first."""
    parts = task_type.split(".")
    prefixes = [".".join(parts[:n]) for n in range(1, len(parts) + 1)]
    return [(p, limits[p]) for p in prefixes if p in limits]


def levels(task: Task, kind: TaskType, limits: Mapping[str, int]) -> list[SlotLevel]:
    """Every slot level ``task`` books before it starts (see the module)."""
    found = [SlotLevel(f"group/{slot_name(group)}", limit)
             for group, limit in group_limits(task.type, limits)]
    if kind.slot_limit is not None:
        found.append(SlotLevel(f"type/{slot_name(task.type)}", kind.slot_limit))
    return found  # an ordering key is an exclusive hold (:func:`holds`), never a level


def holds(task: Task) -> list[str]:
    """The exclusive holds ``task`` takes before it starts: its resources and ordering key
    (a limit of one each: one ephemeral node, nothing left once released)."""
    found = [f"resource/{slot_name(r)}" for r in sorted(set(task.resources))]
    if task.ordering_key is not None:
        found.append(f"key/{slot_name(task.ordering_key)}")
    return found


def _cancels(slot: Slot) -> Callable[[str], None]:
    """A lost-lock listener that cancels ``slot``'s handler."""
    return lambda _task: slot.cancel.cancel("its task lock was lost")


def plain(task: Task, kind: TaskType, limits: Mapping[str, int]) -> bool:
    """Whether ``task`` books nothing before its lock (no slot level, resource or ordering
    key): such tasks are claimed in batches (:meth:`Claimer.claim_many`)."""
    return task.ordering_key is None and not task.resources and not levels(
        task, kind, limits)


def key_only(task: Task, kind: TaskType, limits: Mapping[str, int]) -> bool:
    """Whether the ordering key is all ``task`` books (no resource, no counted level)."""
    return task.ordering_key is not None and not task.resources and not levels(
        task, kind, limits)


class Claimer:
    """Takes tasks for one member (see the module): its slot booker (reused: it remembers the
    level nodes it created), the running set a claim registers into, the configured group
    ``limits`` and the claims' counters (``stats``: started, lock_busy, slots_busy,
    not_first, stale)."""

    def __init__(self, session: Session, store: Store, member_id: str,
                 running: RunningSet, limits: Mapping[str, int] | None = None) -> None:
        self.session = session
        self.store = store
        self.member_id = member_id
        self.running = running
        self.limits = dict(limits or {})
        self.slots = Slots(session, member_id)
        self.stats: Counter[str] = Counter()

    def _register(self, task: Task, booking: Booking | None,
                  key_queue: list[Task] | None = None) -> Slot:
        """``task`` as taken here, before its lock is tried: a lost lock or session during
        the try or the claim still cancels it."""
        slot = Slot(task, TaskLock(self.session, task.id, self.member_id), booking,
                    CancelToken(self.session), key_queue=key_queue or [])
        slot.lock.add_lost_listener(_cancels(slot))
        self.running.add(slot)
        return slot

    def _abandon(self, slot: Slot) -> None:
        """Let go of a task not started: its lock and booking released, its worker free."""
        release(slot.lock, slot.booking, self.member_id)
        self.running.discard(slot)
        slot.done.set()

    def claim(self, task: Task, kind: TaskType, *, first_checked: bool = False,
              held: Booking | None = None) -> Slot | None:
        """Take ``task`` for this member, or None when someone else has it (see the module).
        ``first_checked``: the caller has just read that ``task`` is its key's first
        unfinished one (the worker that finished the one before it); the hold on the key keeps
        others out either way. ``held``: that worker's booking of the key, carried over (only
        when the key is all ``task`` books, :func:`key_only`); released like a new one when
        the claim fails."""
        stats, member_id, store = self.stats, self.member_id, self.store
        session_id = self.session.session_id  # the hold and the lock must be on one session
        booking = held
        after: list[Task] = []
        needed, exclusive = levels(task, kind, self.limits), holds(task)
        if booking is None and (needed or exclusive):
            booking = self.slots.try_book(needed, exclusive)
            if booking is None:
                stats["slots_busy"] += 1
                return None
        if task.ordering_key is not None and not first_checked:
            try:
                first = store.tasks.with_key(task.ordering_key)
            except BaseException:
                if booking is not None:
                    booking.release()
                raise
            if not first or first[0].id != task.id:
                stats["not_first"] += 1
                if booking is not None:
                    booking.release()
                return None
            after = first[1:]
        slot = self._register(task, booking, after)
        try:
            token = slot.lock.try_acquire()
            if token is None:  # someone else runs it
                stats["lock_busy"] += 1
                self._abandon(slot)
                return None
            if self.session.expired(session_id):
                # the session the holds were booked on is gone (a retried lock create went
                # through on the next one): the lock is this node's, the holds are not
                stats["session_changed"] += 1
                self._abandon(slot)
                return None
            # the version read by the scan guards the claim: if the task changed since
            # (another node finished it, an operator stopped it), the claim is a conflict and
            # we move on.
            claimed, attempt = store.claim(task, token, member_id)
            slot.claim = Claimed(claimed, attempt, token)
        except (CommitConflict, StaleFencingToken):
            stats["stale"] += 1
            self._abandon(slot)
            return None
        except BaseException:
            self._abandon(slot)
            raise
        stats["started"] += 1
        return slot

    def claim_new(self, task: Task, again: bool = False) -> Slot | None:
        """Take ``task``, new and not written yet (this node just accepted it, so nobody else
        can know its id), and write it already claimed, RUNNING with its RUNNING attempt in
        one store write (:meth:`~runner.store.Store.create_claimed`), registered in the
        running set like :meth:`claim`'s. The write goes while its lock is being taken
        (:meth:`~coord.LockBatch.send`: nothing to contend with), not after: its
        token is the last zxid the session saw before the lock's transaction was sent, below
        the lock's own czxid and so below every later owner's token (docs/reliability.md),
        and the handler starts only once both are done.

        A lock that cannot be had after all, or a session that changed under it, leaves the
        task written RUNNING: its attempt is cancelled before the handler runs and ends
        CANCELLED_BY_SYSTEM the way every attempt ends (fenced by its token), the task back
        to waiting. None, with nothing written and the lock let go, only when the session has
        seen no zxid yet (then the lock goes first, as before, and the caller writes the task
        WAITING if that fails). A store error propagates, the lock released and nothing known
        written: the submit fails as a failed create does.

        ``again``: the task's id is its request's (a redelivered submit): when a task has that
        id already, nothing is written and the lock let go, None (the caller finds that task).
        Two copies handled at once on two nodes both try the lock as they write: the one that
        wrote first may find the lock held by the other, which lets it go as soon as its write
        finds the task there. So a copy that wrote the task and found its lock held tries it
        again for up to :data:`RETAKE_WAIT` seconds (:func:`_retake`) before it cancels its
        attempt: the task then runs with one attempt, not a cancelled one and a second."""
        session_id = self.session.session_id
        slot = self._register(task, None)
        try:
            taking = LockBatch([slot.lock]).send(watch=False)
            if taking.below <= 0:  # no zxid seen yet: the lock's own token, first
                (token,) = taking.tokens()
                if token is None or self.session.expired(session_id):
                    self.stats["session_changed" if token is not None else "lock_busy"] += 1
                    self._abandon(slot)
                    return None
            else:
                token = taking.below
            try:
                made = (self.store.create_claimed_again(task, token, self.member_id) if again
                        else self.store.create_claimed(task, token, self.member_id))
            except BaseException:
                if taking.below > 0:
                    _settled(taking)  # the lock's answer first, so its release finds it
                raise
            if made is None:  # its first sending wrote it
                if taking.below > 0:
                    _settled(taking)
                self.stats["sent_again"] += 1
                self._abandon(slot)
                return None
            claimed, attempt = made
        except BaseException:
            self._abandon(slot)
            raise
        slot.claim = Claimed(claimed, attempt, token)
        if taking.below > 0:
            self._lock_written(slot, taking, again, session_id)
        self.stats["started"] += 1
        return slot

    def _lock_written(self, slot: Slot, taking: Acquiring, again: bool,
                      session_id: int | None) -> None:
        """The lock's answer for a task :meth:`claim_new` has written claimed: the attempt is
        cancelled before its handler runs when the lock cannot be had (a redelivered submit's
        tried again first, :func:`_retake`) or the session changed meanwhile."""
        held = _settled(taking)
        if held is None and again and not self.session.expired(session_id):
            held = _retake(slot.lock, self.member_id)
        if held is None or self.session.expired(session_id):
            self.stats["lock_lost_at_start"] += 1
            slot.cancel.cancel("its task lock could not be taken as it started"
                               if held is None else
                               "its ZooKeeper session changed as it started")

    def claim_many(self, tasks: Sequence[Task]) -> list[Slot]:
        """Take several plain tasks (:func:`plain`: no slot, hold or ordering key) in one pass:
        their locks in one ZooKeeper transaction (:meth:`~coord.LockBatch.try_acquire`,
        no watch: an operator's cancel reaches a handler through the node's mailbox), then the
        claims of those won in one store write (:meth:`~runner.store.Store.claim_many`).
        A batch that partly loses keeps what it won: a lock held elsewhere or a task that
        changed since it was listed drops that task alone (everything it took released). The
        tasks started, each registered in the running set, like :meth:`claim`'s."""
        if not tasks:
            return []
        stats, member_id, store = self.stats, self.member_id, self.store
        session_id = self.session.session_id
        slots = [self._register(task, None) for task in tasks]
        try:
            tokens = LockBatch([s.lock for s in slots]).try_acquire(watch=False)
        except BaseException:
            for slot in slots:
                self._abandon(slot)
            raise
        won: list[tuple[Slot, int]] = []
        for slot, token in zip(slots, tokens, strict=True):
            if token is None:
                stats["lock_busy"] += 1
                self._abandon(slot)
            else:
                won.append((slot, token))
        if won and self.session.expired(session_id):
            stats["session_changed"] += len(won)
            for slot, _ in won:
                self._abandon(slot)
            return []
        try:
            claims = store.claim_many([(s.task, token) for s, token in won], member_id) \
                if won else []
        except BaseException:
            for slot, _ in won:
                self._abandon(slot)
            raise
        started = []
        for (slot, token), claimed in zip(won, claims, strict=True):
            if isinstance(claimed, StoreError):
                stats["stale"] += 1
                self._abandon(slot)
                continue
            slot.claim = Claimed(claimed[0], claimed[1], token)
            stats["started"] += 1
            started.append(slot)
        if len(won) > 1:
            stats["claim_batches"] += 1
            stats["claimed_in_batches"] += len(won)
        return started
