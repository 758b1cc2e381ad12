"""coord's exceptions, one root, split by cause (a recipe's own errors live with the recipe,
named in brackets; ``tests/test_layout.py`` checks that this tree equals the classes)::

    CoordError
    ├── ConnectionLost            the connection is down (SUSPENDED), or a call failed on it
    │   └── SessionExpired        the session is gone (LOST): ephemeral nodes and locks with it
    ├── NotAuthorised             the server refused a call: no credentials, or the wrong ones
    ├── NotLeader                 a master-only action was attempted without leadership
    ├── LockNotHeld               release or use of a task lock that is not (or no longer) held
    ├── MemberIdTaken             another live session registered the same member id
    ├── VersionConflict           a compare-and-set met a newer version than expected
    ├── LifecycleError            start() twice, or use after close() (every component's)
    ├── QueueError                [coord.queuedata] the lock-free queue's own errors
    │   ├── QueueConflict         push_at found another value at its index
    │   ├── QueueElementTooLarge  an element over the size limit: pass a reference instead
    │   └── QueueIndexExpired     the index was pruned by retention
    ├── BadInput                  [coord.stream_input] a handler cannot take this input
    ├── HandlerFailed             [coord.stream_input] the handler raised anything else
    ├── HandlerStateTooLarge      [coord.exactly_once] state and pending outputs exceed a znode
    └── BatchError                [coord.series] the batch coordinator's own errors
        ├── SeriesNotFound        no series with this id
        ├── SeriesFailed          a batch failed max_attempts times
        ├── BatchLost             the batch is no longer this worker's
        ├── BatchClosed           an open-ended batch was closed already
        ├── InvalidBatch          positions that leave a gap or an overlap
        └── SeriesTooLarge        the series document would exceed a znode

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
    """A component was started twice, or used before start / after close: the project's one
    lifecycle error (messaging's components and the runner's node raise it too)."""
