"""LockBatch: several task locks of one session taken, or released, in one ZooKeeper
transaction (``multi``), beside the single :class:`~coord.lock.TaskLock`.

Taking: every lock's parent and node created, and the session's stamp node written
(:func:`stamp_path`), whose ``mzxid`` is the transaction's zxid and so every created node's
czxid: each lock's fencing token without a request of its own (a batch shares its token; per
task it still only grows). Releasing: each lock's node and parent deleted in one transaction.

Failure behaviour: a transaction refused by one lock names that operation: that lock goes
alone (the single lock's way, which looks for its own node first) and the others are sent
again, so a batch that partly loses keeps what it won; an answer lost or late (the transaction
may have been applied): each lock goes the single way, so none is left behind. No watch is set
per lock unless asked (``watch``): without it a lock is known lost only with its session.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from kazoo.exceptions import NoNodeError, RolledBackError

from coord._znodes import zk_errors
from coord.lock import STAMPS, TASK_LOCKS, TaskLock
from coord.session import Session, SessionState


def stamp_path(session: Session) -> str:
    """The session's stamp node (ephemeral, made at its first batch): written in every batch
    transaction of :meth:`LockBatch.try_acquire`, its mzxid is that transaction's zxid."""
    return f"{STAMPS}/{session.session_id:x}"


def _refused(results: Sequence[object]) -> int | None:
    """The index of the operation that refused a transaction (the ones before it come back
    RolledBackError, the ones after RuntimeInconsistency), None when it committed."""
    for n, result in enumerate(results):
        if isinstance(result, Exception) and not isinstance(result, RolledBackError):
            return n
    return None


def _send_locks(locks: Sequence[TaskLock], batch: list[int], prefixes: list[str]) -> Any:
    """Send the transaction that creates the ``batch`` locks' parents and nodes and writes the
    session's stamp (:func:`stamp_path`); its async result."""
    session = locks[batch[0]].session
    tx = session.client.transaction()
    for i in batch:
        tx.create(locks[i].parent, b"")
        tx.create(f"{locks[i].parent}/{prefixes[i]}", locks[i].owner.encode(),
                  ephemeral=True, sequence=True)
    tx.set_data(stamp_path(session), b"")
    return tx.commit_async()


