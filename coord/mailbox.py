"""Mailbox: short messages to one member, through ZooKeeper, at no cost while none is sent.

Layout: ``mailboxes/<member-id>`` (persistent), one persistent child per message
``<name>`` with its data. The owner watches its mailbox's children (kazoo's ``ChildrenWatch``:
one watch, set again after each change and after a reconnect); each message is handed to its
listener once, on a thread of the mailbox's own (never kazoo's: a listener may do ZooKeeper
I/O), then deleted. A sender creates the child (:func:`post`); a message posted twice under
one name is one message.

The runner's use: an operator's cancel tells the task's owner to stop its handler
(``cancel-<task-id>``), without a watch per task lock.

Failure behaviour:

* the owner disconnected: the message waits in its mailbox and is delivered when the watch is
  set again (same session or a new one); a message may be delivered twice if the owner dies
  between the listener and the delete (the listener is idempotent in the runner's use);
* no mailbox (the member is not running, or gone): :func:`post` returns False;
* the member gone for good: its mailbox stays until :func:`prune` (the master, with the live
  members) deletes it with its messages;
* a listener that raises: logged, the message deleted all the same (it is not retried).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable

from kazoo.exceptions import NodeExistsError, NoNodeError, NotEmptyError
from kazoo.recipe.watchers import ChildrenWatch

from coord._znodes import zk_errors
from coord.errors import LifecycleError
from coord.session import Session

log = logging.getLogger(__name__)
MAILBOXES = "/mailboxes"

MailListener = Callable[[str, bytes], None]


def mailbox_path(member_id: str) -> str:
    if not member_id or "/" in member_id:
        raise ValueError(f"invalid member id {member_id!r}")
    return f"{MAILBOXES}/{member_id}"


class Mailbox:
    """The mailbox of ``member_id``: :meth:`start` makes it and delivers every message to
    ``listener(name, data)``; :meth:`close` stops delivering and deletes it."""

    def __init__(self, session: Session, member_id: str, listener: MailListener) -> None:
        self.session = session
        self.member_id = member_id
        self.path = mailbox_path(member_id)
        self.listener = listener
        self._inbox: queue.Queue[list[str] | None] = queue.Queue()
        self._seen: set[str] = set()
        self._started = False
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._deliver, name=f"mailbox-{member_id}",
                                        daemon=True)

    def start(self) -> Mailbox:
        if self._started:
            raise LifecycleError("a mailbox starts once")
        self._started = True
        client = self.session.client
        with zk_errors(f"mailbox of {self.member_id}"):
            client.retry(client.ensure_path, self.path)
        self._thread.start()
        ChildrenWatch(client, self.path, self._on_children)
        return self

    def _on_children(self, children: list[str]) -> bool:
        """kazoo's thread: hand the names on; False stops the watch once closed."""
        if self._closed.is_set():
            return False
        self._inbox.put(list(children))
        return True

    def _deliver(self) -> None:
        client = self.session.client
        while True:
            names = self._inbox.get()
            if names is None:
                return
            for name in sorted(set(names) - self._seen):
                node = f"{self.path}/{name}"
                try:
                    data, _ = client.retry(client.get, node)
                except NoNodeError:
                    continue  # delivered and deleted already
                except Exception:
                    log.warning("mailbox of %s: cannot read %s; it is read at the next change",
                                self.member_id, name, exc_info=True)
                    continue
                self._seen.add(name)
                try:
                    self.listener(name, bytes(data))
                except Exception:
                    log.exception("mailbox of %s: the listener failed on %s", self.member_id,
                                  name)
                try:
                    client.retry(client.delete, node)
                except NoNodeError:
                    pass
                except Exception:
                    log.warning("mailbox of %s: %s not deleted", self.member_id, name,
                                exc_info=True)
                self._seen.discard(name)

    def close(self) -> None:
        """Stop delivering, then delete the mailbox with what it still holds. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._inbox.put(None)
        if self._thread.is_alive():
            self._thread.join(5.0)
        def delete() -> None:
            client = self.session.client
            try:
                client.retry(client.delete, self.path, recursive=True)
            except NoNodeError:
                pass
        self.session.tidy(f"mailbox of {self.member_id} (for the master to prune)", delete)

    def __enter__(self) -> Mailbox:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def post(session: Session, member_id: str, name: str, data: bytes = b"") -> bool:
    """Leave message ``name`` in ``member_id``'s mailbox; False when it has none (not running,
    or gone). The same name posted again while unread is one message."""
    if not name or "/" in name:
        raise ValueError(f"invalid message name {name!r}")
    client = session.client
    with zk_errors(f"posting to {member_id}"):
        try:
            client.retry(client.create, f"{mailbox_path(member_id)}/{name}", data)
        except NodeExistsError:
            pass
        except NoNodeError:
            return False
    return True


def prune(session: Session, live: Iterable[str]) -> list[str]:
    """Delete the mailboxes of members not in ``live`` (with their messages); their ids."""
    client = session.client
    keep = set(live)
    removed = []
    with zk_errors("pruning mailboxes"):
        try:
            boxes = client.get_children(MAILBOXES)
        except NoNodeError:
            return []
        for member_id in boxes:
            if member_id in keep:
                continue
            try:
                client.delete(f"{MAILBOXES}/{member_id}", recursive=True)
                removed.append(member_id)
            except (NoNodeError, NotEmptyError):
                continue
    return removed
