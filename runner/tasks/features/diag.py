"""Diagnostic task types for operators and tests.

* ``diag.sleep`` ``{"seconds": 2.5}``: sleeps, honouring cancellation;
* ``diag.fail`` ``{"message": "..."}``: raises ``RuntimeError(message)`` (the task stops);
* ``diag.conflict`` ``{"conflicts": N}``: its first N attempts raise a commit conflict, then it
  succeeds (exercises the automatic retry with backoff);
* ``diag.effect`` ``{"seconds": 0.5}``: sleeps, then checks its ownership (``ctx.check()``) and
  writes one effect record (a ``diag_effect`` vertex: task, attempt, token, time) together
  with its success (``ctx.complete()``: one fenced write). The chaos suite counts these
  records: an effect written twice for one task, or by an attempt that did not succeed, is a
  broken guarantee (:func:`effects`);
* ``diag.append`` ``{"path": "/tmp/effects", "seconds": 0.5}`` (or ``"until"``: an epoch time
  to wait for instead): the way a user's handler touches a system that cannot check a token.
  It waits polling ``ctx.cancel``, calls ``ctx.check()`` right before its effect, then appends
  one JSON line (task, attempt, token, member, when the check returned, when it wrote) to
  ``path`` with O_APPEND. Nothing fences that line: the chaos suite counts lines written twice
  for one task or by an attempt that did not succeed, which is what a user would see
  (:func:`appended`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from runner.store import Store, codec
from runner.tasks import TaskCancelled, TaskConflict, TaskContext, TaskRegistry


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Sleep(_Payload):
    seconds: float = Field(ge=0, le=86400)


class Fail(_Payload):
    message: str = "diag.fail was asked to fail"


class Conflict(_Payload):
    conflicts: int = Field(1, ge=0, le=100)


def sleep(ctx: TaskContext, payload: Sleep) -> None:
    """Sleep, reporting progress in tenths (seconds >= 1) so consoles have something to show."""
    if payload.seconds < 1:
        if ctx.cancel.wait(payload.seconds):
            raise TaskCancelled(ctx.cancel.reason)
        return
    for step in range(10):
        ctx.progress(step, 10, f"{step * payload.seconds / 10:.1f} of {payload.seconds:g} s")
        if ctx.cancel.wait(payload.seconds / 10):
            raise TaskCancelled(ctx.cancel.reason)
    ctx.progress(10, 10, "done")


def fail(ctx: TaskContext, payload: Fail) -> None:
    raise RuntimeError(payload.message)


def conflict(ctx: TaskContext, payload: Conflict) -> None:
    if ctx.attempt.seq <= payload.conflicts:
        raise TaskConflict(f"simulated commit conflict {ctx.attempt.seq} of {payload.conflicts}")


class Effect(_Payload):
    seconds: float = Field(0.0, ge=0, le=3600)


@dataclass(frozen=True)
class EffectRecord:
    task_id: str
    attempt_id: str
    token: int
    at: str  # UTC ISO time the record was written


def effect(ctx: TaskContext, payload: Effect) -> None:
    if ctx.cancel.wait(payload.seconds):
        raise TaskCancelled(ctx.cancel.reason)
    ctx.check()
    props = {"effect_task": ctx.task.id, "effect_attempt": ctx.attempt.id,
             "effect_token": codec.encode_big(ctx.fence_token),
             "effect_at": codec.encode_time(codec.now())}

    def write(g: Any) -> Any:
        t = g.add_v("diag_effect")
        for key, value in props.items():
            t = t.property(key, value)
        return t

    ctx.complete(write)  # the record, the attempt's success and the finish: one write


class Append(_Payload):
    path: str = Field(min_length=1)
    seconds: float = Field(0.0, ge=0, le=3600)
    until: float | None = None  # epoch seconds: wait until then instead


@dataclass(frozen=True)
class AppendRecord:
    task_id: str
    attempt_id: str
    token: int
    member: str
    checked: float  # epoch seconds when ctx.check() returned
    at: float  # epoch seconds right before the write


def append(ctx: TaskContext, payload: Append) -> None:
    wait = payload.seconds if payload.until is None else max(0.0, payload.until - time.time())
    if ctx.cancel.wait(wait):
        raise TaskCancelled(ctx.cancel.reason)
    ctx.check()  # right before the effect, as docs/runner.md asks
    checked = time.time()
    line = json.dumps({"task": ctx.task.id, "attempt": ctx.attempt.id,
                       "token": ctx.fence_token, "member": ctx.member_id,
                       "checked": checked, "at": time.time()})
    fd = os.open(payload.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def appended(path: Path) -> list[AppendRecord]:
    """Every line ``diag.append`` wrote to ``path`` (none when it does not exist)."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        records.append(AppendRecord(row["task"], row["attempt"], int(row["token"]),
                                    row["member"], float(row["checked"]), float(row["at"])))
    return records


def effects(store: Store) -> list[EffectRecord]:
    """Every effect record ``diag.effect`` wrote."""
    rows = store.graph.read(
        lambda g: g.V().has_label("diag_effect").element_map().to_list())
    return [EffectRecord(r["effect_task"], r["effect_attempt"],
                         codec.decode_big(r["effect_token"]), r["effect_at"]) for r in rows]


def register_diagnostics(registry: TaskRegistry) -> None:
    registry.register("diag.sleep", sleep, Sleep, description="sleep; honours cancellation")
    registry.register("diag.fail", fail, Fail, description="raise RuntimeError")
    registry.register("diag.conflict", conflict, Conflict,
                      description="N commit conflicts, then success")
    registry.register("diag.effect", effect, Effect,
                      description="sleep, then write one fenced effect record")
    registry.register("diag.append", append, Append,
                      description="sleep, ctx.check(), then append one unfenced line to a file")
