"""The order a node tries the open tasks in (pure functions over a listing, no I/O), and
:class:`Backlog`, the candidates of the last listing and how fresh each is.

Priority first. Within a priority, this member's preferred tasks in first-come order, then the
others' tasks in first-come order by windows shuffled per node. Every node reads the same list;
walking it in the same order would make all nodes contend for the same tasks and lose most of
their claims (a lost claim costs a lock try, two ZooKeeper requests). A task's preferred member
is its shard modulo n over the n sorted live members (:func:`runner.store.due.preferred_index`):
the nodes' first choices are disjoint. A listing reads this member's own shards only
(:meth:`Backlog.list_open`), but every ``steal_after`` seconds, or when its own ran out, it reads
every task; while such a listing holds any of its own, a node leaves the others' tasks to them
for ``steal_after`` from when it first listed them (:meth:`Backlog._deferring_others`);
otherwise it takes the others' oldest ones, shuffled a few times the workers wide so that two
such nodes do not pick the same ones. Membership unknown, or this member not in it: no
preferred tasks, every listing reads every task, shuffled windows only. Nothing here can fail.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime

from runner.errors import StoreError
from runner.store import Store, Task, TaskStatus, codec, due
from runner.store.due import preferred_index
from runner.tasks.worker.ready import Floors, ReadyScan
from runner.tasks.worker.settings import LoopSettings
from runner.tasks.worker.timing import DueTimer

log = logging.getLogger("latchwork.tasks")


def unowned(tasks: list[Task], live: set[str] | None, member_id: str,
            mine: Callable[[str], bool] = lambda task_id: False) -> tuple[list[Task], int]:
    """``tasks`` without those RUNNING under another live member (their lock is held, and
    trying it costs two round trips each), nor this member's own that it runs (``mine``), and
    how many were dropped. A RUNNING task whose owner left stays (the master frees its lock and
    puts it back to WAITING), and so does one owned by this member that it does not run (its
    end could not be written): this member takes it up again. Membership unknown (``live``
    None): all stay, the locks decide."""
    skip = {t.id for t in tasks if t.status is TaskStatus.RUNNING and t.owner and (
        mine(t.id) if t.owner == member_id else live is not None and t.owner in live)}
    return [t for t in tasks if t.id not in skip], len(skip)


def first_per_key(tasks: list[Task]) -> tuple[list[Task], int]:
    """``tasks`` with only the first (oldest) listed task of each ordering key, and how many
    were dropped: the others cannot start before it ends (the claim checks the key's first
    unfinished task again, stopped ones included, holding the key's slot)."""
    first: dict[str, Task] = {}
    for task in tasks:
        key = task.ordering_key
        if key is not None and (key not in first or (task.created_at, task.id)
                                < (first[key].created_at, first[key].id)):
            first[key] = task
    kept = [t for t in tasks if t.ordering_key is None or first[t.ordering_key] is t]
    return kept, len(tasks) - len(kept)


def split_due(tasks: list[Task], now: datetime) -> tuple[list[Task], list[Task]]:
    """``tasks`` that may start now, and those whose ``run_at`` is still to come (by it)."""
    ready = [t for t in tasks if t.run_at is None or t.run_at <= now]
    later = sorted((t for t in tasks if t.run_at is not None and t.run_at > now),
                   key=lambda t: (t.run_at, -t.priority, t.id))
    return ready, later


def is_preferred(task_id: str, live: set[str] | None, member_id: str) -> bool:
    """Whether this member is the task's preferred one among the live members."""
    members = sorted(live or ())
    if member_id not in members:
        return False
    return preferred_index(task_id, len(members)) == members.index(member_id)


def candidates(tasks: list[Task], live: set[str] | None, member_id: str,
               workers: int) -> list[tuple[Task, bool]]:
    """The order to try ``tasks`` in, each with whether this member is its preferred one."""
    window = max(8, 4 * workers)
    members = sorted(live or ())
    me = members.index(member_id) if member_id in members else None
    by_priority: dict[int, list[Task]] = {}
    for task in tasks:
        by_priority.setdefault(task.priority, []).append(task)
    ordered: list[tuple[Task, bool]] = []
    for priority in sorted(by_priority, reverse=True):
        others = by_priority[priority]
        if me is not None and len(members) > 1:
            split: dict[bool, list[Task]] = {True: [], False: []}
            for task in others:
                split[preferred_index(task.id, len(members)) == me].append(task)
            ordered.extend((t, True) for t in split[True])
            others = split[False]
        for start in range(0, len(others), window):
            chunk = others[start:start + window]
            random.shuffle(chunk)
            ordered.extend((t, False) for t in chunk)
    return ordered


class Backlog:
    """The candidates of this node's last listing of the open tasks, in the order to try them,
    each with when its version was last confirmed and whether this member is its preferred
    one; the listed tasks not due yet wait on ``later`` (:class:`DueTimer`).

    A listing goes stale fast (short tasks finish while a scan walks it, other nodes claim
    from the same list), so before a lock and a claim are spent on a candidate whose version
    was last seen more than ``fresh_for`` seconds ago (``own_fresh_for`` for a task this
    member is preferred for: the others take those only after their own), one read of the
    versions of the next few candidates drops those that changed since (:meth:`take`). When a
    whole read finds only changed ones the rest is likely stale too: the open tasks are listed
    again, unless listing would then take more than ``relist_share`` of the time (a listing
    costs in proportion to the open tasks, a version read to the candidates it checks), in
    which case the next read covers more candidates at once. A listing that left others' tasks
    to their members (:meth:`_deferring_others`) may be followed by the next at once: its own
    ran out, and the page has moved on since (a claimed task leaves the ready buckets).

    Failure behaviour: a listing or a version read that fails is logged and the scan ends;
    the next one tries again."""

    def __init__(self, store: Store, member_id: str, later: DueTimer,
                 stats: Counter[str], running: Callable[[str], bool],
                 known: Callable[[Task], bool] = lambda task: True, *,
                 settings: LoopSettings | None = None, floors: Floors | None = None) -> None:
        settings = settings or LoopSettings()
        self.store = store
        self.member_id = member_id
        self.workers = workers = settings.workers
        self.later = later
        self.stats = stats
        self.running = running  # whether this node runs a task (its id)
        self.known = known  # whether this node may try a task (its type here, not declined)
        self.fresh_for = settings.fresh_for
        self.own_fresh_for = settings.own_fresh_for
        self.relist_share = settings.relist_share
        self.steal_after = settings.steal_after
        #: the next ready tasks, a page at a time (:class:`ReadyScan`)
        self.ready = ReadyScan(store.tasks, floors)
        #: tasks a listing reads: enough for a few batches of every worker
        self.page = max(64, 8 * workers)
        self.items: list[tuple[Task, float, bool]] = []  # (task, version seen at, own)
        self.listed = (0.0, 0.0)  # when the last listing ended, and how long it took
        self._stale_chunks = 0  # version reads in a row that found every candidate changed
        #: the tasks of the last listing -> when this member first listed them (monotonic)
        self._first_listed: dict[str, float] = {}
        self._deferred = 0  # others' tasks the last listing left to their members
        self._full_at = -float("inf")  # when a listing last read every task (monotonic)

    def __bool__(self) -> bool:
        return bool(self.items)

    def load(self, candidates: list[tuple[Task, bool]], seen: float | None = None) -> None:
        """Replace the candidates (each with whether it is this member's)."""
        at = time.monotonic() if seen is None else seen
        self.items = [(t, at, own) for t, own in candidates]
        self._stale_chunks = 0

    def push_front(self, tasks: list[tuple[Task, bool]]) -> None:
        now = time.monotonic()
        self.items[:0] = [(t, now, own) for t, own in tasks]

    def list_open(self, live: set[str] | None, claimed: bool = False,
                  ahead: bool = False) -> bool:
        """List the next ready tasks (a page: :class:`ReadyScan`) into the backlog, in the
        order to try them, and plan those not due yet; ``claimed``: also the tasks RUNNING
        under some owner, of which those whose owner left and this member's own that it does
        not run (their end never written) are tried again (the interval's scans ask for them:
        as many as run in the cluster); ``ahead``: the walks go on to the horizon's end
        whatever the time since the last that did (a write asked for the listing: see
        :meth:`ReadyScan.read`). False when the store cannot be read (logged)."""
        began = time.monotonic()
        shards = self._own_shards(live, began)
        try:
            listing = self.ready.read(self.page, self._startable(), ahead=ahead, shards=shards)
            if shards is not None and not listing:  # its own ran out: the others' at once
                shards = None
                listing = self.ready.read(self.page, self._startable(), ahead=ahead)
            if shards is None:
                self._full_at = began
                self.stats["full_listings"] += 1
            if claimed:
                listing += self.store.tasks.claimed()
            self.stats["listings"] += 1
        except StoreError as exc:
            log.error("member %s: cannot list tasks: %s", self.member_id, exc)
            return False
        seen = time.monotonic()
        self.listed = (seen, seen - began)
        keyed_first, behind = first_per_key(listing)
        self.stats["behind_key"] += behind
        tasks, skipped = unowned(keyed_first, live, self.member_id, self.running)
        self.stats["skipped_running"] += skipped
        ready, later = split_due(tasks, codec.now())
        ordered = candidates(ready, live, self.member_id, self.workers)
        if shards is None:
            ordered = self._deferring_others(ordered, seen)
        else:
            self._deferred = 0
        self.load(ordered, seen)
        # a listing that ended at now keeps the tasks planned by one that read further, an
        # own listing those of the others planned by a full one
        self.later.plan([(t, is_preferred(t.id, live, self.member_id)) for t in later],
                        keep=shards is not None or not self.ready.read_ahead)
        return True

    def _own_shards(self, live: set[str] | None, now: float) -> list[str] | None:
        """The shards a listing at ``now`` reads: this member's own, or None (every task) when
        the last listing of every task is ``steal_after`` old, membership is unknown, this
        member is not in it or is the only one, or has no shard (past the 60th)."""
        if live is None or self.member_id not in live or len(live) < 2 \
                or now - self._full_at >= self.steal_after:
            return None
        members = sorted(live)
        return due.shards_of(members.index(self.member_id), len(members)) or None

    def _deferring_others(self, ordered: list[tuple[Task, bool]], now: float
                          ) -> list[tuple[Task, bool]]:
        """``ordered`` without the others' tasks this member first listed less than
        ``steal_after`` seconds ago, while the listing holds any task of its own: their
        preferred members take them (every node lists the same oldest tasks; a node that took
        the others' as soon as its own ran out would race them for each one, a lock and a claim
        lost per race). An others' task is taken once it stays listed that long (its preferred
        member is slow, stopped, or busy) or when a listing holds none of this member's."""
        first = {t.id: self._first_listed.get(t.id, now) for t, _ in ordered}
        self._first_listed = first
        self._deferred = 0
        if not any(own for _, own in ordered):
            return ordered
        kept = [(t, own) for t, own in ordered
                if own or now - first[t.id] >= self.steal_after]
        self._deferred = len(ordered) - len(kept)
        self.stats["deferred_others"] += self._deferred
        return kept

    def _startable(self) -> Callable[[Task], bool]:
        """What a listing keeps: a task of a type this node has, not declined here, not run
        here already, and of its ordering key the oldest submitted among those kept (the claim
        checks it is the key's first again). A walk meets tasks in the order they became
        ready, not submitted: a key's first task stopped and reactivated is ready after the
        tasks behind it, and replaces the one kept for its key (``first_per_key`` keeps it)."""
        keys: dict[str, tuple[datetime, str]] = {}

        def startable(task: Task) -> bool:
            if not self.known(task) or self.running(task.id):
                return False
            if task.ordering_key is not None:
                order = (task.created_at, task.id)
                kept = keys.get(task.ordering_key)
                if kept is not None and kept <= order:
                    return False
                keys[task.ordering_key] = order
            return True
        return startable

    def may_relist(self) -> bool:
        """Whether listing again now keeps listing within ``relist_share`` of the time."""
        return self.relist_in() <= 0

    def relist_in(self) -> float:
        """Seconds until listing again keeps listing within ``relist_share`` of the time
        (0 or less: now)."""
        if self._deferred:
            return 0.0
        listed_at, took = self.listed
        return listed_at + took / self.relist_share - time.monotonic()

    def take(self, free: int, taken: Callable[[str], bool], relist: Callable[[], bool],
             room: Callable[[Sequence[Task]], int] | None = None) -> list[Task] | None:
        """Up to ``free`` candidates, each still trusted (a version read first when needed),
        removed from the backlog; ``taken(task_id)``: this node has it already; ``room``: how
        many of them, in order, it may claim now (the rest stay first in line). Empty when the
        backlog ran out or none may be claimed now; None when the store could not be read."""
        while self.items:
            task, seen, own = self.items[0]
            trusted = self.own_fresh_for if own else self.fresh_for
            if time.monotonic() - seen > trusted:
                size = max(4, 2 * free) << min(self._stale_chunks, 4)
                chunk = self.items[:size]
                try:
                    current = self.store.tasks.versions([t.id for t, _, _ in chunk])
                except StoreError as exc:
                    log.error("member %s: cannot check tasks: %s", self.member_id, exc)
                    return None
                seen = time.monotonic()
                fresh = [(t, seen, o) for t, _, o in chunk if current.get(t.id) == t.version]
                self.stats["skipped_stale"] += len(chunk) - len(fresh)
                self.items[:len(chunk)] = fresh
                if not fresh:
                    if not self.may_relist():
                        self._stale_chunks += 1
                    elif not relist():
                        return None
                    continue
                self._stale_chunks = 0
            # as many candidates as there are free workers, all still trusted, and all this
            # member's preferred ones or all the others': one batch (its locks one ZooKeeper
            # transaction, in which each lock held elsewhere costs a round trip of its own;
            # the others' are the ones contended)
            batch: list[tuple[Task, float, bool]] = []
            now = time.monotonic()
            mine = self.items[0][2]
            while self.items and len(batch) < free:
                task, seen, own = self.items[0]
                trusted = self.own_fresh_for if own else self.fresh_for
                if batch and (now - seen > trusted or own != mine):
                    break  # the next take checks its version first, or starts the others'
                item = self.items.pop(0)
                if not taken(task.id) and task.id not in {t.id for t, _, _ in batch}:
                    batch.append(item)
            if not batch:
                continue  # each was taken here already
            kept = len(batch) if room is None else room([t for t, _, _ in batch])
            self.items[0:0] = batch[kept:]  # not for now: first in line for the next take
            return [t for t, _, _ in batch[:kept]]
        return []
