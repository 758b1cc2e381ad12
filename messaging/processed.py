"""The processed-id record: a MASTER message's effect happens once even if its ack is lost.

A master can die after a handler's effect and before the ack; the broker then redelivers the
message to the next master. The same message can also arrive twice at once (a publisher that
retried after a lost confirm sends a second copy). Before running a handler the consumer
**claims** the envelope id: an ephemeral ``/messages/handling/<id>`` znode that only one copy
can create (a copy that finds it waits until it goes; it goes with the claimer's session if
that master dies) and that tells it when the id was processed already. After a handler returns
it records the id (a persistent ``/messages/processed/<id>``), releases the claim, then acks.

That leaves one window: death after the effect but before the record. A handler whose effect
must happen exactly once closes it by writing the record in the same atomic step as its effect:
on ZooKeeper, :meth:`ZkProcessedLog.transaction` returns a transaction that already creates the
record (committing it a second time fails, so the effect is not repeated); in the graph store the
message id is the task's uniqueness key. Records are pruned by age (:meth:`ZkProcessedLog.prune`).
"""

from __future__ import annotations

import enum
import json
import threading
import time
import uuid
from typing import Any, Protocol

from kazoo.exceptions import NodeExistsError, NoNodeError

from coord import Session, zk_errors

PROCESSED = "/messages/processed"
HANDLING = "/messages/handling"


class Claim(enum.Enum):
    CLAIMED = "claimed"  # this caller handles the message now
    BUSY = "busy"  # another copy is being handled (here or on another master)
    DONE = "done"  # processed already


class ProcessedLog(Protocol):
    def contains(self, message_id: uuid.UUID) -> bool: ...

    def claim(self, message_id: uuid.UUID, member_id: str, command: str = "") -> Claim:
        """Claim the id before handling it (see :class:`Claim`); ``command`` is shown to
        whoever lists what is in flight (:meth:`ZkProcessedLog.handling`)."""
        ...

    def wait_released(self, message_id: uuid.UUID, timeout: float) -> bool:
        """Wait until nobody holds the id's claim; False on timeout."""
        ...

    def release(self, message_id: uuid.UUID) -> None:
        """Give up a claim (the handler failed or was cancelled); no-op when none is held."""
        ...

    def record(self, message_id: uuid.UUID, member_id: str,
               reply: dict[str, Any] | None = None) -> bool:
        """Record the id (with the ``reply`` its sender is given, kept for a copy sent again)
        and release its claim; False when it was already recorded."""
        ...

    def reply_of(self, message_id: uuid.UUID) -> dict[str, Any] | None:
        """The reply recorded with a processed id (None: none was kept)."""
        ...

    def transaction(self, message_id: uuid.UUID, member_id: str,
                    fence: str | None = None) -> Any:
        """A transaction that records the id with an effect's operations (see
        :meth:`ZkProcessedLog.transaction`)."""
        ...


def fenced_out(results: list[Any]) -> bool:
    """Whether a committed ``ctx.transaction()`` was refused by its fence (the master's
    leadership session is gone); its other operations then failed with it."""
    return bool(results) and isinstance(results[0], NoNodeError)


