"""Rows of the task and attempt vertices: the properties a task is written as, and the
decoders from a ``valueMap``-style row back to the model. An unknown stored format raises
:class:`~runner.errors.UnknownStoreFormat`."""

from __future__ import annotations

from runner.errors import (
    UnknownStoreFormat,
)
from runner.store import codec, due
from runner.store.ends import progress_from_json
from runner.store.model import (
    Attempt,
    AttemptStatus,
    CheckpointInfo,
    Heartbeat,
    StopCause,
    Task,
    TaskStatus,
)
from runner.store.traversal import PropValue, Row

TASK_CHANGES = {"status", "finished", "active", "payload", "owner", "priority", "run_at",
                "skipped", "stop_reason", "stop", "pending", "awaits_commit"}


TASK_FIXED = ("task_id", "task_type", "task_created", "task_unique", "task_okey")




def list_state(task: Task) -> str:
    return task.stored_state().value


def resource_key(resource: str) -> str:
    """The property that marks the tasks taking ``resource`` (its name hex-encoded: any
    name makes a valid key)."""
    return "task_res_" + resource.encode().hex()


def task_props(task: Task, *, payload: bool = True) -> dict[str, PropValue]:
    """The task's properties as written (``payload=False``: all but its payload, for a change
    that leaves it alone: the payload is the one property of any size)."""
    created = codec.encode_time(task.created_at)
    props: dict[str, PropValue] = {"task_id": task.id, "task_type": task.type,
                                   "task_created": created}
    # what an operator's list filters on (runner.store.gremlin.search), each from an index
    digits = "".join(ch for ch in created if ch.isdigit())
    props["task_h"], props["task_s"] = digits[:10], digits[:14]  # creation hour, second
    props["task_shard"] = due.shard_of(task.id)  # which member prefers it (runner.store.due)
    for resource in task.resources:
        props[resource_key(resource)] = "1"
    if task.unique_key is not None:
        props["task_unique"] = task.unique_key
    if task.ordering_key is not None:
        props["task_okey"] = task.ordering_key
    if task.workflow is not None:  # its workflow's members, found from an index
        props["task_wf"] = task.workflow
    props.update(changing_props(task, payload=payload))
    return props


def changing_props(task: Task, *, payload: bool = True) -> dict[str, PropValue]:
    """The properties of :func:`task_props` that a change of the task can move (those of
    ``TASK_CHANGES`` and what is derived from them: its version, fence, state, indexes); the
    others are written once, when the task is made. A change compares these only: half of
    ``task_props``'s cost, which a claim and an end each paid twice."""
    props: dict[str, PropValue] = {
        "task_priority": task.priority, "task_version": task.version,
        "task_queue": (queue := due.queue_of(task, codec.now())),
        "task_lane": due.lane_field(task, queue),
        "task_state": codec.encode_json({
            "status": task.status.value, "active": task.active, "finished": task.finished,
            "owner": task.owner or "", "updated": codec.encode_time(task.updated_at),
            "attempts": task.attempts,
            "run_at": codec.encode_time(task.run_at) if task.run_at else "",
            "resources": list(task.resources), "skipped": task.skipped,
            **({"stop_reason": task.stop_reason} if task.stop_reason else {}),
            **({"stop": task.stop.value} if task.stop is not None else {}),
            **({"timeout": task.timeout} if task.timeout is not None else {}),
            # a workflow member's unmet dependencies (none: the key is left out)
            **({"pending": task.pending} if task.pending else {}),
            **({"commit": True} if task.awaits_commit else {}),
            **({"onfail": True} if task.on_failure else {})}),
        "task_fence": codec.encode_big(task.fence),
        # the unfinished tasks of an ordering key, found from an index ("" once finished)
        "task_okey_open": task.ordering_key if task.ordering_key and not task.finished else "",
        # stopped tasks (inactive, unfinished), found from an index by the master's incidents
        "task_stopped": "1" if not task.active and not task.finished else "",
        "task_list": list_state(task),
        "task_owner": task.owner or "",
    }
    if task.workflow is not None:  # its workflow's roots that wait for its commit
        props["task_wfwait"] = task.workflow if task.awaits_commit else ""
    if task.on_failure:  # its workflow's on_failure step, while it waits for a stop
        props["task_wfonfail"] = task.workflow if task.pending else ""
    if payload:
        props["task_payload"] = codec.encode_json(task.payload)
    if task.finished:  # the UTC day it finished: retention walks finished tasks by day
        props["task_end_day"] = task.updated_at.strftime("%Y-%m-%d")
    if task.checkpoint is not None:  # written by ctx.checkpoint (runner.store.gremlin.checkpoints)
        props["task_ckpt_meta"] = checkpoint_meta(task.checkpoint)
    return props


