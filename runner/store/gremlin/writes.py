"""The write algebra: guarded changes prepared outside the write slot, applied as one traversal.

The store reads and checks first, outside any write transaction, and then writes one guarded
traversal: the embedded graph's single writer slot is held only for the write, and a change
that is no longer true (someone else wrote first) matches nothing. ``traverse(src)`` builds the
guarded write from ``g`` or from a traversal (mid-traversal ``V()``), so several changes can
go out as one traversal.

A guard that matches nothing means someone else wrote first: the caller re-reads and retries
(:func:`until_written`, the one re-read-and-write loop of the store) or reports
:class:`~runner.errors.CommitConflict` / :class:`~runner.errors.StaleFencingToken`.
"""

from __future__ import annotations

import dataclasses
import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gremlin_python.process.traversal import P

from runner.errors import (
    AttemptAlreadyFinished,
    CommitConflict,
    InvalidValue,
    ResourceTaken,
    StaleFencingToken,
    WriteRaceLost,
)
from runner.store import codec
from runner.store.graph import Graph
from runner.store.gremlin.rows import (
    TASK_CHANGES,
    TASK_FIXED,
    attempt_from_row,
    task_from_row,
    task_props,
)
from runner.store.gremlin.steps import (
    X,
    add_vertex,
    get_or_add,
    set_props,
)
from runner.store.model import (
    Attempt,
    AttemptStatus,
    Fence,
    Task,
    TaskStatus,
)


class Write:
    """One guarded traversal: every guard first, each standing on its vertex under a label of
    its own, then every change, each from the vertex it changes (``select``).

    A guard that matches nothing leaves no traverser, so no change is made: the write is
    atomic wherever one traversal is (a transaction on the embedded graph or a transactional
    server; a server that runs one traversal at a time), and no write ever changes a vertex
    and then finds a later guard refusing (what a write of changes-then-guards, without a
    transaction to roll it back, leaves half made).

    An ``effect`` (``ctx.complete()``'s write, built on the traversal that stands on the
    guards) runs after the guards and before the changes; its traversers are folded into one
    and the guards are matched again (nothing can have moved them in the same traversal), so
    the changes are made once, whatever number of traversers the effect leaves.
    """

    def __init__(self) -> None:
        self._guards: list[tuple[str, Callable[[Any], Any]]] = []
        self._changes: list[Callable[[Any], Any]] = []

    def guard(self, find: Callable[[Any], Any]) -> str:
        """``find(src)`` is ``src.V().has(...)...``: the vertex must match; its label."""
        label = f"w{len(self._guards)}"
        self._guards.append((label, find))
        return label

    def change(self, fn: Callable[[Any], Any]) -> None:
        self._changes.append(fn)

    def traverse(self, g: Any, effect: Callable[[Any], Any] | None = None) -> Any:
        if not self._guards:
            raise ValueError("a write needs at least one guard")
        t = self._guarded(g)
        if effect is not None:
            built = effect(EffectTraversal(t))
            if not isinstance(built, EffectTraversal):
                raise InvalidValue(_NOT_RUN)
            t = self._guarded(built.traversal.fold())
        for fn in self._changes:
            t = fn(t)
        return t

    def _guarded(self, t: Any) -> Any:
        for label, find in self._guards:
            t = find(t).as_(label)
        return t


_NOT_RUN = ("ctx.complete(write): write(g) must build the effect on g and return it, not run "
            "it (no .iterate(), .to_list(), .next()): the store runs it with the success, as "
            "one traversal")
_TERMINAL = frozenset({"iterate", "next", "to_list", "to_set", "has_next", "toList", "toSet",
                       "hasNext", "__next__"})


class EffectTraversal:
    """The traversal an effect is built on (``ctx.complete()``): every step works as on a
    traversal, running it does not (:class:`InvalidValue`, before anything is sent): the
    effect is run by the store, with the guards and the success."""

    def __init__(self, traversal: Any) -> None:
        self.traversal = traversal

    def __getattr__(self, name: str) -> Any:
        if name in _TERMINAL:
            raise InvalidValue(_NOT_RUN)
        step = getattr(self.traversal, name)
        if not callable(step):
            return step

        def call(*args: Any, **kwargs: Any) -> Any:
            out = step(*args, **kwargs)
            return EffectTraversal(out) if out is self.traversal else out
        return call


