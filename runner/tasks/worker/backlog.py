"""The order a node tries the open tasks in: pure functions over a listing, no I/O.

Priority first. Within a priority, this member's preferred tasks in first-come order, then the
others' tasks in first-come order by windows shuffled per node. Every node reads the same list;
walking it in the same order would make all nodes contend for the same tasks and lose most of
their claims (a lost claim costs a lock try, two ZooKeeper requests). A task's preferred member
is ``crc32(task id) mod n`` over the n sorted live members: the nodes' first choices are
disjoint, and a node that has run out of its own takes the others' oldest ones, shuffled a few
times the workers wide so that two such nodes do not pick the same ones. Membership unknown, or
this member not in it: no preferred tasks, shuffled windows only. Nothing here can fail.
"""

from __future__ import annotations

import random
import zlib
from datetime import datetime

from runner.store import Task, TaskStatus


def preferred_index(task_id: str, members: int) -> int:
    """The index, among ``members`` sorted live member ids, of the task's preferred member."""
    return zlib.crc32(task_id.encode()) % members


def unowned(tasks: list[Task], live: set[str] | None, member_id: str) -> tuple[list[Task], int]:
    """``tasks`` without those RUNNING under another live member (their lock is held, and
    trying it costs two round trips each), and how many were dropped. A RUNNING task whose owner
    left stays (the master frees its lock and puts it back to WAITING), and so does one owned by
    this member that it does not run (its end could not be written): this member takes it up
    again. Membership unknown (``live`` None): all stay, the locks decide."""
    running = [t for t in tasks if t.status is TaskStatus.RUNNING and t.owner
               and t.owner != member_id]
    if not running or live is None:
        return tasks, 0
    skip = {t.id for t in running if t.owner in live}
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
