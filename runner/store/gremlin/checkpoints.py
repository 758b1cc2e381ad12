"""Checkpoints: the state a long handler commits (``ctx.checkpoint``) so that the task's next
attempt, on any node, resumes from it (``ctx.resume``) instead of starting again at zero.

A task vertex holds its last checkpoint in two properties: ``task_ckpt``, the state as JSON
(at most :data:`~runner.store.model.CHECKPOINT_LIMIT` bytes), read only by the attempt that
resumes; and ``task_ckpt_meta`` (when, how many bytes, the attempt's ``seq``), small, in every
task row (``task show``, ``top`` and the web console show its age and size). Both empty: no
checkpoint (never written, or dropped by ``task reactivate --fresh``).

The write is one traversal guarded like an owner's end: the attempt still RUNNING and the
task's fence still the attempt's token. An owner that lost its task (a newer claim moved the
fence, the master's reaper or an operator closed its attempt) matches nothing and writes
nothing, so a stale owner never overwrites a newer attempt's checkpoint: it gets
:class:`~runner.errors.StaleFencingToken` or :class:`~runner.errors.AttemptAlreadyFinished`.
The write leaves the task's version alone: the owner's end, guarded by the version it claimed
at, still matches after any number of checkpoints, and no listing is made stale by one.

Failure behaviour: a state that is not JSON or is over the limit raises
:class:`~runner.errors.InvalidValue` before anything is written; a graph out of reach raises
``StoreUnavailable`` (the checkpoint may or may not have landed: the next one, or the resume,
reads what did).
"""

from __future__ import annotations

import dataclasses

from runner.errors import AttemptAlreadyFinished, InvalidValue, StaleFencingToken
from runner.store import codec
from runner.store.api import Graph
from runner.store.gremlin.batch import matched
from runner.store.gremlin.guards import Write, finder, set_on
from runner.store.gremlin.rows import checkpoint_from_meta, checkpoint_meta
from runner.store.gremlin.writes import TaskChange, task_change
from runner.store.model import (
    CHECKPOINT_LIMIT,
    AttemptStatus,
    Checkpoint,
    CheckpointInfo,
    Fence,
    Task,
    TaskStatus,
)

#: the properties a task's checkpoint is stored in: the state, what a row shows of it
STATE, META = "task_ckpt", "task_ckpt_meta"


def encode_state(state: object) -> str:
    """``state`` as stored; :class:`InvalidValue` naming the limit when it is over it."""
    text = codec.encode_json(state)  # InvalidValue when it is not JSON
    size = len(text.encode())
    if size > CHECKPOINT_LIMIT:
        raise InvalidValue(f"a checkpoint is at most {CHECKPOINT_LIMIT} bytes of JSON; this one "
                           f"is {size}: keep a cursor (an offset, the last key done), not data")
    return text


def fresh_start(task: Task) -> TaskChange:
    """The change of ``task reactivate --fresh``: active again, its checkpoint dropped (both
    properties emptied), in one write; :class:`InvalidValue` while an attempt runs it."""
    if task.status is TaskStatus.RUNNING:
        raise InvalidValue(f"task {task.id} is running on {task.owner}: cancel it first, then "
                           "reactivate it --fresh")
    change = task_change(task, None, {"active": True, "stop_reason": None})
    return dataclasses.replace(change, props={**change.props, STATE: "", META: ""},
                               task=dataclasses.replace(change.task, checkpoint=None))


class GremlinCheckpointStore:
    """Tasks' checkpoints on the graph (see the module)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def commit(self, fence: Fence, seq: int, state: object) -> CheckpointInfo:
        """Store ``state`` as the task's checkpoint, written by attempt ``fence.attempt_id``
        (its ``seq``) while ``fence.token`` is still the task's and the attempt RUNNING;
        durable when this returns (see the module for the errors)."""
        if fence.attempt_id is None:
            raise InvalidValue("a checkpoint is written by an attempt: its fence names none")
        text = encode_state(state)
        info = CheckpointInfo(codec.now(), len(text.encode()), seq)
        w = Write()
        w.guard(finder(("attempt_id", fence.attempt_id),
                       ("attempt_status", AttemptStatus.RUNNING.value)))
        task = w.guard(finder(("task_id", fence.task_id),
                              ("task_fence", codec.encode_big(fence.token))))
        w.change(set_on(task, {STATE: text, META: checkpoint_meta(info)}))
        if matched(self.graph, w):
            return info
        status = self.graph.read(lambda g: g.V().has("attempt_id", fence.attempt_id)
                                 .values("attempt_status").to_list())
        if status and status[0] != AttemptStatus.RUNNING.value:
            raise AttemptAlreadyFinished(
                f"attempt {fence.attempt_id} is {status[0]}: its checkpoint was not written")
        fences = self.graph.read(lambda g: g.V().has("task_id", fence.task_id)
                                 .values("task_fence").to_list())
        raise StaleFencingToken(fence.task_id, fence.token,
                                codec.decode_big(fences[0]) if fences else None)

    def read(self, task_id: str) -> Checkpoint | None:
        """The task's last committed checkpoint (one read), or None."""
        rows = self.graph.read(lambda g: g.V().has("task_id", task_id)
                               .element_map(STATE, META).to_list())
        if not rows or not rows[0].get(STATE):
            return None
        info = checkpoint_from_meta(rows[0].get(META))
        if info is None:
            return None
        return Checkpoint(codec.decode_json(rows[0][STATE]), info)
