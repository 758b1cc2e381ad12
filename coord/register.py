"""VersionedRegister: a JSON value in one znode, changed only by compare-and-set.

``get()`` returns ``(value, version)``; version -1 means "no value yet". ``compare_and_set(v,
value)`` writes only if the register is still at version ``v`` and returns the new version, or
raises :class:`VersionConflict`.

Retry-safety: a CAS whose reply is lost (connection blip) is retried; the retry would see a
newer version and look like a conflict. Every write carries a unique write id, and the node
keeps the ids of its last writes, so the retry recognises its own write and reports success
instead of a false conflict (the CAS_versioned primitive the batch coordinator builds on).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.protocol.states import WatchedEvent

from coord._znodes import retry_policy, zk_errors
from coord.errors import VersionConflict
from coord.session import Session

RECENT_WRITES = 32


class VersionedRegister:
    """A register at ``path`` (relative to the cluster root)."""

    def __init__(self, session: Session, path: str) -> None:
        self.session = session
        self.path = path
        #: the write ids of the version this object read or wrote last: a CAS at that version
        #: (the usual read-then-write) needs no second read to carry them on
        self._known: tuple[int, list[str]] = (-1, [])

    def _read(self, watch: Callable[[WatchedEvent], object] | None = None
              ) -> tuple[dict[str, Any] | None, int]:
        client = self.session.client
        try:
            data, stat = client.get(self.path, watch=watch)
        except NoNodeError:
            if watch is not None:  # a watch on the node's creation
                client.exists(self.path, watch=watch)
            return None, -1
        envelope: dict[str, Any] = json.loads(data) if data else {"value": None, "writes": []}
        self._known = (int(stat.version), list(envelope["writes"]))
        return envelope, int(stat.version)

    def get(self, watch: Callable[[WatchedEvent], object] | None = None) -> tuple[Any, int]:
        """``(value, version)``; with ``watch``, it is called once when the register next
        changes (a ZooKeeper data watch set by the same read; a session that expires drops it,
        so wait with a timeout)."""
        with zk_errors(f"cannot read {self.path}"):
            envelope, version = retry_policy()(self._read, watch)
        return (None if envelope is None else envelope["value"]), version

    def compare_and_set(self, expected_version: int, value: Any) -> int:
        """Write ``value`` if the register is at ``expected_version`` (-1: absent)."""
        write_id = uuid.uuid4().hex
        client = self.session.client
        attempts = 0

        def attempt() -> int:
            nonlocal attempts
            attempts += 1
            if attempts == 1 and expected_version != -1 and self._known[0] == expected_version:
                writes = self._known[1]  # the set below checks the version anyway
            else:
                envelope, version = self._read()
                if attempts > 1 and envelope is not None and write_id in envelope["writes"]:
                    return version  # our earlier attempt committed; its reply was lost
                if version != expected_version:
                    raise VersionConflict(self.path, expected_version,
                                          None if envelope is None else version)
                writes = [] if envelope is None else envelope["writes"]
            writes = [*writes[-(RECENT_WRITES - 1):], write_id]
            data = json.dumps({"value": value, "writes": writes}).encode()
            try:
                if expected_version == -1:
                    client.create(self.path, data, makepath=True)
                    self._known = (0, writes)
                    return 0
                stat = client.set(self.path, data, version=expected_version)
                self._known = (int(stat.version), writes)
                return int(stat.version)
            except (BadVersionError, NodeExistsError):
                _, now = self._read()
                raise VersionConflict(self.path, expected_version, now) from None

        with zk_errors(f"cannot write {self.path}"):
            result: int = retry_policy()(attempt)
        return result
