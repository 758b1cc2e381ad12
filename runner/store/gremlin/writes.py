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

    def traverse(self, src: Any) -> Any:
        return set_props(src.V().has("task_id", self.task_id)
                    .has("task_version", self.expected_version)
                    .has("task_fence", codec.encode_big(self.expected_fence)), self.props)

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


@dataclass(frozen=True)
class AttemptEnd:
    """The end of a RUNNING attempt, and the attempt it leaves."""
    attempt_id: str
    props: Mapping[str, Any]
    attempt: Attempt

    def traverse(self, src: Any) -> Any:
        return set_props(src.V().has("attempt_id", self.attempt_id)
                    .has("attempt_status", AttemptStatus.RUNNING.value), self.props)

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
    (one read in the write's own transaction on the embedded graph, so nothing can move the
    fence between this check and the write's other steps)."""
    if not (g.V().has("task_id", fence.task_id)
            .has("task_fence", codec.encode_big(fence.token)).id_().to_list()):
        raise StaleFencingToken(fence.task_id, fence.token, -1)
    if fence.attempt_id is not None:
        resource_guard(g, fence.task_id, fence.attempt_id, fence.resources)


def resource_guard(g: Any, task_id: str, attempt_id: str, resources: tuple[str, ...]) -> None:
    """Inside a write: raise :class:`ResourceTaken` unless attempt ``attempt_id`` is still the
    last to have claimed each of ``resources`` (:func:`take_resources`). The ZooKeeper hold
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
    of each resource, in one transaction; the attempt, or None when its guards matched
    nothing. The start time is read once the write holds the writer slot (its first
    statement takes it on the embedded graph), so it is later than every write committed
    before, the previous holder's success among them.

    A resource also records the claimant's ``fence_token`` (its task lock's czxid: ZooKeeper's
    transaction ids only grow), and a claim whose token is older than the one recorded is
    refused (None): a claimant that booked its hold and took its lock before another, and
    whose write commits only after that other's claim (a slow write, a session lost between
    the two), cannot take the resource back from the newer holder."""
    def write(g: Any) -> Attempt:
        g.V().has("task_id", change.task_id).id_().to_list()  # takes the writer slot
        if _newer_holder(g, resources, fence_token):
            raise _Unmatched
        start = attempt_start(change.task, member_id, fence_token)
        t = g
        for end in ends:
            t = end.traverse(t)
        if not start.extend(change.traverse(t)).id_().to_list():
            raise _Unmatched
        take_resources(g, start.attempt.id, resources, fence_token)
        return start.attempt

    try:
        return graph.write(write)
    except (_Unmatched, WriteRaceLost):
        return None


def _newer_holder(g: Any, resources: tuple[str, ...], fence_token: int) -> bool:
    """Inside a claim's write: whether a resource was last claimed with a newer token than
    ``fence_token`` (compared here, in the write's own transaction: the portable subset has no
    numeric comparison gremlite keeps)."""
    rows = g.V().has("resource_name", P.within(sorted(set(resources)))) \
        .values("resource_token").to_list()
    return any(codec.decode_big(token) > fence_token for token in rows)


def take_resources(g: Any, attempt_id: str, resources: tuple[str, ...],
                   fence_token: int) -> None:
    """Inside the claim's write: record attempt ``attempt_id`` and its ``fence_token`` as the
    holder of each of ``resources`` (a ``resource`` vertex per name, made on first use), which
    refuses every later write of the previous holder that needs them (:func:`resource_guard`),
    and every later claim with an older token (:func:`claim_resources`)."""
    for resource in sorted(set(resources)):
        set_props(get_or_add(g, "resource_name", resource, "resource",
                             {"resource_name": resource}),
                  {"resource_holder": attempt_id,
                   "resource_token": codec.encode_big(fence_token)}).iterate()


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