class ZkProcessedLog:
    """Processed ids as persistent znodes ``/messages/processed/<uuid>`` (data: who, when)."""

    def __init__(self, session: Session, path: str = PROCESSED,
                 handling: str = HANDLING) -> None:
        self.session = session
        self.path = path
        self.handling_path = handling
        self._claims: dict[uuid.UUID, str] = {}  # our claims: message id -> claim token

    def _claim_node(self, message_id: uuid.UUID) -> str:
        return f"{self.handling_path}/{message_id}"

    def claim(self, message_id: uuid.UUID, member_id: str, command: str = "") -> Claim:
        """One copy at a time: create the ephemeral claim node (its data carries a token of
        this call, so a create retried after a lost reply recognises its own node, while
        another worker of the same session does not); then check the processed record, which
        a copy that finished just before may have written."""
        client = self.session.client
        token = uuid.uuid4().hex
        node = self._claim_node(message_id)
        data = json.dumps({"member": member_id, "claim": token, "at": time.time(),
                           "command": command}).encode()
        with zk_errors("claiming a MASTER message"):
            if client.retry(client.exists, self._node(message_id)) is not None:
                return Claim.DONE
            try:
                client.retry(client.create, node, data, ephemeral=True, makepath=True)
            except NodeExistsError:
                try:
                    current, _ = client.retry(client.get, node)
                except NoNodeError:
                    return Claim.BUSY  # released meanwhile: the caller asks again
                if json.loads(current.decode()).get("claim") != token:
                    return Claim.BUSY
            self._claims[message_id] = token
            if client.retry(client.exists, self._node(message_id)) is not None:
                self.release(message_id)
                return Claim.DONE
        return Claim.CLAIMED

    def wait_released(self, message_id: uuid.UUID, timeout: float) -> bool:
        client = self.session.client
        gone = threading.Event()
        with zk_errors("watching a MASTER message's claim"):
            if client.retry(client.exists, self._claim_node(message_id),
                            watch=lambda event: gone.set()) is None:
                return True
        return gone.wait(timeout)

    def release(self, message_id: uuid.UUID) -> None:
        if self._claims.pop(message_id, None) is None:
            return
        client = self.session.client
        with zk_errors("releasing a MASTER message's claim"):
            try:
                client.retry(client.delete, self._claim_node(message_id))
            except NoNodeError:
                pass  # went with an expired session, or a retried delete

    def _node(self, message_id: uuid.UUID) -> str:
        return f"{self.path}/{message_id}"

    def _data(self, member_id: str, reply: dict[str, Any] | None = None) -> bytes:
        record: dict[str, Any] = {"member": member_id, "at": time.time()}
        if reply is not None:
            record["reply"] = reply
        return json.dumps(record).encode()

    def contains(self, message_id: uuid.UUID) -> bool:
        client = self.session.client
        with zk_errors("reading a processed-id record"):
            return client.retry(client.exists, self._node(message_id)) is not None

    def record(self, message_id: uuid.UUID, member_id: str,
               reply: dict[str, Any] | None = None) -> bool:
        """Create the record (its data: who, when, and the ``reply``); when the handler's own
        transaction created it, add the reply to it. Then release the claim."""
        client = self.session.client
        node = self._node(message_id)
        with zk_errors("writing a processed-id record"):
            client.retry(client.ensure_path, self.path)
            try:
                client.retry(client.create, node, self._data(member_id, reply))
                recorded = True
            except NodeExistsError:
                recorded = False  # recorded by the handler's own transaction, or by a retry
                if reply is not None and message_id in self._claims:
                    client.retry(client.set, node, self._data(member_id, reply))
        self.release(message_id)  # after the record: a waiting copy then finds it DONE
        return recorded

    def reply_of(self, message_id: uuid.UUID) -> dict[str, Any] | None:
        client = self.session.client
        with zk_errors("reading a processed-id record"):
            try:
                data, _ = client.retry(client.get, self._node(message_id))
            except NoNodeError:
                return None
        try:
            reply = json.loads(data or b"{}").get("reply")
        except ValueError:
            return None
        return reply if isinstance(reply, dict) else None

    def handling(self) -> list[dict[str, Any]]:
        """The MASTER messages being handled now (their claims): id, command, member, since
        (epoch seconds), oldest first."""
        client = self.session.client
        found = []
        with zk_errors("reading the MASTER messages in flight"):
            try:
                children = client.retry(client.get_children, self.handling_path)
            except NoNodeError:
                return []
            for child in children:
                try:
                    data, _ = client.retry(client.get, f"{self.handling_path}/{child}")
                    claim = json.loads(data or b"{}")
                except (NoNodeError, ValueError):
                    continue  # released meanwhile, or not ours to read
                found.append({"id": child, "command": str(claim.get("command", "")),
                              "member": str(claim.get("member", "")),
                              "since": float(claim.get("at", 0.0))})
        return sorted(found, key=lambda entry: entry["since"])

    def transaction(self, message_id: uuid.UUID, member_id: str,
                    fence: str | None = None) -> Any:
        """A kazoo transaction that creates the record; add the effect's ops and commit.

        The commit's results hold a ``NodeExistsError`` for the record when the message was
        already processed: then nothing in the transaction was applied. ``fence``: a znode
        that must still exist (the master's election node: ``HandlerContext.transaction``),
        else a ``NoNodeError`` for it and nothing applied.
        """
        client = self.session.client
        with zk_errors("preparing a processed-id transaction"):
            client.retry(client.ensure_path, self.path)
        txn = client.transaction()
        if fence is not None:
            txn.check(fence, -1)
        txn.create(self._node(message_id), self._data(member_id))
        return txn

    def prune(self, older_than: float) -> int:
        """Delete records older than ``older_than`` seconds; returns how many went."""
        client = self.session.client
        removed = 0
        limit_ms = (time.time() - older_than) * 1000
        with zk_errors("pruning processed-id records"):
            try:
                children = client.retry(client.get_children, self.path)
            except NoNodeError:
                return 0
            for child in children:
                try:
                    stat = client.retry(client.exists, f"{self.path}/{child}")
                    if stat is not None and stat.ctime < limit_ms:
                        client.retry(client.delete, f"{self.path}/{child}")
                        removed += 1
                except NoNodeError:
                    continue
        return removed
