"""Slots: cluster-wide concurrency booking, optionally nested (total 30 > type 15 > partner 3).

A booking takes one ephemeral lease under every level it names, in one multi-op transaction that
also compare-and-sets each level node's data version. Two bookers that both saw room at a level
cannot both commit: the second transaction fails on the version and re-reads. So no level ever
holds more leases than its limit. (ZooKeeper's ``check`` op sees the data version only, not the
child version, which is why the transaction rewrites each level's data.)

A booking may also take **exclusive holds** (a resource, an ordering key: a limit of one) in
the same transaction: one ephemeral node ``slots/held/<name>`` each, created only if absent.
That is one write where a counted level of one costs three reads and a write, and a name leaves
nothing behind once released (a counted level's node stays).

Failure behaviour: a booking is released by ``release()``, and vanishes with the session (leases
and holds are ephemeral) when the holder dies or its session is LOST; a release while the link
is down waits for it and deletes what its session still owns (a delete that fails while the
session lives is tried again later: :mod:`coord.late`); a transaction whose reply was lost is
recognised on retry by its uuid-named lease or, with holds only, by the hold's ephemeral owner
being this session.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from coord._znodes import retry_policy, session_of, zk_errors
from coord.late import delete_later
from coord.session import Session

log = logging.getLogger(__name__)
SLOTS = "/slots"
HELD = f"{SLOTS}/held"


def _check_held_name(name: str) -> None:
    if not name or name.startswith("/") or ".." in name.split("/"):
        raise ValueError(f"invalid exclusive hold name {name!r}")


@dataclass(frozen=True)
class SlotLevel:
    """A level of the hierarchy: ``name`` is a path below ``slots/`` (e.g. ``type/enrich``)."""

    name: str
    limit: int

    def __post_init__(self) -> None:
        if self.limit < 0:
            raise ValueError(f"slot level {self.name}: limit must be >= 0")
        if not self.name or self.name.startswith("/") or ".." in self.name.split("/"):
            raise ValueError(f"invalid slot level name {self.name!r}")

    @property
    def path(self) -> str:
        return f"{SLOTS}/{self.name}"


class Booking:
    """Leases held at every level of one booking; ``release()`` frees them all at once.

    A booking is ``session_id``'s: its nodes are ephemeral and go with that session. So a
    release deletes only the nodes whose ephemeral owner is still that session: once it is
    gone (lost, and replaced by a new one while the release waited) an exclusive hold's name
    (``held/<name>``) may be the next holder's node, and deleting it would let a third party
    in beside it. A release while the link is down waits for it (see :meth:`_gone`)."""

    def __init__(self, session: Session, leases: list[str], session_id: int) -> None:
        self.session = session
        self.leases = leases
        self.session_id = session_id

    def release(self) -> None:
        if not self.leases:
            return
        leases, self.leases = self.leases, []

        def attempt() -> None:
            self._delete(leases)

        with zk_errors("cannot release slot leases"):
            try:
                retry_policy()(attempt)
            except Exception:  # the session lives on (else ``_delete`` returns): a live
                # session would keep these leases, and so the slots, for as long as it lives
                if not self._gone():
                    delete_later(self.session, self.session_id, attempt,
                                 f"slot leases {', '.join(leases)}")
                raise

    def _gone(self) -> bool:
        """Whether the session this booking was made on is gone, and its nodes with it: kazoo
        is connected on another one, or not connected and the session is not the booking's
        any more (LOST, past its deadline, replaced). Not connected is not gone: a link down
        (a leader election) leaves the session and its nodes, and a release that took it for
        gone deleted nothing while the live session kept the holds, and every task needing
        them waited, for ever."""
        client_id = self.session.client.client_id
        if client_id is not None:
            return int(client_id[0]) != self.session_id
        return self.session.expired(self.session_id)

    def _delete(self, leases: list[str]) -> None:
        """Delete those of ``leases`` that are still this booking's (its session their
        ephemeral owner: a name another session holds by now is theirs), in one transaction;
        raises kazoo's ConnectionLoss while the link is down (retried by the caller)."""
        if self._gone():
            return
        client = self.session.client
        reads = [(lease, client.exists_async(lease)) for lease in leases]
        mine = [(lease, stat.version) for lease, stat in ((lease, r.get()) for lease, r in reads)
                if stat is not None and stat.ephemeralOwner == self.session_id]
        if not mine:
            return
        tx = client.transaction()
        for lease, version in mine:
            tx.delete(lease, version=version)
        if not any(isinstance(r, Exception) for r in tx.commit()):
            return
        for lease, version in mine:  # one went meanwhile: delete the others one by one
            try:
                client.delete(lease, version=version)
            except (NoNodeError, BadVersionError):
                pass

    def __enter__(self) -> Booking:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Slots:
    """Books slots for ``levels`` (outermost first) on behalf of ``owner``."""

    def __init__(self, session: Session, owner: str, max_attempts: int = 50) -> None:
        self.session = session
        self.owner = owner
        self.max_attempts = max_attempts
        self._ensured: set[str] = set()  # level nodes known to exist (they are never deleted)

    def try_book(self, levels: Sequence[SlotLevel],
                 exclusive: Sequence[str] = ()) -> Booking | None:
        """A booking when every level has room and no ``exclusive`` name is held (by anyone,
        this owner too), else None. Never waits for a slot to free up."""
        if not levels and not exclusive:
            raise ValueError("a booking needs at least one level or exclusive hold")
        for name in exclusive:
            _check_held_name(name)
        self.session.require_connected()
        client = self.session.client
        lease_name = f"{uuid.uuid4().hex}-lease"
        held = [f"{HELD}/{name}" for name in sorted(set(exclusive))]
        with zk_errors("slot booking failed"):
            parents = [level.path for level in levels] + sorted(
                {h.rsplit("/", 1)[0] for h in held})
            for path in parents:
                if path not in self._ensured:
                    client.retry(client.ensure_path, path)
                    self._ensured.add(path)
            tried: list[bool] = []  # a commit whose reply was lost is looked for on a retry
            for attempt in range(self.max_attempts):
                outcome = retry_policy()(self._attempt, levels, held, lease_name, tried)
                if outcome is None or isinstance(outcome, Booking):
                    return outcome
                time.sleep(random.uniform(0, min(0.05, 0.002 * 2 ** attempt)))
        log.warning("slots %s: gave up after %d conflicting attempts",
                    [lv.name for lv in levels], self.max_attempts)
        return None

    def _attempt(self, levels: Sequence[SlotLevel], held: list[str], lease_name: str,
                 tried: list[bool]) -> Booking | object | None:
        client = self.session.client
        # the session this try runs on, read before the commit (kazoo's: the Session's view
        # of a new session comes a moment later, and a booking named after the old one was
        # never released; a new session fails every call of the old one, so a retry reads it
        # again). Read after the commit, a link down just after the reply raised, and the
        # booking made was lost
        session_id = session_of(client)
        leases = [f"{level.path}/{lease_name}" for level in levels]
        retry, tried[:] = bool(tried), [True]
        if retry and leases and client.exists(leases[0]) is not None:
            return Booking(self.session, leases + held, session_id)  # reply lost
        if retry and not leases:
            stat = client.exists(held[0])
            if stat is not None and stat.ephemeralOwner == session_id:
                # ours (a commit whose reply was lost), unless this owner holds it already:
                # a second booking of a name it holds is refused like anyone else's
                data, _ = client.get(held[0])
                if data == self._hold_data(lease_name):
                    return Booking(self.session, held, session_id)
        tx = client.transaction()
        for level in levels:
            data, stat = client.get(level.path)  # version first, then the children
            taken = len(client.get_children(level.path))
            if taken >= level.limit:
                return None
            tx.set_data(level.path, data, version=stat.version)
        for lease in leases:
            tx.create(lease, self.owner.encode(), ephemeral=True)
        for path in held:
            tx.create(path, self._hold_data(lease_name), ephemeral=True)
        results = tx.commit()
        if not any(isinstance(r, Exception) for r in results):
            return Booking(self.session, leases + held, session_id)
        if any(isinstance(r, NodeExistsError) for r in results[len(levels) + len(leases):]):
            return None  # a name held by someone
        if any(isinstance(r, BadVersionError) for r in results):
            return _CONFLICT
        for result in results:
            if isinstance(result, Exception) and not _is_rolled_back(result):
                raise result
        return _CONFLICT

    def _hold_data(self, lease_name: str) -> bytes:
        """An exclusive hold's data: the owner, then the booking's uuid (a retry after a lost
        reply recognises its own)."""
        return f"{self.owner}\n{lease_name}".encode()

    def usage(self, level: SlotLevel) -> int:
        with zk_errors("cannot read slot usage"):
            try:
                return len(self.session.client.get_children(level.path))
            except NoNodeError:
                return 0


