"""TaskLock: a non-blocking per-task lock with an owner and a fencing token.

Layout: ``locks/tasks/<task-id>/<uuid>-lock-<seq>`` (ephemeral sequential), data = owner member
id. The lowest node holds the lock. The fencing token is the holder node's czxid: ZooKeeper's
transaction ids only grow, so successive owners of a task get strictly increasing tokens, and
a store can refuse writes that carry an older token than the last one it saw.

``try_acquire()`` never waits for another owner: when the task's lock parent has children it
returns None after one read; a contender that is not lowest (it raced into an empty parent)
removes its own node at once and returns None. Creating the parent and the node is one multi-op
transaction, and releasing deletes both in one transaction, so an uncontended cycle costs three
round trips (the same as kazoo's blocking ``Lock``), and no empty parent is left behind.

Failure behaviour:

* a lost reply (connection blip) during a try: the retry looks for our uuid-prefixed node
  before creating another, and cleanup of a failed try retries until the node is gone, so no
  orphan contender node is left (kazoo issue 732); errors other than connection loss propagate;
* a release that fails while the session lives (connection loss past its retries) raises, and
  its delete is tried again later (:mod:`coord.late`) until done or the session is gone: a
  live session would keep the node, and so the lock, for as long as it lives;
* session LOST: the node is gone; lost listeners are told; ``release()`` is then a no-op;
* the node deleted under us (``force_release`` by the master): lost listeners are told;
* SUSPENDED: the lock is in doubt, not lost: ``verify()`` waits for RECONNECTED (held) or LOST
  (not), bounded by the session's deadline; the Session turns a long suspension into LOST.

Why one module: the lock and the master's view of held locks (``held_locks``, ``lock_owner``,
``force_release``) read and write the same znode layout; keeping them together keeps that
layout in one place.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import (
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import EventType, WatchedEvent

from coord._znodes import create_protected, find_own, retry_policy, sort_by_seq, zk_errors
from coord.errors import LockNotHeld
from coord.late import delete_later
from coord.session import Session, SessionState

log = logging.getLogger(__name__)
TASK_LOCKS = "/locks/tasks"
STAMPS = "/locks/stamps"

LockLostListener = Callable[[str], None]


def stamp_path(session: Session) -> str:
    """The session's stamp node (ephemeral, made at its first batch): written in every batch
    transaction of :meth:`TaskLock.try_acquire_all`, its mzxid is that transaction's zxid."""
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
    """A :meth:`TaskLock.acquire_all_sent` under way: :meth:`tokens` awaits it (once)."""

    def __init__(self, locks: list[TaskLock], prefixes: list[str], watch: bool, sent: Any,
                 below: int = 0) -> None:
        self.locks, self.prefixes, self.watch, self.below = locks, prefixes, watch, below
        self._sent = sent

    def tokens(self) -> list[int | None]:
        """Each lock's token in order (None: held by someone else); see
        :meth:`TaskLock.try_acquire_all`."""
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


def lock_path(task_id: str) -> str:
    if not task_id or "/" in task_id:
        raise ValueError(f"invalid task id {task_id!r}")
    return f"{TASK_LOCKS}/{task_id}"


@dataclass(frozen=True)
class HeldLock:
    task_id: str
    owner: str
    token: int
    since: float  # epoch seconds when the holder's node was created