def fence_finds(fence: Fence) -> list[Callable[[Any], Any]]:
    """The guards of ``fence``: the task still carries its token, and its attempt is still the
    last claimant of each of its resources (:func:`claim_resources`)."""
    token = codec.encode_big(fence.token)
    finds = [finder(("task_id", fence.task_id), ("task_fence", token))]
    if fence.attempt_id is not None:
        finds += [finder(("resource_name", r), ("resource_holder", fence.attempt_id))
                  for r in sorted(set(fence.resources))]
    return finds


def finder(*pairs: tuple[str, Any]) -> Callable[[Any], Any]:
    """A guard's ``find``: ``src.V().has(k1, v1).has(k2, v2)...``."""
    def find(src: Any) -> Any:
        t = src.V()
        for key, value in pairs:
            t = t.has(key, value)
        return t
    return find


def _select_set(label: str, props: Mapping[str, Any]) -> Callable[[Any], Any]:
    return lambda t: set_props(t.select(label), props)


class FencedSource:
    """A traversal source whose every traversal starts with ``fence``'s guards: given to a
    fenced write's function in place of ``g``, so each of its traversals is refused, as one
    traversal, once the fence moved (a server without transactions cannot refuse a write
    of several traversals as a whole; see :func:`under_fence`)."""

    def __init__(self, g: Any, fence: Fence) -> None:
        self._g = g
        self._finds = fence_finds(fence)

    def _prefix(self) -> Any:
        t = self._g
        for find in self._finds:
            t = find(t)
        return t

    def V(self, *ids: Any) -> Any:
        return self._prefix().V(*ids)

    def add_v(self, *label: Any) -> Any:
        return self._prefix().add_v(*label)

    def add_e(self, *label: Any) -> Any:
        return self._prefix().add_e(*label)


def under_fence(g: Any, fence: Fence, fn: Callable[[Any], X]) -> X:
    """Inside a write: ``fn`` on a :class:`FencedSource`, then the fence read again. A fence
    only moves forward (tokens grow, a resource's holder is a new attempt each claim), so if it
    still holds after ``fn`` it held at every one of ``fn``'s traversals; if not,
    :class:`StaleFencingToken` or :class:`ResourceTaken` is raised: on the embedded graph or a
    transactional server the whole write rolls back; on a server that runs one traversal at a
    time, the traversals that ran while the fence held stay, and none ran after."""
    fence_guard(g, fence)
    out = fn(FencedSource(g, fence))
    fence_guard(g, fence)
    return out


@dataclass(frozen=True)
class TaskChange:
    """A checked task update: what changed, and the task it leaves.

    The write is guarded by the version and by the fencing token the task carried when it was
    read, both inside the traversal: a task that moved on, or whose fence moved on (another
    owner claimed it, or someone closed its owner's attempt), matches nothing.
    """
    task_id: str
    expected_version: int
    expected_fence: int
    props: Mapping[str, Any]
    task: Task

    def find(self, src: Any) -> Any:
        return (src.V().has("task_id", self.task_id)
                .has("task_version", self.expected_version)
                .has("task_fence", codec.encode_big(self.expected_fence)))

    def traverse(self, src: Any) -> Any:
        return set_props(self.find(src), self.props)

    def add_to(self, write: Write) -> str:
        """Guard ``write`` by this change and make it; the task vertex's label in it."""
        label = write.guard(self.find)
        write.change(_select_set(label, self.props))
        return label

    def write(self, g: Any) -> None:
        if not self.traverse(g).id_().to_list():
            raise CommitConflict(self.task_id, self.expected_version, None)


@dataclass(frozen=True)
class AttemptStart:
    """A RUNNING attempt to add to a task vertex."""
    props: Mapping[str, Any]
    attempt: Attempt

    def extend(self, at_task: Any) -> Any:
        """Add the attempt and its edge after a traversal that stands on the task vertex."""
        t = add_vertex(at_task.as_("t"), "attempt", self.props).as_("a")
        return t.add_e("has_attempt").from_("t").to("a")

    def add_to(self, write: Write, task: str) -> None:
        """Add the attempt to ``write``, with its edge from the vertex labelled ``task``."""
        write.change(lambda t: add_vertex(t, "attempt", self.props).as_("new_attempt")
                     .add_e("has_attempt").from_(task).to("new_attempt"))


