"""Membership: every live node has an ephemeral ``members/<host>:<pid>:<short-uuid>`` znode.

Failure behaviour:

* killed -9 or frozen: the node's znode vanishes when the server expires its session (within
  the session timeout plus one tick); other members' leave listeners fire;
* session LOST: the znode is gone; as soon as a new session is CONNECTED the member registers
  again under the same id (join listeners elsewhere fire again);
* id already registered by another live session: :class:`MemberIdTaken` from ``start()``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError
from kazoo.recipe.watchers import ChildrenWatch

from coord._znodes import read_children, session_of, zk_errors
from coord.errors import ConnectionLost, LifecycleError, MemberIdTaken
from coord.session import Session, SessionState

log = logging.getLogger(__name__)
MEMBERS = "/members"

MembershipListener = Callable[[str], None]


def new_member_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class MemberInfo:
    member_id: str
    host: str
    pid: int
    started_at: float
    version: str
    #: what the member declares to the others (JSON): the runner puts its commands here
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return json.dumps({"host": self.host, "pid": self.pid, "started_at": self.started_at,
                           "version": self.version, "details": self.details}).encode()

    @classmethod
    def from_json(cls, member_id: str, data: bytes) -> MemberInfo:
        try:
            raw = json.loads(data or b"{}")
            details = raw.get("details")
            return cls(member_id, str(raw.get("host", "")), int(raw.get("pid", 0)),
                       float(raw.get("started_at", 0.0)), str(raw.get("version", "")),
                       details if isinstance(details, dict) else {})
        except (ValueError, TypeError):
            # A foreign or damaged node still counts as a member; its data is just unknown.
            host, _, _ = member_id.partition(":")
            return cls(member_id, host, 0, 0.0, "")


class Membership:
    """Registers this process as a member and tells listeners who joins and leaves."""

    def __init__(self, session: Session, member_id: str | None = None,
                 version: str = "0.1.0", details: dict[str, Any] | None = None) -> None:
        self.session = session
        self.member_id = member_id or new_member_id()
        host, _, _ = self.member_id.partition(":")
        self.info = MemberInfo(self.member_id, host or socket.gethostname(), os.getpid(),
                               time.time(), version, dict(details or {}))
        self._started = False
        self._closed = False
        self._join: list[MembershipListener] = []
        self._leave: list[MembershipListener] = []
        self._known: set[str] = set()
        self._seen = False  # the children watch has reported at least once
        self._lock = threading.Lock()
        self._watch: ChildrenWatch | None = None

    @property
    def path(self) -> str:
        return f"{MEMBERS}/{self.member_id}"

    def start(self) -> Membership:
        if self._started:
            raise LifecycleError("membership already started")
        self._started = True
        self._register()
        self.session.add_listener(self._on_session)
        # kazoo's ChildrenWatch re-arms itself after a session loss.
        self._watch = ChildrenWatch(self.session.client, MEMBERS, self._on_children)
        return self

    def close(self) -> None:
        """Leave the cluster at once (others see the leave without waiting for a timeout)."""
        if self._closed or not self._started:
            return
        self._closed = True
        self.session.remove_listener(self._on_session)
        def delete() -> None:
            client = self.session.client
            try:
                client.retry(client.delete, self.path)
            except NoNodeError:
                pass
        self.session.tidy(f"member {self.member_id}: {self.path} (goes with the session)",
                          delete)

    def __enter__(self) -> Membership:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- registration ----------------------------------------------------------------------

    def _register(self) -> None:
        client = self.session.client

        def create() -> None:
            try:
                client.create(self.path, self.info.to_json(), ephemeral=True, makepath=True)
            except NodeExistsError:
                stat = client.exists(self.path)
                if stat is None:
                    raise  # raced with its deletion: let the retry create it again
                if stat.ephemeralOwner != session_of(client):
                    raise MemberIdTaken(f"member id {self.member_id} is registered by another "
                                        f"live session (0x{stat.ephemeralOwner:x})") from None
                # ours: a retried create whose first reply was lost

        with zk_errors(f"cannot register member {self.member_id}"):
            client.retry(create)

    def _on_session(self, state: SessionState) -> None:
        # Runs on the session's dispatch thread: I/O is allowed here.
        if state is SessionState.CONNECTED and not self._closed:
            try:
                if self.session.client.exists(self.path) is None:
                    log.info("member %s: registering again after a new session", self.member_id)
                    self._register()
            except (KazooException, ConnectionLost) as exc:
                log.warning("member %s: re-registration failed (%r); retrying on the next "
                            "connect", self.member_id, exc)

    # -- queries ---------------------------------------------------------------------------

    def members(self) -> dict[str, MemberInfo]:
        """Every live member, by id."""
        return read_members(self.session)

    def live_ids(self) -> set[str] | None:
        """The live member ids as this member's children watch last reported them (no read);
        None before its first report. It trails ZooKeeper by the watch's delivery time: use it
        where a stale view costs only efficiency, and ``is_alive`` where it must be exact."""
        with self._lock:
            return set(self._known) if self._seen else None

    def is_alive(self, member_id: str) -> bool:
        with zk_errors("cannot read membership"):
            return self.session.client.exists(f"{MEMBERS}/{member_id}") is not None

    # -- listeners -------------------------------------------------------------------------

    def add_listener(self, on_join: MembershipListener | None = None,
                     on_leave: MembershipListener | None = None) -> None:
        """``on_join(member_id)`` / ``on_leave(member_id)``; called on kazoo's watch thread, so
        they must not block on ZooKeeper I/O (hand the work to a thread)."""
        if on_join is not None:
            self._join.append(on_join)
        if on_leave is not None:
            self._leave.append(on_leave)

    def _on_children(self, children: list[str]) -> None:
        with self._lock:
            current = set(children)
            joined, left = current - self._known, self._known - current
            self._known = current
            self._seen = True
        for member_id in sorted(joined):
            for listener in list(self._join):
                _call(listener, member_id)
        for member_id in sorted(left):
            for listener in list(self._leave):
                _call(listener, member_id)


def _call(listener: MembershipListener, member_id: str) -> None:
    try:
        listener(member_id)
    except Exception:
        log.exception("membership listener %r failed for %s", listener, member_id)


def live_member_ids(session: Session) -> set[str]:
    """The ids of the live members (one read, without their data)."""
    client = session.client
    with zk_errors("cannot read membership"):
        try:
            return set(client.get_children(MEMBERS))
        except NoNodeError:
            return set()


def read_members(session: Session) -> dict[str, MemberInfo]:
    """Live members as any client sees them (a participant or not)."""
    with zk_errors("cannot read membership"):
        entries = read_children(session.client, MEMBERS)
    return {member_id: MemberInfo.from_json(member_id, data)
            for member_id, data in entries.items()}