class TaskLock:
    """The lock of one task, tried on behalf of ``owner`` (a member id)."""

    def __init__(self, session: Session, task_id: str, owner: str) -> None:
        self.session = session
        self.task_id = task_id
        self.owner = owner
        self.parent = lock_path(task_id)
        self._node: str | None = None
        self._token: int | None = None
        self._lost_listeners: list[LockLostListener] = []
        self._mutex = threading.Lock()

    @property
    def is_held(self) -> bool:
        return self._node is not None

    @property
    def token(self) -> int:
        if self._token is None:
            raise LockNotHeld(f"lock of task {self.task_id} is not held by {self.owner}")
        return self._token

    def verify(self) -> bool:
        """Whether this owner still holds the lock, asked of the server (one read): our node
        exists with the czxid we got as token.

        While the session is SUSPENDED the answer waits, at most until the session's deadline
        (:meth:`Session.confirm`): the node lives as long as the session, so a connection that
        comes back in time (a ZooKeeper leader election) confirms the lock, and one that does
        not is False. A read cut by a dropped connection is asked again the same way. False on
        any other error, and once the session is LOST or past its deadline."""
        while True:
            node, token = self._node, self._token
            if node is None or not self.session.confirm():
                return False
            try:
                stat = self.session.client.exists_async(node).get(
                    timeout=max(0.001, self.session.deadline - time.monotonic()))
            except (ConnectionLoss, KazooTimeoutError):
                continue  # dropped under the read, or no answer yet: confirm again
            except Exception:  # any other doubt is "not held"
                return False
            return stat is not None and stat.czxid == token

    def add_lost_listener(self, listener: LockLostListener) -> None:
        """``listener(task_id)`` when a held lock is lost; called on kazoo's or the session's
        thread: hand work to another thread rather than block there."""
        self._lost_listeners.append(listener)

    # -- acquire ---------------------------------------------------------------------------

    def try_acquire(self) -> int | None:
        """The fencing token if this owner now holds the lock, None if someone else does."""
        with self._mutex:
            if self._node is not None:
                return self._token
            self.session.require_connected()
            with zk_errors(f"task lock {self.task_id}"):
                return self._try_acquire_or_none(None, sent=False)

    def try_acquire_new(self) -> int | None:
        """:meth:`try_acquire` of the lock of a task nobody else can know of yet (its id made
        just now, written nowhere), in one round trip instead of two: the parent-and-node
        transaction and the watch on the node it creates are sent together, because the first
        sequential child of a parent created in the same transaction is numbered 0. Anything
        else (the parent exists after all, the transaction refused, an answer lost) goes the
        way of :meth:`try_acquire`, which looks for this try's node before creating another."""
        with self._mutex:
            if self._node is not None:
                return self._token
            session = self.session
            session.require_connected()
            client = session.client
            prefix = f"{uuid.uuid4().hex}-lock-"
            node = f"{self.parent}/{prefix}{0:010d}"
            with zk_errors(f"task lock {self.task_id}"):
                created = self._transaction(prefix).commit_async()
                watched = client.exists_async(node, watch=self._on_node_event)
                try:
                    results = created.get(timeout=max(0.001, session.deadline - time.monotonic()))
                    stat = watched.get(timeout=max(0.001, session.deadline - time.monotonic()))
                except Exception:  # lost, or no answer in time: it may have been applied
                    return self._try_acquire_or_none(prefix, sent=True)
                if any(isinstance(r, Exception) for r in results) or str(results[1]) != node:
                    # the parent exists, or no /locks/tasks yet: a watch on a name that no node
                    # of this try will have is left set (it never fires)
                    return self._try_acquire_or_none(prefix, sent=False)
                if stat is None:  # gone already (the session lost): not held
                    return None
                self._node, self._token = node, stat.czxid
                session.add_listener(self._on_session)
                return int(stat.czxid)

    def _try_acquire_or_none(self, prefix: str | None, sent: bool) -> int | None:
        try:
            return self._try_acquire(prefix, sent)
        except NoNodeError:
            return None  # lost a race with concurrent releases twice: someone runs it

    def _try_acquire(self, prefix: str | None = None, sent: bool = False) -> int | None:
        """``prefix``: this try's unique node prefix, and ``sent``: a first transaction with it
        may have been sent already (its reply lost): it is looked for before another is."""
        client = self.session.client
        prefix = prefix or f"{uuid.uuid4().hex}-lock-"
        data = self.owner.encode()
        for _ in range(3):
            node = self._create_with_parent(prefix, data, sent)
            sent = False
            if node is not None:
                return self._held(node)
            # the parent exists: a holder or contender is there (one read, no node of ours to
            # create and remove), or it is empty (its holder's session expired)
            try:
                if client.retry(client.get_children, self.parent):
                    return None
            except NoNodeError:
                continue  # released meanwhile: start over
            try:
                node, _ = create_protected(client, self.parent, prefix, data, retry_policy())
            except NoNodeError:
                continue  # the parent was released between our two creates: start over
            children = sort_by_seq(client.retry(client.get_children, self.parent))
            if children and f"{self.parent}/{children[0]}" == node:
                return self._held(node)
            self._remove_or_later(node)
            return None
        raise NoNodeError(self.parent)

    def _create_with_parent(self, prefix: str, data: bytes, sent: bool = False) -> str | None:
        """Create the parent and our node in one transaction; None when the parent exists.
        ``sent``: one was sent already and its answer lost."""
        client = self.session.client
        attempts = 1 if sent else 0

        def commit() -> list[object]:
            tx = client.transaction()
            tx.create(self.parent, b"")
            tx.create(f"{self.parent}/{prefix}", data, ephemeral=True, sequence=True)
            results: list[object] = tx.commit()
            return results

        def attempt() -> str | None:
            nonlocal attempts
            attempts += 1
            if attempts > 1:  # the last reply was lost: did that transaction commit?
                existing = find_own(client, self.parent, prefix)
                if existing is not None:
                    return existing
            results = commit()
            if isinstance(results[0], NoNodeError):  # the first lock ever in this cluster
                client.ensure_path(TASK_LOCKS)
                results = commit()
            if isinstance(results[0], NodeExistsError):
                return None
            for result in results:
                if isinstance(result, Exception):
                    raise result
            return str(results[1])

        node: str | None = retry_policy()(attempt)
        return node

    def _transaction(self, prefix: str) -> Any:
        """The parent-and-node transaction of a try with ``prefix``, not committed."""
        tx = self.session.client.transaction()
        tx.create(self.parent, b"")
        tx.create(f"{self.parent}/{prefix}", self.owner.encode(), ephemeral=True, sequence=True)
        return tx

    def _held(self, node: str) -> int:
        client = self.session.client
        stat = client.retry(client.exists, node, watch=self._on_node_event)
        if stat is None:
            raise NoNodeError(node)
        self._node, self._token = node, stat.czxid
        self.session.add_listener(self._on_session)
        return int(stat.czxid)

    @staticmethod
    def try_acquire_all(locks: Sequence[TaskLock], *, watch: bool = True) -> list[int | None]:
        """:meth:`try_acquire` of several new locks of one session in one ZooKeeper
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
        return TaskLock.acquire_all_sent(locks, watch=watch).tokens()

    @staticmethod
    def acquire_all_sent(locks: Sequence[TaskLock], *, watch: bool = True) -> Acquiring:
        """:meth:`try_acquire_all` with its transaction sent now and its outcome awaited by
        :meth:`Acquiring.tokens`, so that the caller can do something else meanwhile (the
        runner writes a new task's claim while its lock is being taken). ``Acquiring.below``
        is the last zxid this session saw before the transaction was sent: every node the
        transaction (or a try after it) creates has a greater czxid, and so has every later
        owner's, so it fences like a token of these locks (0 when the session saw none)."""
        if not locks:
            return Acquiring([], [], True, None)
        session = locks[0].session
        if any(lock.session is not session or lock.is_held for lock in locks):
            raise ValueError("try_acquire_all takes new locks of one session")
        session.require_connected()
        prefixes = [f"{uuid.uuid4().hex}-lock-" for _ in locks]
        below = int(session.client.last_zxid or 0)
        with zk_errors("task locks"):
            sent = _send_locks(locks, list(range(len(locks))), prefixes)
        return Acquiring(list(locks), prefixes, watch, sent, below)

    def _held_elsewhere(self) -> bool:
        """Whether this lock's parent, which refused a batch's create, has a holder (one read):
        then the lock is someone else's; False when it is gone or empty (its holder's session
        expired), for :meth:`_try_acquire` to take it."""
        client = self.session.client
        try:
            return bool(client.retry(client.get_children, self.parent))
        except NoNodeError:
            return False

    def _won(self, node: str, token: int, watch: bool) -> int:
        """Record ``node`` as held with ``token`` (a batch's); ``watch``: one request more."""
        with self._mutex:
            self._node, self._token = node, token
        if watch:
            self.session.client.exists_async(node, watch=self._on_node_event)
        self.session.add_listener(self._on_session)
        return token

    @staticmethod
    def release_all(locks: Sequence[TaskLock]) -> None:
        """:meth:`release` of several locks of one session in one transaction: each lock's
        node and its parent deleted (deleting our own, uniquely named node is the ownership
        check: a lock taken away since is not ours to delete, and then that operation fails).
        A transaction refused by one lock (its node gone, a contender's node in its parent)
        releases that lock alone (:meth:`release`'s way: our node, then the parent if empty)
        and sends the others again. Locks already lost are skipped. A delete that fails while
        the session lives is tried again later (see :meth:`_remove_or_later`); the first such
        failure is raised once every lock was tried."""
        held = []
        for lock in locks:
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

    # -- release ---------------------------------------------------------------------------

    def release(self) -> None:
        """Delete our node and, when no one else contends, the task's lock parent.

        A lock already lost (session LOST, force-released) is released without error.
        """
        with self._mutex:
            node, self._node, self._token = self._node, None, None
            if node is None:
                return
            self.session.remove_listener(self._on_session)
            if self.session.state is SessionState.LOST:
                return  # the node went with the session
            with zk_errors(f"task lock {self.task_id}: release"):
                self._remove_or_later(node)

    def _remove_or_later(self, node: str) -> None:
        """:meth:`_remove`; when that fails while the session lives (connection loss past
        the retries, an error of the delete), the delete is tried again later
        (:func:`coord.late.delete_later`): a live session keeps its node for as long as it
        lives, so a release given up would hold the task's lock for ever. Raises the
        failure all the same."""
        session = self.session
        session_id = session.session_id
        try:
            self._remove(node)
        except Exception:
            if not session.expired(session_id):
                delete_later(session, session_id, lambda: self._remove(node),
                             f"task lock {self.task_id}: node {node}")
            raise

    def _remove(self, node: str) -> None:
        """Delete ``node`` and then, if it is empty, the task's lock parent; retried on
        connection loss. Whoever removes the last child removes the parent: a contender that
        leaves after the holder's release found it busy deletes it then.
        """
        client = self.session.client

        def attempt() -> None:
            tx = client.transaction()
            tx.delete(node)
            tx.delete(self.parent)
            if not any(isinstance(r, Exception) for r in tx.commit()):
                return
            # Someone else's node is there (NotEmpty), or a retried commit already removed ours
            # (NoNode): delete ours alone, then the parent if it emptied meanwhile. Any other
            # error surfaces from these calls.
            try:
                client.delete(node)
            except NoNodeError:
                pass
            try:
                client.delete(self.parent)
            except (NoNodeError, NotEmptyError):
                pass

        retry_policy()(attempt)

    def __enter__(self) -> TaskLock:
        if self.try_acquire() is None:
            raise LockNotHeld(f"lock of task {self.task_id} is held by someone else")
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # -- loss ------------------------------------------------------------------------------

    def _on_node_event(self, event: WatchedEvent) -> None:
        if event.type == EventType.DELETED and self._node == event.path:
            self._lost("its node was deleted")

    def _on_session(self, state: SessionState) -> None:
        if state is SessionState.LOST and self._node is not None:
            self._lost("the ZooKeeper session was lost")

    def _lost(self, why: str) -> None:
        with self._mutex:
            if self._node is None:
                return
            self._node, self._token = None, None
        self.session.remove_listener(self._on_session)
        log.warning("task %s: lock of %s lost: %s", self.task_id, self.owner, why)
        for listener in list(self._lost_listeners):
            try:
                listener(self.task_id)
            except Exception:
                log.exception("lock-lost listener %r failed for task %s", listener, self.task_id)


# -- anyone's view of the locks -----------------------------------------------------------------


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

