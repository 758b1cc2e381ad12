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

Several locks of one session are taken and released in one transaction by
:class:`coord.lockbatch.LockBatch`; the master's view of held locks (``held_locks``,
``lock_owner``, ``force_release``) is in :mod:`coord.lockview`.

Why one module: a lock's acquire, verify, release and loss act on one node under one mutex,
and each case of the failure list above is a branch of more than one of them.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import (
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
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


def lock_path(task_id: str) -> str:
    if not task_id or "/" in task_id:
        raise ValueError(f"invalid task id {task_id!r}")
    return f"{TASK_LOCKS}/{task_id}"


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
