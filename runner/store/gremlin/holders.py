"""The claim of a task that declares resources: the attempt recorded as each resource's holder,
with the claim's token, in the claim's own write (``GraphStore.claim``)."""

from __future__ import annotations

from collections.abc import Callable

from gremlin_python.process.traversal import P

from runner.errors import WriteRaceLost
from runner.store import codec
from runner.store.api import Graph
from runner.store.ends import AttemptEnd
from runner.store.gremlin.guards import Write, finder, set_on
from runner.store.gremlin.steps import get_or_add
from runner.store.gremlin.writes import (
    TaskChange,
    _Unmatched,
    add_end,
    attempt_start,
)
from runner.store.model import Attempt
from runner.store.traversal import Traversal


def claim_resources(graph: Graph, change: TaskChange, ends: list[AttemptEnd], member_id: str,
                    fence_token: int, resources: tuple[str, ...]) -> Attempt | None:
    """The claim of a task with resources (``GraphStore.claim``): ``change`` with its new
    attempt, the ``ends`` of the attempts it supersedes, and the attempt recorded as the holder
    of each resource, as one guarded traversal; the attempt, or None when its guards matched
    nothing.

    A resource also records the claimant's ``fence_token`` (its task lock's czxid: ZooKeeper's
    transaction ids only grow), and a claim whose token is older than the one recorded is
    refused (None): a claimant that booked its hold and took its lock before another, and
    whose write commits only after that other's claim (a slow write, a session lost between
    the two), cannot take the resource back from the newer holder. The recorded tokens are
    read first and compared here (the portable subset has no numeric comparison that gremlite
    keeps); the write is guarded by each token being still the one read, so a claim that
    got in between refuses this one.

    The start time is read once the write holds the embedded graph's writer slot (a first
    statement takes it), so it is later than every success written before. On a server that
    runs one traversal at a time it is read when the traversal is built, a fraction of a
    millisecond before the server runs it (docs/graph.md)."""
    names = sorted(set(resources))
    tokens = _resource_tokens(graph, names)
    if any(codec.decode_big(token) > fence_token for token in tokens.values()):
        return None

    def write(g: Traversal) -> Attempt:
        g.V().has("task_id", change.task_id).id_().to_list()  # takes the writer slot
        start = attempt_start(change.task, member_id, fence_token)
        w = Write()
        for end in ends:
            add_end(w, end)
        task = change.add_to(w)
        start.add_to(w, task)
        held = {"resource_holder": start.attempt.id,
                "resource_token": codec.encode_big(fence_token)}
        for name in names:
            label = w.guard(finder(("resource_name", name), ("resource_token", tokens[name])))
            w.change(set_on(label, held))
        if not w.traverse(g).id_().to_list():
            raise _Unmatched
        return start.attempt

    try:
        return graph.write(write)
    except (_Unmatched, WriteRaceLost):
        return None


def _resource_maker(name: str) -> Callable[[Traversal], None]:
    new = {"resource_name": name, "resource_holder": "", "resource_token": codec.encode_big(0)}
    def make(g: Traversal) -> None:
        get_or_add(g, "resource_name", name, "resource", new).iterate()
    return make


def _resource_tokens(graph: Graph, names: list[str]) -> dict[str, str]:
    """The token each resource was last claimed with (made first, each by one get-or-create
    traversal, with no holder and token 0, when it does not exist yet)."""
    def read() -> dict[str, str]:
        rows = graph.read(lambda g: g.V().has("resource_name", P.within(names))
                          .project("n", "t").by("resource_name").by("resource_token").to_list())
        return {r["n"]: r["t"] for r in rows}

    found = read()
    if len(found) == len(names):
        return found
    for name in names:
        if name not in found:
            graph.write(_resource_maker(name))
    return read()