@dataclass(frozen=True)
class AttemptEnd:
    """The end of a RUNNING attempt, and the attempt it leaves."""
    attempt_id: str
    props: Mapping[str, Any]
    attempt: Attempt

    def find(self, src: Any) -> Any:
        return (src.V().has("attempt_id", self.attempt_id)
                .has("attempt_status", AttemptStatus.RUNNING.value))

    def traverse(self, src: Any) -> Any:
        return set_props(self.find(src), self.props)

    def add_to(self, write: Write) -> None:
        write.change(_select_set(write.guard(self.find), self.props))

    def write(self, g: Any) -> None:
        if not self.traverse(g).id_().to_list():
            raise AttemptAlreadyFinished(f"attempt {self.attempt_id} was finished meanwhile")


def task_change(task: Task, fence_token: int | None, changes: Mapping[str, Any],
                new_attempt: bool = False, move_fence: bool = False) -> TaskChange:
    """The change of ``task`` as it was read (at ``task.version``), without reading it again:
    the guards of the write (version and fence, see :class:`TaskChange`) refuse it if the task
    moved on since.

    Who writes decides the fence rule:

    * an owner (``fence_token``) writes only while its token is not older than the task's
      (a newer token is a newer lock holder taking over: it is recorded);
    * anyone else (``fence_token`` None: the master, an operator) leaves the fence alone, or,
      when it closes the current owner's attempt (``move_fence``), moves it one past the
      owner's token: from then on that owner can write nothing on the task, while every later
      lock node (a later czxid) still can.

    ``new_attempt`` counts one more started attempt.
    """
    unknown = set(changes) - TASK_CHANGES
    if unknown:
        raise InvalidValue(f"cannot change {sorted(unknown)} of a task")
    changes = dict(changes)
    if "status" in changes:
        changes["status"] = TaskStatus(changes["status"])
    fence = task.fence
    if fence_token is not None:
        if fence_token < task.fence:
            raise StaleFencingToken(task.id, fence_token, task.fence)
        fence = fence_token
    elif move_fence:
        fence = task.fence + 1
    fields = {**task.__dict__, **changes, "version": task.version + 1,
              "updated_at": codec.now(), "fence": fence,
              "attempts": task.attempts + (1 if new_attempt else 0)}
    old = task_props(task)
    new = task_props(Task(**fields))
    changed = {k: v for k, v in new.items() if k not in TASK_FIXED and old.get(k) != v}
    return TaskChange(task.id, task.version, task.fence, changed, task_from_row({**old, **changed}))


def fence_guard(g: Any, fence: Fence) -> None:
    """Inside a write: raise :class:`StaleFencingToken` unless ``fence`` is still the task's
    (one read; in a transaction nothing can move the fence between this check and the write's
    other steps; on a server without transactions, see :func:`under_fence`)."""
    if not (g.V().has("task_id", fence.task_id)
            .has("task_fence", codec.encode_big(fence.token)).id_().to_list()):
        raise StaleFencingToken(fence.task_id, fence.token, -1)
    if fence.attempt_id is not None:
        resource_guard(g, fence.task_id, fence.attempt_id, fence.resources)


def resource_guard(g: Any, task_id: str, attempt_id: str, resources: tuple[str, ...]) -> None:
    """Inside a write: raise :class:`ResourceTaken` unless attempt ``attempt_id`` is still the
    last to have claimed each of ``resources`` (:func:`claim_resources`). The ZooKeeper hold
    keeps live holders apart; this keeps a holder that lost its hold with its session (frozen,
    cut off) from writing after the next holder's claim, whatever it has not yet learned."""
    for resource in sorted(set(resources)):
        if not (g.V().has("resource_name", resource)
                .has("resource_holder", attempt_id).id_().to_list()):
            raise ResourceTaken(task_id, attempt_id, resource)


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

    def write(g: Any) -> Attempt:
        g.V().has("task_id", change.task_id).id_().to_list()  # takes the writer slot
        start = attempt_start(change.task, member_id, fence_token)
        w = Write()
        for end in ends:
            end.add_to(w)
        task = change.add_to(w)
        start.add_to(w, task)
        held = {"resource_holder": start.attempt.id,
                "resource_token": codec.encode_big(fence_token)}
        for name in names:
            label = w.guard(finder(("resource_name", name), ("resource_token", tokens[name])))
            w.change(_select_set(label, held))
        if not w.traverse(g).id_().to_list():
            raise _Unmatched
        return start.attempt

    try:
        return graph.write(write)
    except (_Unmatched, WriteRaceLost):
        return None


