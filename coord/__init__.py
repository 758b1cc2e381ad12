"""ZooKeeper recipes for latchwork: session, membership, leader latch, task locks, slots.

Each recipe is a small class over a :class:`Session` with ``start()``/``close()`` (or
``try_*``/``release()``) and a context manager; their docstrings state what happens on
connection loss. Errors are in :mod:`coord.errors`.
"""

from coord import markers
from coord._znodes import zk_errors
from coord.errors import (
    ConnectionLost,
    CoordError,
    LifecycleError,
    LockNotHeld,
    MemberIdTaken,
    NotAuthorised,
    NotLeader,
    SessionExpired,
    VersionConflict,
)
from coord.exactly_once import ExactlyOnceHandler, QueueOutput
from coord.leader import LeaderLatch, read_leader
from coord.lock import (
    TaskLock,
)
from coord.lockbatch import Acquiring, LockBatch, stamp_path
from coord.lockview import HeldLock, force_release, held_locks, lock_owner
from coord.mailbox import Mailbox
from coord.membership import MemberInfo, Membership, live_member_ids, read_members
from coord.queue import LockFreeQueue
from coord.queuedata import QueueConflict, QueueElementTooLarge, QueueIndexExpired
from coord.register import VersionedRegister
from coord.session import Session, SessionState
from coord.slots import Booking, SlotLevel, Slots, exclusive_holders, holders
from coord.stream_input import BadInput, HandlerFailed

__all__ = [
    "BadInput", "ExactlyOnceHandler", "HandlerFailed", "LockFreeQueue", "QueueConflict",
    "QueueElementTooLarge", "QueueIndexExpired", "QueueOutput",
    "Acquiring", "Booking", "LockBatch", "ConnectionLost", "CoordError", "HeldLock", "LeaderLatch",
    "LifecycleError",
    "LockNotHeld", "Mailbox", "MemberIdTaken", "MemberInfo", "Membership", "NotAuthorised",
    "NotLeader",
    "Session",
    "SessionExpired", "SessionState", "SlotLevel", "Slots", "TaskLock", "VersionConflict",
    "VersionedRegister", "exclusive_holders", "force_release", "held_locks", "holders",
    "live_member_ids", "lock_owner", "markers",
    "read_leader", "read_members", "stamp_path", "zk_errors",
]
