"""Helpers shared by the recipes: retry-safe sequential creates and sequence ordering."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    AuthFailedError,
    ConnectionLoss,
    KazooException,
    NoAuthError,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import ZnodeStat
from kazoo.retry import KazooRetry

from coord.errors import ConnectionLost, NotAuthorised, SessionExpired

SEQ_DIGITS = 10


@contextmanager
def zk_errors(what: str) -> Iterator[None]:
    """Translate kazoo's exceptions at the recipe boundary, so callers never import kazoo.

    An expired session becomes :class:`SessionExpired`; every other driver error (connection
    loss, timeouts, an operation the server refused) becomes :class:`ConnectionLost`. Errors the
    recipe raises itself (coord's own) pass through unchanged.
    """
    try:
        yield
    except SessionExpiredError as exc:
        raise SessionExpired(f"{what}: the ZooKeeper session expired") from exc
    except (NoAuthError, AuthFailedError) as exc:
        raise NotAuthorised(f"{what}: ZooKeeper refused it: the znodes' ACL does not admit "
                            "these credentials (set zk_auth to the cluster's digest user)"
                            ) from exc
    except (KazooException, KazooTimeoutError) as exc:
        raise ConnectionLost(f"{what}: {exc!r}") from exc


def session_of(client: KazooClient) -> int:
    """The id of the session ``client`` is connected on. kazoo has none while the link is down
    (``client_id`` is None then, the session perhaps alive): that is a lost connection,
    retried like any call's. Read from kazoo, not from :class:`~coord.session.Session`, whose
    view of a new session comes a moment after kazoo's."""
    client_id = client.client_id
    if client_id is None:
        raise ConnectionLoss("not connected to ZooKeeper")
    return int(client_id[0])


def seq_of(name: str) -> int:
    """The sequence number ZooKeeper appended to ``name``."""
    return int(name[-SEQ_DIGITS:])


def sort_by_seq(children: list[str]) -> list[str]:
    return sorted(children, key=seq_of)


def retry_policy(deadline: float = 30.0) -> KazooRetry:
    """Retries on connection loss / operation timeout only, with jittered backoff."""
    return KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0, deadline=deadline,
                      ignore_expire=False)


def read_children(client: KazooClient, parent: str) -> dict[str, bytes]:
    """Every child of ``parent`` with its data (none when ``parent`` is missing); a child that
    goes while it is read is left out."""
    try:
        names = client.get_children(parent)
    except NoNodeError:
        return {}
    found = {}
    for name in names:
        try:
            data, _ = client.get(f"{parent}/{name}")
        except NoNodeError:
            continue  # gone while we were reading
        found[name] = bytes(data)
    return found


def find_own(client: KazooClient, parent: str, prefix: str) -> str | None:
    """The child of ``parent`` whose name starts with our unique ``prefix``, if any."""
    try:
        children = client.get_children(parent)
    except NoNodeError:
        return None
    for child in children:
        if child.startswith(prefix):
            return f"{parent}/{child}"
    return None


def create_protected(client: KazooClient, parent: str, prefix: str, data: bytes,
                     retry: KazooRetry | None = None, **create_args: Any) -> tuple[str, ZnodeStat]:
    """Create ``parent/<prefix>…`` (ephemeral sequential), safe to retry after a lost reply.

    ``prefix`` must be unique to this caller (it starts with a uuid). The first attempt just
    creates; an attempt after a connection loss first looks for a node with our prefix, because
    the lost reply may belong to a create that succeeded (the orphan of kazoo issue 732).
    """
    attempts = 0

    def attempt() -> tuple[str, ZnodeStat]:
        nonlocal attempts
        attempts += 1
        if attempts > 1:
            existing = find_own(client, parent, prefix)
            if existing is not None:
                stat = client.exists(existing)
                if stat is not None:
                    return existing, stat
        path, stat = client.create(f"{parent}/{prefix}", data, ephemeral=True, sequence=True,
                                   include_data=True, **create_args)
        return str(path), stat

    result: tuple[str, ZnodeStat] = (retry or retry_policy())(attempt)
    return result
