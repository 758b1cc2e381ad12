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
same transaction, before any handler runs.

Failure behaviour: a slot or lock held elsewhere, a task that is not its key's first, a task
that changed since it was listed (CommitConflict, StaleFencingToken, or a resource claimed since
with a newer lock token), or a session that changed between the booking and the lock, gives
None with everything taken released; ZooKeeper and store errors propagate after the same
release. Slot leases are ephemeral: a holder killed -9 frees them with its session.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from coord import Booking, CoordError, LockNotHeld, Session, SlotLevel, Slots, TaskLock
from runner.errors import CommitConflict, StaleFencingToken, StoreError, StoreUnavailable
from runner.store import Attempt, GraphStore, Task
from runner.tasks.context import CancelToken
from runner.tasks.registry import TaskType
from runner.tasks.worker.running import Running, RunningSet

log = logging.getLogger("latchwork.tasks")


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


def _cancels(running: Running) -> Callable[[str], None]:
    """A lost-lock listener that cancels ``running``'s handler."""
    return lambda _task: running.cancel.cancel("its task lock was lost")


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

    def __init__(self, session: Session, store: GraphStore, member_id: str,
                 running: RunningSet, limits: Mapping[str, int] | None = None) -> None:
        self.session = session
        self.store = store
        self.member_id = member_id
        self.running = running
        self.limits = dict(limits or {})
        self.slots = Slots(session, member_id)
        self.stats: Counter[str] = Counter()

    def _register(self, task: Task, booking: Booking | None,
                  key_queue: list[Task] | None = None) -> Running:
        """``task`` as running here, before its lock is tried: a lost lock or session during
        the try or the claim still cancels it."""
        lock = TaskLock(self.session, task.id, self.member_id)
        running = Running(task, lock, booking, key_queue=key_queue or [],
                          cancel=CancelToken(self.session))
        lock.add_lost_listener(_cancels(running))
        self.running.add(running)
        return running

    def _abandon(self, running: Running) -> None:
        """Let go of a task not started: its lock and booking released, its worker free."""
        release(running.lock, running.booking, self.member_id)
        self.running.discard(running)
        running.done.set()

    def claim(self, task: Task, kind: TaskType, *, first_checked: bool = False,
              held: Booking | None = None) -> Running | None:
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
        running = self._register(task, booking, after)
        try:
            token = running.lock.try_acquire()
            if token is None:  # someone else runs it
                stats["lock_busy"] += 1
                self._abandon(running)
                return None
            if self.session.expired(session_id):
                # the session the holds were booked on is gone (a retried lock create went
                # through on the next one): the lock is this node's, the holds are not
                stats["session_changed"] += 1
                self._abandon(running)
                return None
            # the version read by the scan guards the claim: if the task changed since
            # (another node finished it, an operator stopped it), the claim is a conflict and
            # we move on.
            running.task, running.attempt = store.claim(task, token, member_id)
            running.token = token
        except (CommitConflict, StaleFencingToken):
            stats["stale"] += 1
            self._abandon(running)
            return None
        except BaseException:
            self._abandon(running)
            raise
        stats["started"] += 1
        return running

    def claim_new(self, task: Task) -> Running | None:
        """Take ``task``, new and not written yet (this node just accepted it, so nobody else
        can know its id), and write it already claimed: its lock first (nothing to contend
        with: :meth:`~coord.TaskLock.try_acquire_new`, one round trip), then the task RUNNING
        with its RUNNING attempt in one store write
        (:meth:`~runner.store.GraphStore.create_claimed`), registered in the running set like
        :meth:`claim`'s. None, with nothing written and the lock let go, when the lock could
        not be had after all or the session changed under it: the caller writes the task
        WAITING then. A store or ZooKeeper error propagates, the lock released and nothing
        written: the submit fails as a failed create does."""
        member_id = self.member_id
        session_id = self.session.session_id
        running = self._register(task, None)
        try:
            token = running.lock.try_acquire_new()
            if token is None or self.session.expired(session_id):
                self.stats["session_changed" if token is not None else "lock_busy"] += 1
                self._abandon(running)
                return None
            running.task, running.attempt = self.store.create_claimed(task, token, member_id)
            running.token = token
        except BaseException:
            self._abandon(running)
            raise
        self.stats["started"] += 1
        return running

    def claim_many(self, tasks: Sequence[Task]) -> list[Running]:
        """Take several plain tasks (:func:`plain`: no slot, hold or ordering key) in one pass:
        their locks tried with the round trips pipelined
        (:meth:`~coord.TaskLock.try_acquire_all`), then the claims of those won written in one
        store write (one transaction on the embedded graph). A batch that partly loses keeps
        what it won: a lock held elsewhere or a task that changed since it was listed drops
        that task alone (everything it took released). The tasks started, each registered in
        the running set, like :meth:`claim`'s."""
        if not tasks:
            return []
        stats, member_id, store = self.stats, self.member_id, self.store
        session_id = self.session.session_id
        entries = [self._register(task, None) for task in tasks]

        try:
            tokens = TaskLock.try_acquire_all([r.lock for r in entries])
        except BaseException:
            for running in entries:
                self._abandon(running)
            raise
        won: list[tuple[Running, int]] = []
        for running, token in zip(entries, tokens, strict=True):
            if token is None:
                stats["lock_busy"] += 1
                self._abandon(running)
            else:
                won.append((running, token))
        if won and self.session.expired(session_id):
            stats["session_changed"] += len(won)
            for running, _ in won:
                self._abandon(running)
            return []
        claims: dict[int, tuple[Task, Attempt] | StoreError] = {}

        def write(g: Any) -> None:
            for n, (running, token) in enumerate(won):
                try:
                    claims[n] = store.claim(running.task, token, member_id)
                except StoreUnavailable:  # the graph itself: the whole batch fails
                    raise
                except StoreError as exc:  # this task moved on (or went): its claim alone
                    claims[n] = exc

        try:
            if won:
                store.graph.write(write)
        except BaseException:
            for running, _ in won:
                self._abandon(running)
            raise
        started = []
        for n, (running, token) in enumerate(won):
            claimed = claims[n]
            if isinstance(claimed, StoreError):
                stats["stale"] += 1
                self._abandon(running)
                continue
            running.task, running.attempt = claimed
            running.token = token
            stats["started"] += 1
            started.append(running)
        if len(won) > 1:
            stats["claim_batches"] += 1
        return started
