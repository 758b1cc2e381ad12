"""LockFreeQueue: an append-only queue over ZooKeeper versioned nodes that no pusher can block.

Layout under ``queues/<name>/``: ``e/<index>`` (10 digits) holds element ``index``; ``end``
holds a hint of the first free index, which only ever rises (a compare-and-set that never
lowers it). An element is written with create-if-absent (a slot is empty until created, and a
created slot is never changed), so:

* :meth:`push` creates the element at the end hint (as this object last saw it: a stale view
  only costs a taken slot); when the slot is taken it moves to ``max(hint now, index + 1)``
  and tries again; once created it raises the hint past its index.
  A pusher frozen between its two steps (created, hint not raised yet) blocks nobody: the next
  pusher finds the slot taken and moves on, and :meth:`end` walks past created slots;
* :meth:`push_at` writes at a given index and is idempotent: the same value already there is
  success, another value is :class:`QueueConflict` (a concurrent exactly-once handler writes its
  outputs this way, see :mod:`coord.exactly_once`); the element and the raised hint go in one
  ZooKeeper transaction (one round trip when this object's view of the hint is current), and
  a taken slot is read together with the hint (one more);
* a push retried after a lost reply recognises its own element (each push carries a unique
  token), so a value is never pushed twice by one call.

Elements are never deleted by readers; :meth:`prune` drops the ones older than a retention age
from the head (days of history for audit, as in the source design) and records the new first
index, below which :meth:`get` raises :class:`QueueIndexExpired`. An element over
:data:`MAX_ELEMENT_BYTES` (ZooKeeper's node size, less its envelope) is refused with
:class:`QueueElementTooLarge`: larger payloads go through the graph or the data dir by
reference.

Failure behaviour: connection loss is retried for 30 s inside each call, then raises
:class:`~coord.errors.ConnectionLost`; an expired session raises
:class:`~coord.errors.SessionExpired`. Throughput is ZooKeeper's write rate (two writes per
push, about a thousand pushes a second on one ensemble).

Why one module: push, push_at, end and prune share one znode layout and one view of the end
hint (``_seen``), and the argument that no pusher blocks another runs across all of them;
together, it can be checked in one place.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from kazoo.exceptions import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    RuntimeInconsistency,
)
from kazoo.protocol.states import WatchedEvent

from coord._znodes import retry_policy, zk_errors
from coord.queuedata import (
    QueueConflict,
    QueueIndexExpired,
    decode_element,
    encode_element,
    push_datas,
)
from coord.queueprune import prune_head
from coord.session import Session

DIGITS = 10
#: read() of an empty start asks whether it was pruned at most this often (a poll of an idle
#: queue then costs one read, not two); get() always asks
KEPT_CHECK_EVERY = 1.0
#: read() asks for this many slots at once, then twice as many each round: one new element
READ_AHEAD = 2  # (the usual case) and the empty slot after it come in one round trip


class LockFreeQueue:
    """The queue ``name`` of a cluster (elements are bytes; see the module)."""

    def __init__(self, session: Session, name: str) -> None:
        if not name or "/" in name:
            raise ValueError(f"invalid queue name {name!r}")
        self.session = session
        self.name = name
        self.root = f"queues/{name}"
        self._seen: tuple[int, int] = (0, -1)  # the hint and its version as last seen
        self._next = 0  # this object's next index to try: at or past its own last push
        self._kept_at = -KEPT_CHECK_EVERY  # when read() last found its start not pruned

    def slot_path(self, index: int) -> str:
        return f"{self.root}/e/{index:0{DIGITS}d}"

    @property
    def end_view(self) -> tuple[int, int]:
        """The end hint and its version as this object last saw them (``version`` -1: none);
        a writer can hand it to the next (:meth:`see_end`), whose first write then does not
        fail on a stale view of the hint and read it again first."""
        return self._seen

    def see_end(self, hint: int, version: int) -> None:
        """Take another writer's view of the end hint when it is newer than this object's (a
        stale one only costs a failed write transaction and a read)."""
        if version > self._seen[1]:
            self._seen = (hint, version)

    # -- the end hint -----------------------------------------------------------------------
    def _hint(self) -> tuple[int, int]:
        """(hint, version); (0, -1) before the first push."""
        try:
            data, stat = self.session.client.get(f"{self.root}/end")
        except NoNodeError:
            return 0, -1
        return int(data or b"0"), int(stat.version)

    def _raise_hint(self, to: int) -> None:
        """Raise the hint to ``to`` unless it is there already: a CAS that never lowers it.
        Starts from the hint this object saw last (one write when nobody moved it since)."""
        client = self.session.client
        hint, version = self._seen
        while True:
            if hint >= to:
                self._seen = (hint, version)
                return
            try:
                if version == -1:
                    client.create(f"{self.root}/end", str(to).encode(), makepath=True)
                    self._seen = (to, 0)
                else:
                    stat = client.set(f"{self.root}/end", str(to).encode(), version=version)
                    self._seen = (to, int(stat.version))
                return
            except (BadVersionError, NodeExistsError):
                hint, version = self._hint()  # someone moved it: read again

    # -- writing ----------------------------------------------------------------------------
    def push(self, value: bytes) -> int:
        """Append ``value``; returns its index."""
        token = uuid.uuid4().hex
        data = encode_element(value, token)
        client = self.session.client

        def attempt() -> int:
            if self._seen[1] == -1:
                self._seen = self._hint()
            index = max(self._seen[0], self._next)
            while True:
                try:
                    client.create(self.slot_path(index), data, makepath=True)
                except NodeExistsError:
                    held = self._read(index)
                    if held is not None and held[1] == token:
                        pass  # our create committed; its reply was lost
                    else:
                        self._seen = self._hint()
                        index = max(self._seen[0], index + 1)
                        continue
                self._raise_hint(index + 1)
                self._next = index + 1
                return index

        with zk_errors(f"cannot push to queue {self.name}"):
            result: int = retry_policy()(attempt)
        return result

    def push_many(self, values: list[bytes], token: str) -> list[int]:
        """Append ``values`` at consecutive indexes in one ZooKeeper transaction, with a
        record of ``token`` (the caller's: a letter or digit, then up to 127 of them or
        ``_ . -``): a call with a token already used pushes nothing and returns the indexes
        of the first call, so a push retried after a lost reply, from this process or
        another, pushes once. All or nothing; together the values must fit one element's
        limit. Token records go with :meth:`prune`."""
        datas = push_datas(values, token)
        if not datas:
            return []
        client, end = self.session.client, f"{self.root}/end"
        record = f"{self.root}/pushes/{token}"

        def recorded() -> list[int] | None:
            try:
                data, _ = client.get(record)
            except NoNodeError:
                return None
            return [int(i) for i in json.loads(data)["indexes"]]

        def attempt() -> list[int]:
            done = recorded()  # a retry after a lost reply: the first call's
            if done is not None:
                return done
            client.ensure_path(f"{self.root}/e")
            client.ensure_path(f"{self.root}/pushes")
            hint, version = self._seen if self._seen[1] != -1 else self._hint()
            index = max(hint, self._next)
            while True:
                indexes = list(range(index, index + len(datas)))
                tx = client.transaction()
                for at, data in zip(indexes, datas, strict=True):
                    tx.create(self.slot_path(at), data)
                if version == -1:
                    tx.create(end, str(indexes[-1] + 1).encode())
                else:
                    tx.set_data(end, str(indexes[-1] + 1).encode(), version=version)
                tx.create(record, json.dumps({"indexes": indexes, "at": time.time()}).encode())
                results = tx.commit()
                failed = [(k, r) for k, r in enumerate(results) if isinstance(r, Exception)
                          and not isinstance(r, RolledBackError | RuntimeInconsistency)]
                if not failed:
                    self._seen = (indexes[-1] + 1, version + 1)
                    self._next = indexes[-1] + 1
                    return indexes
                at, error = failed[0]
                if at == len(results) - 1 and isinstance(error, NodeExistsError):
                    done = recorded()  # another call with this token pushed meanwhile
                    if done is not None:
                        return done
                if not isinstance(error, NodeExistsError | BadVersionError):
                    raise error
                taken = at < len(datas)  # a slot: a pusher between its create and its hint
                hint, version = self._seen = self._hint()
                index = max(hint, index + 1 if taken else index)

        with zk_errors(f"cannot push to queue {self.name}"):
            result: list[int] = retry_policy()(attempt)
        return result

    def push_at(self, index: int, value: bytes) -> None:
        """Write ``value`` at ``index``: success if it is there already, :class:`QueueConflict`
        if another value is."""
        if index < 0:
            raise ValueError(f"negative index {index}")
        data = encode_element(value, "at")

        def attempt() -> None:
            if self._create_raising(index, data):
                return
            # taken, or below the hint: the slot, and the hint (to raise if the slot's creator
            # died first), at once
            client = self.session.client
            slot, end = (client.get_async(path) for path in (self.slot_path(index),
                                                             f"{self.root}/end"))
            held: tuple[bytes, str] | None = None
            with contextlib.suppress(NoNodeError):
                held = decode_element(slot.get()[0])
            with contextlib.suppress(NoNodeError):
                hint, stat = end.get()
                self._seen = (int(hint or b"0"), int(stat.version))
            if held is None:  # a gap below the hint (a push_at past it): filled now
                try:
                    client.create(self.slot_path(index), data, makepath=True)
                    held = (value, "at")
                except NodeExistsError:
                    held = self._read(index)
            if held is None or held[0] != value:
                raise QueueConflict(self.name, index)
            self._raise_hint(index + 1)

        with zk_errors(f"cannot write queue {self.name} at {index}"):
            retry_policy()(attempt)

    def _create_raising(self, index: int, data: bytes) -> bool:
        """Create the element and raise the hint past it in one transaction (one round trip),
        from the hint this object saw last (read again when it is stale or there is none);
        False (nothing written) when the slot is taken: the transaction found it, or the hint
        is past it (only ever raised past created slots)."""
        client, end = self.session.client, f"{self.root}/end"
        hint, version = self._seen if self._seen[1] != -1 else self._hint()
        while hint <= index:
            tx = client.transaction()
            tx.create(self.slot_path(index), data)
            if version == -1:  # the first write: the hint's node is created with it
                tx.create(end, str(index + 1).encode())
            else:
                tx.set_data(end, str(index + 1).encode(), version=version)
            results = tx.commit()
            if not any(isinstance(r, Exception) for r in results):
                self._seen = (index + 1, version + 1)
                return True
            first, second = results
            if isinstance(first, NodeExistsError):
                return False
            if isinstance(first, NoNodeError):
                client.ensure_path(f"{self.root}/e")  # the queue's first element
            elif not isinstance(second, BadVersionError | NodeExistsError):
                raise first if isinstance(second, RuntimeInconsistency) else second  # the cause
            hint, version = self._seen = self._hint()  # moved since: read it again
        return False

    # -- reading ----------------------------------------------------------------------------
    def _read(self, index: int) -> tuple[bytes, str] | None:
        try:
            data, _ = self.session.client.get(self.slot_path(index))
        except NoNodeError:
            return None
        return decode_element(data)

    def first(self) -> int:
        """The first index still kept (0 until :meth:`prune` dropped a head)."""
        with zk_errors(f"cannot read queue {self.name}"):
            try:
                data, _ = retry_policy()(self.session.client.get, f"{self.root}/start")
            except NoNodeError:
                return 0
        return int(data or b"0")

    def get(self, index: int) -> bytes | None:
        """The element at ``index``, or None while the slot is empty."""
        with zk_errors(f"cannot read queue {self.name}"):
            held = retry_policy()(self._read, index)
        if held is None:
            self._check_kept(index)
        return None if held is None else held[0]

    def _check_kept(self, index: int) -> None:
        """Raise :class:`QueueIndexExpired` if ``index`` was pruned. Asked only after an empty
        read: :meth:`prune` records the first kept index before it deletes, so a slot that is
        gone because it was pruned is always below the recorded index."""
        first = self.first()
        if index < first:
            raise QueueIndexExpired(f"queue {self.name}: index {index} was pruned "
                                    f"(first kept: {first})")

    def end(self) -> int:
        """The first empty index: the hint, walked past slots created by pushers that did not
        raise it yet (frozen or dead between their two steps)."""
        with zk_errors(f"cannot read queue {self.name}"):
            hint: tuple[int, int] = retry_policy()(self._hint)
            index = hint[0]
            while retry_policy()(self.session.client.exists, self.slot_path(index)) is not None:
                index += 1
        return index

    def watch(self, index: int, callback: Callable[[WatchedEvent], object]) -> bool:
        """True if the element at ``index`` is there; else False, and ``callback`` is called
        once when it is created (a ZooKeeper watch: the same callback on the same index is
        registered once; a session that expires drops it, so wait with a timeout)."""
        with zk_errors(f"cannot read queue {self.name}"):
            stat = retry_policy()(self.session.client.exists, self.slot_path(index), watch=callback)
        return stat is not None

    def read(self, start: int, limit: int = 1000) -> Iterator[tuple[int, bytes]]:
        """``(index, value)`` from ``start`` on, up to the first empty slot or ``limit``.
        Raises :class:`QueueIndexExpired` when ``start`` was pruned; a reader polling an empty
        start learns of a prune within :data:`KEPT_CHECK_EVERY` seconds (pruning is by an age
        of days, so the delay loses nothing)."""
        index, window = start, READ_AHEAD
        while index < start + limit:
            count = min(window, start + limit - index)
            with zk_errors(f"cannot read queue {self.name}"):
                window_held = retry_policy()(self._read_window, index, count)
            for held in window_held:
                if held is None:
                    if index == start and time.monotonic() - self._kept_at >= KEPT_CHECK_EVERY:
                        self._check_kept(index)
                        self._kept_at = time.monotonic()
                    return  # past the start, an element pruned since is for the next read
                yield index, held[0]
                index += 1
            window *= 2

    def _read_window(self, start: int, count: int) -> list[tuple[bytes, str] | None]:
        """The slots ``start`` .. ``start + count - 1``, asked for at once (one round trip)."""
        client = self.session.client
        asked = [client.get_async(self.slot_path(i)) for i in range(start, start + count)]
        held: list[tuple[bytes, str] | None] = []
        for result in asked:
            try:
                held.append(decode_element(result.get()[0]))
            except NoNodeError:
                held.append(None)
        return held

    def prune(self, older_than: float, now: float | None = None,
              below: int | None = None, limit: int | None = None) -> int:
        """Drop elements created more than ``older_than`` seconds ago from the head (never
        past an empty slot, nor to ``below`` when given: a consumer's position; at most
        ``limit`` of them); returns how many (:func:`coord.queueprune.prune_head`)."""
        return prune_head(self, older_than, now, below, limit)

    def describe(self) -> dict[str, Any]:
        return {"queue": self.name, "first": self.first(), "end": self.end()}