class Acquiring:
    """A :meth:`LockBatch.send` under way: :meth:`tokens` awaits it (once)."""

    def __init__(self, locks: list[TaskLock], prefixes: list[str], watch: bool, sent: Any,
                 below: int = 0) -> None:
        self.locks, self.prefixes, self.watch, self.below = locks, prefixes, watch, below
        self._sent = sent

    def tokens(self) -> list[int | None]:
        """Each lock's token in order (None: held by someone else); see
        :meth:`LockBatch.try_acquire`."""
        locks, prefixes, watch = self.locks, self.prefixes, self.watch
        if not locks:
            return []
        session = locks[0].session
        client = session.client
        tokens: list[int | None] = [None] * len(locks)
        alone: list[tuple[int, bool]] = []  # (index, maybe sent)
        batch = list(range(len(locks)))
        sent, self._sent = self._sent, None
        with zk_errors("task locks"):
            while batch:
                if sent is None:
                    sent = _send_locks(locks, batch, prefixes)
                try:
                    results = sent.get(timeout=max(0.001, session.deadline - time.monotonic()))
                except Exception:  # lost, or no answer in time: it may have been applied
                    alone += [(i, True) for i in batch]
                    break
                sent = None
                failed = _refused(results)
                if failed is None:
                    token = int(results[-1].mzxid)
                    for n, i in enumerate(batch):
                        tokens[i] = locks[i]._won(str(results[2 * n + 1]), token, watch)
                    break
                if failed == len(results) - 1:  # no stamp of this session yet
                    client.retry(client.create, stamp_path(session), b"", ephemeral=True,
                                 makepath=True)
                    continue
                if failed % 2 == 0 and isinstance(results[failed], NoNodeError):
                    client.ensure_path(TASK_LOCKS)  # the first locks ever in this cluster
                    continue
                i = batch.pop(failed // 2)  # its parent exists: that lock alone
                alone.append((i, False))
        for i, maybe_sent in sorted(alone):
            lock = locks[i]
            with lock._mutex, zk_errors(f"task lock {lock.task_id}"):
                if not maybe_sent and lock._held_elsewhere():
                    continue  # refused: its parent has a holder (one read)
                tokens[i] = lock._try_acquire_or_none(prefixes[i], maybe_sent)
        return tokens


class LockBatch:
    """Several locks of one session, taken or released together (see the module)."""

    def __init__(self, locks: Sequence[TaskLock]) -> None:
        self.locks = list(locks)

    def try_acquire(self, *, watch: bool = True) -> list[int | None]:
        """:meth:`TaskLock.try_acquire` of the batch's new locks of one session in one ZooKeeper
        transaction (``multi``): every lock's parent and node created, and the session's stamp
        node written (:func:`stamp_path`), whose ``mzxid`` is the transaction's zxid and so
        every created node's czxid: each lock's token without a request of its own (a batch
        shares its token; per task it still only grows). The tokens in order (None: held by
        someone else).

        A transaction refused by one lock (its parent exists: held, or left empty by a holder
        whose session expired) names that operation: the others are sent again, so a batch
        that partly loses keeps what it won, and that lock is held elsewhere when its parent
        has a node (one read), else it goes the way of :meth:`try_acquire` alone. An answer
        lost or late (the transaction may have been applied): each lock goes the single way,
        which looks for its own node first, so none is left behind.

        ``watch``: set a watch on each node won (its deletion tells the lost listeners), one
        request each; without it a lock is known lost only with its session (the caller has
        another way to hear of a force-release: the runner's mailbox)."""
        return self.send(watch=watch).tokens()

    def send(self, *, watch: bool = True) -> Acquiring:
        """:meth:`try_acquire` with its transaction sent now and its outcome awaited by
        :meth:`Acquiring.tokens`, so that the caller can do something else meanwhile (the
        runner writes a new task's claim while its lock is being taken). ``Acquiring.below``
        is the last zxid this session saw before the transaction was sent: every node the
        transaction (or a try after it) creates has a greater czxid, and so has every later
        owner's, so it fences like a token of these locks (0 when the session saw none)."""
        locks = self.locks
        if not locks:
            return Acquiring([], [], True, None)
        session = locks[0].session
        if any(lock.session is not session or lock.is_held for lock in locks):
            raise ValueError("a lock batch takes new locks of one session")
        session.require_connected()
        prefixes = [f"{uuid.uuid4().hex}-lock-" for _ in locks]
        below = int(session.client.last_zxid or 0)
        with zk_errors("task locks"):
            sent = _send_locks(locks, list(range(len(locks))), prefixes)
        return Acquiring(list(locks), prefixes, watch, sent, below)

    def release(self) -> None:
        """:meth:`TaskLock.release` of the batch's locks (of one session) in one transaction:
        each lock's node and its parent deleted (deleting our own, uniquely named node is the
        ownership check: a lock taken away since is not ours to delete, and then that
        operation fails). A transaction refused by one lock (its node gone, a contender's node
        in its parent) releases that lock alone (:meth:`TaskLock.release`'s way: our node,
        then the parent if empty) and sends the others again. Locks already lost are skipped.
        A delete that fails while the session lives is tried again later (see
        :meth:`TaskLock._remove_or_later`); the first such failure is raised once every lock
        was tried."""
        held = []
        for lock in self.locks:
            with lock._mutex:
                node, lock._node, lock._token = lock._node, None, None
            if node is None:
                continue
            lock.session.remove_listener(lock._on_session)
            if lock.session.state is not SessionState.LOST:
                held.append((lock, node))
        if not held:
            return
        session = held[0][0].session
        client = session.client
        alone: list[tuple[TaskLock, str]] = []
        with zk_errors("task locks: release"):
            while held:
                tx = client.transaction()
                for lock, node in held:
                    tx.delete(node)
                    tx.delete(lock.parent)
                try:
                    results = tx.commit_async().get(
                        timeout=max(0.001, session.deadline - time.monotonic()))
                except Exception:  # lost or late: each alone (a retried delete is harmless)
                    alone += held
                    break
                failed = _refused(results)
                if failed is None:
                    break
                alone.append(held.pop(failed // 2))
            _remove_each(alone)


def _remove_each(held: Sequence[tuple[TaskLock, str]]) -> None:
    """:meth:`TaskLock._remove_or_later` of each (lock, node), every one tried though one
    fails; the first failure raised once all were."""
    failure: Exception | None = None
    for lock, node in held:
        try:
            lock._remove_or_later(node)
        except Exception as exc:
            failure = failure or exc
    if failure is not None:
        raise failure
