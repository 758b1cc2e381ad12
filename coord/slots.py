"""Slots: cluster-wide concurrency booking, optionally nested (total 30 > type 15 > partner 3).

A booking takes one ephemeral lease under every level it names, in one multi-op transaction that
also compare-and-sets each level node's data version. Two bookers that both saw room at a level
cannot both commit: the second transaction fails on the version and re-reads. So no level ever
holds more leases than its limit. (ZooKeeper's ``check`` op sees the data version only, not the
child version, which is why the transaction rewrites each level's data.)

Failure behaviour: a booking is released by ``release()``, and vanishes with the session (leases
are ephemeral) when the holder dies or its session is LOST; a transaction whose reply was lost is
recognised on retry by its uuid-named lease.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from kazoo.exceptions import BadVersionError, NoNodeError

from coord._znodes import retry_policy, zk_errors
from coord.session import Session

log = logging.getLogger(__name__)
SLOTS = "/slots"


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
    """Leases held at every level of one booking; ``release()`` frees them all at once."""

    def __init__(self, session: Session, leases: list[str]) -> None:
        self.session = session
        self.leases = leases

    def release(self) -> None:
        if not self.leases:
            return
        client = self.session.client
        leases, self.leases = self.leases, []

        def attempt() -> None:
            tx = client.transaction()
            for lease in leases:
                tx.delete(lease)
            if not any(isinstance(r, Exception) for r in tx.commit()):
                return
            for lease in leases:  # some are already gone (session replaced): delete the rest
                try:
                    client.delete(lease)
                except NoNodeError:
                    pass

        with zk_errors("cannot release slot leases"):
            retry_policy()(attempt)

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

    def try_book(self, levels: Sequence[SlotLevel]) -> Booking | None:
        """A booking when every level has room, else None. Never waits for a slot to free up."""
        if not levels:
            raise ValueError("a booking needs at least one level")
        self.session.require_connected()
        client = self.session.client
        lease_name = f"{uuid.uuid4().hex}-lease"
        with zk_errors("slot booking failed"):
            for level in levels:
                if level.path not in self._ensured:
                    client.retry(client.ensure_path, level.path)
                    self._ensured.add(level.path)
            for attempt in range(self.max_attempts):
                outcome = retry_policy()(self._attempt, levels, lease_name)
                if outcome is None or isinstance(outcome, Booking):
                    return outcome
                time.sleep(random.uniform(0, min(0.05, 0.002 * 2 ** attempt)))
        log.warning("slots %s: gave up after %d conflicting attempts",
                    [lv.name for lv in levels], self.max_attempts)
        return None

    def _attempt(self, levels: Sequence[SlotLevel], lease_name: str) -> Booking | object | None:
        client = self.session.client
        leases = [f"{level.path}/{lease_name}" for level in levels]
        if client.exists(leases[0]) is not None:  # an earlier commit whose reply was lost
            return Booking(self.session, leases)
        tx = client.transaction()
        for level in levels:
            data, stat = client.get(level.path)  # version first, then the children
            taken = len(client.get_children(level.path))
            if taken >= level.limit:
                return None
            tx.set_data(level.path, data, version=stat.version)
        for lease in leases:
            tx.create(lease, self.owner.encode(), ephemeral=True)
        results = tx.commit()
        if not any(isinstance(r, Exception) for r in results):
            return Booking(self.session, leases)
        if any(isinstance(r, BadVersionError) for r in results):
            return _CONFLICT
        for result in results:
            if isinstance(result, Exception) and not _is_rolled_back(result):
                raise result
        return _CONFLICT

    def usage(self, level: SlotLevel) -> int:
        with zk_errors("cannot read slot usage"):
            try:
                return len(self.session.client.get_children(level.path))
            except NoNodeError:
                return 0


_CONFLICT = object()


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
