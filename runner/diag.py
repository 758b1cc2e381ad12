"""Diagnostic task types for operators and tests.

* ``diag.sleep`` ``{"seconds": 2.5}``: sleeps, honouring cancellation;
* ``diag.fail`` ``{"message": "..."}``: raises ``RuntimeError(message)`` (the task stops);
* ``diag.conflict`` ``{"conflicts": N}``: its first N attempts raise a commit conflict, then it
  succeeds (exercises the automatic retry with backoff).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from runner.tasks import TaskCancelled, TaskConflict, TaskContext, TaskRegistry


class Sleep(BaseModel):
    seconds: float = Field(ge=0, le=86400)


class Fail(BaseModel):
    message: str = "diag.fail was asked to fail"


class Conflict(BaseModel):
    conflicts: int = Field(1, ge=0, le=100)


def sleep(ctx: TaskContext, payload: Sleep) -> None:
    if ctx.cancel.wait(payload.seconds):
        raise TaskCancelled(ctx.cancel.reason)


def fail(ctx: TaskContext, payload: Fail) -> None:
    raise RuntimeError(payload.message)


def conflict(ctx: TaskContext, payload: Conflict) -> None:
    if ctx.attempt.seq <= payload.conflicts:
        raise TaskConflict(f"simulated commit conflict {ctx.attempt.seq} of {payload.conflicts}")


def register_diagnostics(registry: TaskRegistry) -> None:
    registry.register("diag.sleep", sleep, Sleep, description="sleep; honours cancellation")
    registry.register("diag.fail", fail, Fail, description="raise RuntimeError")
    registry.register("diag.conflict", conflict, Conflict,
                      description="N commit conflicts, then success")
