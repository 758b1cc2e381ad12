"""coord's exceptions, one root, split by cause::

    CoordError
    ├── ConnectionLost            the connection is down (SUSPENDED), or a call failed on it
    │   └── SessionExpired        the session is gone (LOST): ephemeral nodes and locks with it
    ├── NotAuthorised             the server refused a call: no credentials, or the wrong ones
    ├── NotLeader                 a master-only action was attempted without leadership
    ├── LockNotHeld               release or use of a task lock that is not (or no longer) held
    ├── MemberIdTaken             another live session registered the same member id
    ├── VersionConflict           a compare-and-set met a newer version than expected
    └── LifecycleError            start() twice, or use after close()

Driver errors (kazoo) are translated at the boundary with ``raise ... from exc``; callers of coord
never need to import kazoo's exceptions.
"""

from __future__ import annotations


class CoordError(Exception):
    """Root of every error raised by coord."""


class ConnectionLost(CoordError):
    """The call could not complete because the ZooKeeper connection is down."""


class SessionExpired(ConnectionLost):
    """The ZooKeeper session expired (or was declared lost by the client-side timer)."""


class NotAuthorised(CoordError):
    """ZooKeeper refused the call: the znode's ACL does not admit these credentials (or
    none were given), or the digest credentials were refused."""


class NotLeader(CoordError):
    """This participant is not the leader (or can no longer prove it is)."""


class LockNotHeld(CoordError):
    """The task lock is not held by this owner."""


class MemberIdTaken(CoordError):
    """A member node with this id exists and belongs to another live session."""


class VersionConflict(CoordError):
    """compare_and_set found another version than the one expected."""

    def __init__(self, path: str, expected: int, actual: int | None) -> None:
        super().__init__(f"{path}: expected version {expected}, found "
                         f"{'no node' if actual is None else actual}")
        self.path = path
        self.expected = expected
        self.actual = actual


class LifecycleError(CoordError):
    """A recipe was started twice, or used before start / after close."""