def _resource_maker(name: str) -> Callable[[Any], None]:
    new = {"resource_name": name, "resource_holder": "", "resource_token": codec.encode_big(0)}
    return lambda g: get_or_add(g, "resource_name", name, "resource", new).iterate()


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


def attempt_start(task: Task, executor: str, fence_token: int) -> AttemptStart:
    """The RUNNING attempt that ``task`` (as the same write leaves it: its ``attempts`` already
    count this one) starts; its end, duration, error and stack are written when it ends."""
    attempt_id = str(uuid.uuid4())
    props = {
        "attempt_id": attempt_id, "attempt_status": AttemptStatus.RUNNING.value,
        "attempt_start": codec.encode_json({
            "task": task.id, "seq": task.attempts, "executor": executor,
            "started": codec.encode_time(codec.now()),
            "fence": codec.encode_big(fence_token)}),
    }
    return AttemptStart(props, attempt_from_row(props))


def attempt_end(attempt: Attempt, status: AttemptStatus, error: str | None = None,
                stack_trace: str | None = None) -> AttemptEnd:
    """The end of ``attempt`` as it was read, without reading it again: the write is guarded
    by its RUNNING status."""
    status = AttemptStatus(status)
    if status is AttemptStatus.RUNNING:
        raise InvalidValue("finish() needs a final status")
    if attempt.status is not AttemptStatus.RUNNING:
        raise AttemptAlreadyFinished(f"attempt {attempt.id} is already {attempt.status.value}")
    ended = codec.now()
    doc: dict[str, Any] = {
        "ended": codec.encode_time(ended),
        "duration_ms": int((ended - attempt.started_at).total_seconds() * 1000),
    }
    if error:
        doc["error"] = error
    if stack_trace:
        doc["stack"] = stack_trace
    props = {"attempt_status": status.value, "attempt_end": codec.encode_json(doc),
             # the UTC day it ended: recent ends are found from an index, not a scan of all
             "attempt_end_day": ended.strftime("%Y-%m-%d")}
    ended_attempt = dataclasses.replace(
        attempt, status=status, ended_at=codec.decode_time(doc["ended"]),
        duration_ms=doc["duration_ms"], error=error or None, stack_trace=stack_trace or None)
    return AttemptEnd(attempt.id, props, ended_attempt)


class _Unmatched(Exception):
    """A guarded write matched nothing: raised to roll its transaction back."""


def matched_write(graph: Graph, guarded: Callable[[Any], Any]) -> bool:
    """Write one guarded traversal; False, rolled back, when its guards matched nothing."""
    def write(g: Any) -> None:
        if not guarded(g).id_().to_list():
            raise _Unmatched

    try:
        graph.write(write)
    except (_Unmatched, WriteRaceLost):  # a server whose locks refused the commit: the same
        return False
    return True


def until_written(attempt: Callable[[], X | None], what: str, tries: int = 20) -> X:
    """The store's one re-read-and-write loop: ``attempt()`` reads what it needs, decides, and
    writes one guarded traversal; it returns None when the guards matched nothing (someone
    wrote first), and is then run again after a short random pause. Raises
    :class:`CommitConflict` after ``tries`` refusals in a row; any other store error
    (StaleFencingToken, TaskNotFound, ...) ends the loop at once."""
    for n in range(tries):
        result = attempt()
        if result is not None:
            return result
        time.sleep(random.uniform(0, min(0.1, 0.002 * 2 ** n)))
    raise CommitConflict(what, -1, None)


