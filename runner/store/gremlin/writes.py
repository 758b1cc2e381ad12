"""The write algebra: guarded changes prepared outside the write slot, applied as one traversal.

The store reads and checks first, outside any write transaction, and then writes one guarded
traversal: the embedded graph's single writer slot is held only for the write, and a change
that is no longer true (someone else wrote first) matches nothing. ``traverse(src)`` builds the
guarded write from ``g`` or from a traversal (mid-traversal ``V()``), so several changes can
go out as one traversal.

A guard that matches nothing means someone else wrote first: the caller re-reads and retries
(:func:`until_written`, the one re-read-and-write loop of the store) or reports
:class:`~runner.errors.CommitConflict` / :class:`~runner.errors.StaleFencingToken`.

Why one module: a task's change, its fence rule and its stop cause (:func:`task_change`), an
attempt's start and end, and the guarded write they go out in are one algebra that every
write of the store composes; split, each half would import the other.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import Any

from runner.errors import (
    AttemptAlreadyFinished,
    CommitConflict,
    InvalidValue,
    StaleFencingToken,
    TaskFinished,
    WriteRaceLost,
)
from runner.store import codec
from runner.store.api import Graph
from runner.store.ends import AttemptEnd, Conclusion
from runner.store.gremlin.guards import Write, finder, set_on
from runner.store.gremlin.rows import (
    TASK_CHANGES,
    TASK_FIXED,
    changing_props,
    task_from_row,
    task_props,
)
from runner.store.gremlin.steps import X, add_vertex, has_all, set_props
from runner.store.model import Attempt, AttemptStatus, StopCause, Task, TaskStatus
from runner.store.traversal import Props, Traversal


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
    props: Props
    task: Task

    def find(self, src: Traversal) -> Traversal:
        return has_all(src.V(), *self._pairs())

    def _pairs(self) -> tuple[tuple[str, object], ...]:
        return (("task_id", self.task_id), ("task_version", self.expected_version),
                ("task_fence", codec.encode_big(self.expected_fence)))

    def traverse(self, src: Traversal) -> Traversal:
        return set_props(self.find(src), self.props)

    def add_to(self, write: Write) -> str:
        """Guard ``write`` by this change and make it; the task vertex's label in it."""
        label = write.guard(finder(*self._pairs()))
        write.change(set_on(label, self.props))
        return label

    def write(self, g: Traversal) -> None:
        if not self.traverse(g).id_().to_list():
            raise CommitConflict(self.task_id, self.expected_version, None)


@dataclass(frozen=True)
class AttemptStart:
    """A RUNNING attempt to add to a task vertex."""
    props: Props
    attempt: Attempt

    def extend(self, at_task: Traversal) -> Traversal:
        """Add the attempt and its edge after a traversal that stands on the task vertex."""
        t = add_vertex(at_task.as_("t"), "attempt", self.props).as_("a")
        return t.add_e("has_attempt").from_("t").to("a")

    def add_to(self, write: Write, task: str) -> None:
        """Add the attempt to ``write``, with its edge from the vertex labelled ``task``."""
        write.change(lambda t: add_vertex(t, "attempt", self.props).as_("new_attempt")
                     .add_e("has_attempt").from_(task).to("new_attempt"), self.op(task))

    def op(self, task: str) -> tuple[object, ...]:
        """The attempt and its edge from the vertex named ``task`` as data
        (:mod:`runner.store.embedded.direct`)."""
        return ("add", "attempt", self.props, "has_attempt", task)


def end_pairs(end: AttemptEnd) -> tuple[tuple[str, str], ...]:
    """What finds the attempt of ``end`` while it is still RUNNING (the guard of its end)."""
    return (("attempt_id", end.attempt_id), ("attempt_status", AttemptStatus.RUNNING.value))


def add_end(write: Write, end: AttemptEnd) -> None:
    """Guard ``write`` by the attempt of ``end`` being RUNNING, and end it."""
    write.change(set_on(write.guard(finder(*end_pairs(end))), end.props))


def write_end(end: AttemptEnd) -> Callable[[Traversal], None]:
    """The end alone, as a graph write: AttemptAlreadyFinished when it was ended meanwhile."""
    def write(g: Traversal) -> None:
        if not set_props(has_all(g.V(), *end_pairs(end)), end.props).id_().to_list():
            raise AttemptAlreadyFinished(f"attempt {end.attempt_id} was finished meanwhile")
    return write


def conclusion_write(c: Conclusion, change: TaskChange, with_end: bool = True,
                     releases: Sequence[TaskChange] = ()) -> Write:
    """The guarded write of conclusion ``c`` over ``change`` (the task as it is to be
    written): the attempt still RUNNING (``with_end``), the task's version and fence, and for
    a success each resource still held by the attempt; with ``releases``, the changes its
    success makes of its dependants (a workflow member's: :mod:`.workflows`), each guarded by
    its own version."""
    w = Write()
    add_conclusion(w, c, change, with_end)
    for release in releases:
        release.add_to(w)
    return w


def add_conclusion(w: Write, c: Conclusion, change: TaskChange, with_end: bool = True) -> None:
    """Add conclusion ``c`` (its guards and changes, see :func:`conclusion_write`) to ``w``."""
    if with_end:
        add_end(w, c.end)
    change.add_to(w)
    for name in sorted(set(c.needs)):
        w.guard(finder(("resource_name", name), ("resource_holder", c.end.attempt_id)))


