"""Retention of a :class:`~coord.queue.LockFreeQueue`: old elements dropped from its head, the
new first index recorded before any is deleted (a reader never sees a hole), and the records of
old ``push_many`` tokens dropped with them."""

from __future__ import annotations

import contextlib
import time
from typing import Protocol

from kazoo.exceptions import NoNodeError

from coord._znodes import retry_policy, zk_errors
from coord.session import Session


class PrunedQueue(Protocol):
    """What retention needs of a :class:`coord.queue.LockFreeQueue`."""
    session: Session
    name: str
    root: str

    def first(self) -> int: ...

    def slot_path(self, index: int) -> str: ...


def prune_head(queue: PrunedQueue, older_than: float, now: float | None = None,
           below: int | None = None, limit: int | None = None) -> int:
    """Drop elements created more than ``older_than`` seconds ago from the head (never
    past an empty slot, nor to ``below`` when given: a consumer's position; at most
    ``limit`` of them); returns how many. The first kept index is recorded first, so a
    reader never sees a hole."""
    cutoff = (now or time.time()) - older_than
    client = queue.session.client
    start = queue.first()
    index = start
    with zk_errors(f"cannot prune queue {queue.name}"):
        while (below is None or index < below) and (limit is None or index < start + limit):
            stat = retry_policy()(client.exists, queue.slot_path(index))
            if stat is None or stat.ctime / 1000.0 >= cutoff:
                break
            index += 1
        if index == start:
            return 0
        data = str(index).encode()
        if retry_policy()(client.exists, f"{queue.root}/start") is None:
            retry_policy()(client.create, f"{queue.root}/start", data, makepath=True)
        else:
            retry_policy()(client.set, f"{queue.root}/start", data)
        for old in range(start, index):
            try:
                retry_policy()(client.delete, queue.slot_path(old))
            except NoNodeError:
                pass
        _prune_tokens(queue, cutoff, limit)
    return index - start

def _prune_tokens(queue: PrunedQueue, cutoff: float, limit: int | None) -> None:
    """Drop the records of :meth:`push_many` tokens older than ``cutoff``."""
    client = queue.session.client
    try:
        tokens = retry_policy()(client.get_children, f"{queue.root}/pushes")
    except NoNodeError:
        return
    for token in sorted(tokens)[:limit]:
        path = f"{queue.root}/pushes/{token}"
        with contextlib.suppress(NoNodeError):
            stat = retry_policy()(client.exists, path)
            if stat is not None and stat.ctime / 1000.0 < cutoff:
                retry_policy()(client.delete, path)
