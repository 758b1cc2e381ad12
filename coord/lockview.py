"""Anyone's view of the task locks: who holds a task's lock (:func:`lock_owner`), every held
lock with its owner, token and age (:func:`held_locks`, for the master and ``cluster status``),
and the master freeing a dead member's lock (:func:`force_release`). Reads of the layout
:mod:`coord.lock` writes; errors translated by :func:`~coord._znodes.zk_errors`."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from kazoo.exceptions import NoNodeError, NotEmptyError

from coord._znodes import sort_by_seq, zk_errors
from coord.lock import TASK_LOCKS, lock_path
from coord.session import Session

log = logging.getLogger("coord.lock")


@dataclass(frozen=True)
class HeldLock:
    task_id: str
    owner: str
    token: int
    since: float  # epoch seconds when the holder's node was created


def _holder(session: Session, task_id: str) -> tuple[str, bytes, float, int] | None:
    client = session.client
    parent = lock_path(task_id)
    try:
        children = sort_by_seq(client.get_children(parent))
    except NoNodeError:
        return None
    for child in children:
        try:
            data, stat = client.get(f"{parent}/{child}")
        except NoNodeError:
            continue
        return f"{parent}/{child}", data, stat.ctime / 1000.0, stat.czxid
    return None


def lock_owner(session: Session, task_id: str) -> str | None:
    """The member id holding the task's lock, or None."""
    with zk_errors(f"cannot read the lock of {task_id}"):
        holder = _holder(session, task_id)
    return None if holder is None else bytes(holder[1]).decode()


def held_locks(session: Session, prune_empty: bool = False) -> list[HeldLock]:
    """Every held task lock with owner, token and age (for the master and ``cluster status``).

    ``prune_empty``: also delete lock parents that have no child (their holder's session
    expired, so its node went without the release that deletes the parent). A contender
    creating its node in a parent deleted meanwhile starts over (see ``try_acquire``).
    """
    client = session.client
    held = []
    with zk_errors("cannot list task locks"):
        try:
            tasks = client.get_children(TASK_LOCKS)
        except NoNodeError:
            return []
        for task_id in sorted(tasks):
            holder = _holder(session, task_id)
            if holder is not None:
                _, data, since, token = holder
                held.append(HeldLock(task_id, bytes(data).decode(), token, since))
            elif prune_empty:
                try:
                    client.delete(lock_path(task_id))
                except (NoNodeError, NotEmptyError):
                    pass
    return held


def force_release(session: Session, task_id: str) -> str | None:
    """Delete the holder's node (the master frees a dead member's lock); returns its owner.

    The holder, if it is somehow alive, is told through its lost listeners.
    """
    client = session.client
    with zk_errors(f"cannot force-release {task_id}"):
        holder = _holder(session, task_id)
        if holder is None:
            return None
        path, data, _, _ = holder
        try:
            client.retry(client.delete, path)
        except NoNodeError:
            pass
        try:
            client.delete(lock_path(task_id))
        except (NoNodeError, NotEmptyError):
            pass
    log.warning("task %s: lock of %s force-released", task_id, bytes(data).decode())
    return bytes(data).decode()