def task_change(task: Task, fence_token: int | None, changes: Mapping[str, object],
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
    fields = _changed_fields(task, fence_token, changes, new_attempt, move_fence)
    if "payload" in changes:  # the task as a read would give it back, payload included
        old = task_props(task)
        new = task_props(Task(**fields))
        changed = {k: v for k, v in new.items() if k not in TASK_FIXED and old.get(k) != v}
        return TaskChange(task.id, task.version, task.fence, changed,
                          task_from_row({**old, **changed}))
    # the loop's changes (a claim, an end): neither the payload encoded twice nor the new
    # task decoded from its own properties; the fields a read would normalise are normalised
    after = _normalised(fields)
    old = changing_props(task, payload=False)
    new = changing_props(after, payload=False)
    changed = {k: v for k, v in new.items() if old.get(k) != v}
    return TaskChange(task.id, task.version, task.fence, changed, after)


def changed_task(task: Task, fence_token: int, changes: Mapping[str, object]) -> Task:
    """The task :func:`task_change` of a new attempt leaves, without comparing what it
    changed (a new task written whole: ``GraphStore.create_claimed``; not its payload)."""
    return _normalised(_changed_fields(task, fence_token, changes, True, False))


def _changed_fields(task: Task, fence_token: int | None, changes: Mapping[str, object],
                    new_attempt: bool, move_fence: bool) -> dict[str, Any]:
    unknown = set(changes) - TASK_CHANGES
    if unknown:
        raise InvalidValue(f"cannot change {sorted(unknown)} of a task")
    if new_attempt and (task.pending > 0 or task.awaits_commit):
        # a workflow member that waits (its version guards the claim: any change of its count
        # moves it, so a claim from a read made while it waited is refused in the write too)
        raise CommitConflict(task.id, task.version, None)
    wanted: dict[str, Any] = dict(changes)  # the task's fields: Task(**fields) checks them
    if "status" in wanted:
        wanted["status"] = TaskStatus(wanted["status"])
    fence = task.fence
    if fence_token is not None:
        if fence_token < task.fence:
            raise StaleFencingToken(task.id, fence_token, task.fence)
        fence = fence_token
    elif move_fence:
        fence = task.fence + 1
    fields = {**task.__dict__, **wanted, "version": task.version + 1,
              "updated_at": codec.now(), "fence": fence,
              "attempts": task.attempts + (1 if new_attempt else 0)}
    fields["stop"] = stop_of(fields, wanted.get("stop"))
    return fields


def finished_error(task: Task, action: str) -> TaskFinished:
    """The refusal of an action that needs an unfinished task (``action``: "reactivated",
    "skipped", ...) on one that succeeded or was skipped."""
    state = task.stored_state().value
    return TaskFinished(f"task {task.id} {state}: a finished task is not {action} (a task "
                        f"succeeds once; submit a new task to run its work again); nothing "
                        f"was changed")


def stop_of(fields: Mapping[str, Any], given: str | None) -> StopCause | None:
    """Why a task so changed is stopped: none while it is active or finished; else what the
    change says (the owner's end after a failure: ``failed``), else what it was, else
    ``cancelled`` (an operator's cancel or deactivate, a stop before it ran)."""
    if fields["active"] or fields["finished"]:
        return None
    if given is not None:
        return StopCause(given)
    return fields.get("stop") or StopCause.CANCELLED


def _normalised(fields: dict[str, Any]) -> Task:
    """The task of ``fields``, its values as a read gives them back."""
    run_at = fields["run_at"]
    return Task(**{**fields, "owner": fields["owner"] or None,
                   "stop_reason": fields["stop_reason"] or None,
                   "priority": int(fields["priority"]), "active": bool(fields["active"]),
                   "finished": bool(fields["finished"]), "skipped": bool(fields["skipped"]),
                   "run_at": run_at.astimezone(UTC) if run_at is not None else None})


def attempt_start(task: Task, executor: str, fence_token: int) -> AttemptStart:
    """The RUNNING attempt that ``task`` (as the same write leaves it: its ``attempts`` already
    count this one) starts; its end, duration, error and stack are written when it ends."""
    attempt_id = str(uuid.uuid4())
    started = codec.now()
    props = {
        "attempt_id": attempt_id, "attempt_status": AttemptStatus.RUNNING.value,
        "attempt_start": codec.encode_json({
            "task": task.id, "seq": task.attempts, "executor": executor,
            "started": codec.encode_time(started),
            "fence": codec.encode_big(fence_token)}),
    }
    # the attempt a read of these properties gives (attempt_from_row), not decoded from them
    return AttemptStart(props, Attempt(
        id=attempt_id, task_id=task.id, seq=task.attempts, status=AttemptStatus.RUNNING,
        executor=executor, started_at=started, fence=fence_token))


class _Unmatched(Exception):
    """A guarded write matched nothing: raised to roll its transaction back."""


def matched_write(graph: Graph, guarded: Callable[[Traversal], Traversal]) -> bool:
    """Write one guarded traversal; False, rolled back, when its guards matched nothing."""
    def write(g: Traversal) -> None:
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