def checkpoint_meta(info: CheckpointInfo) -> str:
    """``task_ckpt_meta``: what a task's row says of its last checkpoint (the state itself is
    ``task_ckpt``, read only by the attempt that resumes from it)."""
    return codec.encode_json({"at": codec.encode_time(info.at), "size": info.size,
                              "seq": info.seq})


def checkpoint_from_meta(raw: str | None) -> CheckpointInfo | None:
    if not raw:  # never written, or dropped (``task reactivate --fresh``)
        return None
    value = codec.decode_json(raw)
    return CheckpointInfo(codec.decode_time(value["at"]), int(value["size"]), int(value["seq"]))


#: the properties a task is made of (:func:`task_from_row`); the others are the indexes'
#: (``task_queue``, ``task_lane``, ``task_list``...). A read for tasks asks for these only:
#: half the rows' bytes, and on a Gremlin Server a listing of 97 tasks cost 5.6 ms of the
#: client's CPU and 3.2 of the server's with every property, 3.1 and 1.8 with seven
TASK_ROW = ("task_id", "task_type", "task_payload", "task_priority", "task_created",
            "task_version", "task_state", "task_fence", "task_unique", "task_okey",
            "task_ckpt_meta", "task_wf")


def task_from_row(row: Row) -> Task:
    if "task_state" not in row or "task_fence" not in row:
        raise UnknownStoreFormat(
            f"task {row.get('task_id')!r} has no task_state: the graph was written by an "
            f"older latchwork; recreate it")
    state = codec.decode_json(row["task_state"])
    return Task(
        id=row["task_id"], type=row["task_type"],
        payload=codec.decode_json(row["task_payload"]), active=bool(state["active"]),
        status=TaskStatus(state["status"]), finished=bool(state["finished"]),
        priority=int(row["task_priority"]), created_at=codec.decode_time(row["task_created"]),
        updated_at=codec.decode_time(state["updated"]), version=int(row["task_version"]),
        fence=codec.decode_big(row["task_fence"]), unique_key=row.get("task_unique"),
        owner=state["owner"] or None, attempts=int(state["attempts"]),
        run_at=codec.decode_time(state["run_at"]) if state.get("run_at") else None,
        ordering_key=row.get("task_okey"), resources=tuple(state.get("resources", ())),
        skipped=bool(state.get("skipped", False)), stop_reason=state.get("stop_reason"),
        checkpoint=checkpoint_from_meta(row.get("task_ckpt_meta")), timeout=state.get("timeout"),
        stop=StopCause(state["stop"]) if state.get("stop") else None,
        workflow=row.get("task_wf"), pending=int(state.get("pending", 0)),
        awaits_commit=bool(state.get("commit", False)),
        on_failure=bool(state.get("onfail", False)))


#: what an attempt's row is read with: every property but its result (``attempt_result``, up
#: to 64 KiB, read only where a result is asked for)
ATTEMPT_KEYS = ("attempt_id", "attempt_status", "attempt_start", "attempt_end",
                "attempt_progress", "attempt_beat")


def attempt_from_row(row: Row) -> Attempt:
    if "attempt_start" not in row:
        raise UnknownStoreFormat(
            f"attempt {row.get('attempt_id')!r} has no attempt_start: the graph was written by "
            f"an older latchwork; recreate it")
    start = codec.decode_json(row["attempt_start"])
    end = codec.decode_json(row["attempt_end"]) if row.get("attempt_end") else {}
    return Attempt(
        id=row["attempt_id"], task_id=start["task"], seq=int(start["seq"]),
        status=AttemptStatus(row["attempt_status"]), executor=start["executor"],
        started_at=codec.decode_time(start["started"]), fence=codec.decode_big(start["fence"]),
        ended_at=codec.decode_time(end["ended"]) if end else None,
        duration_ms=int(end["duration_ms"]) if end else None,
        error=end.get("error") or None, stack_trace=end.get("stack") or None,
        progress=progress_from_json(row.get("attempt_progress") or ""),
        heartbeat=heartbeat_from_json(row.get("attempt_beat")))


def heartbeat_from_json(raw: str | None) -> Heartbeat | None:
    if not raw:
        return None
    value = codec.decode_json(raw)
    return Heartbeat(codec.decode_time(value["at"]), value["details"])