_CONFLICT = object()


def exclusive_holders(session: Session, group: str) -> dict[str, str]:
    """The exclusive holds directly below ``slots/held/<group>/``, each with its owner (what an
    operator's status shows)."""
    client = session.client
    found: dict[str, str] = {}
    with zk_errors("cannot read exclusive holds"):
        try:
            names = retry_policy()(client.get_children, f"{HELD}/{group}")
        except NoNodeError:
            return found
        for name in sorted(names):
            try:
                data, _ = retry_policy()(client.get, f"{HELD}/{group}/{name}")
            except NoNodeError:
                continue  # released meanwhile
            found[name] = data.decode().split("\n", 1)[0]
    return found


def holders(session: Session, group: str) -> dict[str, list[str]]:
    """The levels directly below ``slots/<group>/`` that hold leases, each with its holders'
    owner ids (what an operator's status shows; levels without leases are left out)."""
    client = session.client
    found: dict[str, list[str]] = {}
    with zk_errors("cannot read slot usage"):
        try:
            names = retry_policy()(client.get_children, f"{SLOTS}/{group}")
        except NoNodeError:
            return found
        for name in sorted(names):
            level = f"{SLOTS}/{group}/{name}"
            owners = []
            try:
                leases = retry_policy()(client.get_children, level)
            except NoNodeError:
                continue
            for lease in leases:
                try:
                    data, _ = retry_policy()(client.get, f"{level}/{lease}")
                except NoNodeError:
                    continue  # released meanwhile
                owners.append(data.decode())
            if owners:
                found[name] = sorted(owners)
    return found


def _is_rolled_back(exc: Exception) -> bool:
    return type(exc).__name__ in ("RolledBackError", "RuntimeInconsistency")
