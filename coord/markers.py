"""Markers: named ephemeral entries with a JSON value under one parent: "who runs what".

``place(session, parent, name, value)`` creates ``parent/name`` (ephemeral) and returns False
when a live session holds that name already; ``remove`` deletes one; ``read`` lists every live
entry with its value. A stream's copies mark themselves this way (``streams/<name>/copies/
<member>``), so a member never runs two copies of one stream and anyone can list who runs it.

Failure behaviour:

* the holder killed -9, frozen past its session, or its session LOST: its marker goes with the
  session (within the session timeout);
* a lost reply to ``place`` (a connection blip): the retry finds the name taken, possibly by
  the create that was lost; so a retry reads the entry and says True when it is this
  session's, with this value (a first try that finds the name taken says False, even when
  this session holds it for something else: one holder per name);
* ZooKeeper unreachable past the calls' retries: :class:`~coord.errors.ConnectionLost`;
  ``remove`` of an entry already gone (its session expired) is not an error.
"""

from __future__ import annotations

import json
from typing import Any

from kazoo.exceptions import NodeExistsError, NoNodeError

from coord._znodes import read_children, retry_policy, zk_errors
from coord.session import Session


def place(session: Session, parent: str, name: str, value: Any) -> bool:
    """Mark ``name`` under ``parent`` with ``value`` (JSON) for as long as this session lives;
    False when another live session holds it."""
    client = session.client
    path = f"{parent}/{name}"
    data = json.dumps(value).encode()
    attempts = 0

    def attempt() -> bool:
        nonlocal attempts
        attempts += 1
        try:
            client.create(path, data, ephemeral=True, makepath=True)
            return True
        except NodeExistsError:
            if attempts == 1:
                return False  # held: by another session, or by this one for something else
            # a retry after a lost reply: the create may have been ours
            try:
                found, stat = client.get(path)
            except NoNodeError:
                return False
            return bool(found == data and stat.ephemeralOwner == session.session_id)

    with zk_errors(f"cannot mark {path}"):
        placed: bool = retry_policy()(attempt)
    return placed


def remove(session: Session, parent: str, name: str) -> None:
    """Delete the marker (nothing when it is gone already)."""
    client = session.client
    with zk_errors(f"cannot remove the marker {parent}/{name}"):
        try:
            retry_policy()(client.delete, f"{parent}/{name}")
        except NoNodeError:
            pass


def read(session: Session, parent: str) -> dict[str, Any]:
    """Every live marker under ``parent`` and its value."""
    with zk_errors(f"cannot read the markers under {parent}"):
        entries = read_children(session.client, parent)
    return {name: json.loads(data) if data else None for name, data in entries.items()}
