"""The processed-id record: a MASTER message's effect happens once even if its ack is lost.

A master can die after a handler's effect and before the ack; the broker then redelivers the
message to the next master. Before running a handler the consumer asks the log whether the
envelope id was processed; after a handler returns it records the id, then acks.

That leaves one window: death after the effect but before the record. A handler whose effect
must happen exactly once closes it by writing the record in the same atomic step as its effect:
on ZooKeeper, :meth:`ZkProcessedLog.transaction` returns a transaction that already creates the
record (committing it a second time fails, so the effect is not repeated); in the graph store the
message id is the task's uniqueness key. Records are pruned by age (:meth:`ZkProcessedLog.prune`).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Protocol

from kazoo.exceptions import NodeExistsError, NoNodeError

from coord import Session
from coord._znodes import zk_errors

PROCESSED = "/messages/processed"


class ProcessedLog(Protocol):
    def contains(self, message_id: uuid.UUID) -> bool: ...

    def record(self, message_id: uuid.UUID, member_id: str) -> bool:
        """Record the id; False when it was already recorded."""
        ...


class ZkProcessedLog:
    """Processed ids as persistent znodes ``/messages/processed/<uuid>`` (data: who, when)."""

    def __init__(self, session: Session, path: str = PROCESSED) -> None:
        self.session = session
        self.path = path

    def _node(self, message_id: uuid.UUID) -> str:
        return f"{self.path}/{message_id}"

    def _data(self, member_id: str) -> bytes:
        return json.dumps({"member": member_id, "at": time.time()}).encode()

    def contains(self, message_id: uuid.UUID) -> bool:
        client = self.session.client
        with zk_errors("reading a processed-id record"):
            return client.retry(client.exists, self._node(message_id)) is not None

    def record(self, message_id: uuid.UUID, member_id: str) -> bool:
        client = self.session.client
        with zk_errors("writing a processed-id record"):
            client.retry(client.ensure_path, self.path)
            try:
                client.retry(client.create, self._node(message_id), self._data(member_id))
            except NodeExistsError:
                return False  # recorded by the handler's own transaction, or by a retry
        return True

    def transaction(self, message_id: uuid.UUID, member_id: str) -> Any:
        """A kazoo transaction that creates the record; add the effect's ops and commit.

        The commit's results hold a ``NodeExistsError`` for the record when the message was
        already processed: then nothing in the transaction was applied.
        """
        client = self.session.client
        with zk_errors("preparing a processed-id transaction"):
            client.retry(client.ensure_path, self.path)
        txn = client.transaction()
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
