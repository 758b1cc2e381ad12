"""The chaos suite's MASTER command and long-job task types, declared as a user's package
declares them (``@command``, ``@task``) and loaded by the node through the ``tasks`` setting.

Task types (issue 44):

* ``chaos.spawner`` (issue 72): spawns keyed ``diag.effect`` children (``ctx.spawn``), pausing
  between them so that a fault lands half-way; a retry finds the children made;
* ``chaos.steps``: a job of numbered steps that commits ``{"next": n}`` every few steps
  (``ctx.checkpoint``) and resumes from ``ctx.resume``; each step it starts and each checkpoint
  once committed is a line of its record file, from which the suite counts the work done again
  before and after the last committed checkpoint;
* ``chaos.hang``: isolated, ``timeout=1``; its first attempt hangs ignoring its token (a
  ``hang`` fault: the child is killed after the grace, the attempt ends TIMED_OUT, a retry
  finishes it);
* ``chaos.crash``: isolated; its first attempt segfaults (a ``crash`` fault: FAILED "killed by
  signal 11", a retry finishes it).

``chaos.record``: each run of its handler creates a persistent sequential node
``/chaos/runs/<message id>-`` (data: member, start; an ``end`` is added when the run completes),
and its effect, ``/chaos/effects/<message id>``, is created in the same ZooKeeper transaction as
the message's processed record, fenced by the master's leadership (``ctx.transaction()``). The
suite counts completed runs per message (handled twice?) and effects (a confirmed message
lost?). The answer is the member that applied the effect.
"""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from coord import Session
from messaging import fenced_out
from runner.errors import HandlerCrashed
from runner.tasks import CommandContext, RetryPolicy, TaskContext, TaskTimedOut, command, task

COMMAND = "chaos.record"
RUNS = "/chaos/runs"
EFFECTS = "/chaos/effects"


class ChaosRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hold: float = Field(0.05, ge=0, le=10)


@command(COMMAND, payload=ChaosRecord, description="record a run and, once, its effect")
def chaos_record(ctx: CommandContext, payload: ChaosRecord) -> dict[str, Any]:
    client = ctx.services.get(Session).client
    started = {"member": ctx.member_id, "start": time.time()}
    run_node = client.create(f"{RUNS}/{ctx.message_id}-", json.dumps(started).encode(),
                             sequence=True, makepath=True)
    if ctx.cancelled.wait(payload.hold):
        raise RuntimeError("cancelled: leadership lost or shutting down")
    ctx.check()  # still the master it started under, right before the effect
    txn = ctx.transaction()  # fenced by this master's leadership
    txn.create(f"{EFFECTS}/{ctx.message_id}", ctx.member_id.encode())
    results: list[Any] = txn.commit()
    if fenced_out(results):  # its leadership session is gone: a later master runs it
        raise RuntimeError("refused: this node is no longer the master that started it")
    applied = not any(isinstance(r, Exception) for r in results)
    client.set(run_node, json.dumps({**started, "end": time.time(), "effect": applied}).encode())
    return {"applied_by": ctx.member_id if applied else None}


class Steps(BaseModel):
    model_config = ConfigDict(extra="forbid")
    record: str  # a file the steps are appended to (one short line each: atomic appends)
    steps: int = Field(20, ge=1, le=1000)
    every: int = Field(5, ge=1)
    seconds: float = Field(0.05, ge=0, le=10)


def _line(path: str, text: str) -> None:
    with open(path, "a") as f:
        f.write(text + "\n")


@task("chaos.steps", payload=Steps, description="numbered steps, a checkpoint every few")
def chaos_steps(ctx: TaskContext, p: Steps) -> None:
    start = int((ctx.resume or {}).get("next", 0))
    for i in range(start, p.steps):
        if ctx.cancel.wait(p.seconds):
            ctx.cancel.raise_if_cancelled()
        _line(p.record, json.dumps({"task": ctx.task.id, "attempt": ctx.attempt.id,
                                    "step": i}))
        if (i + 1) % p.every == 0:
            ctx.checkpoint({"next": i + 1})
            _line(p.record, json.dumps({"task": ctx.task.id, "attempt": ctx.attempt.id,
                                        "committed": i + 1}))


class Spawner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    children: int = Field(5, ge=1, le=100)
    seconds: float = Field(0.1, ge=0, le=10)


@task("chaos.spawner", payload=Spawner, description="spawns keyed diag.effect children")
def chaos_spawner(ctx: TaskContext, p: Spawner) -> int:
    """Spawns ``children`` ``diag.effect`` children keyed c0, c1, ..., pausing between them so
    that a fault can land half-way: a retry spawns them again and finds those made."""
    for i in range(p.children):
        ctx.spawn("diag.effect", {"seconds": p.seconds}, key=f"c{i}")
        if ctx.cancel.wait(p.seconds):
            ctx.cancel.raise_if_cancelled()
    return p.children


#: retried whatever faults cost them (every attempt started counts against the policy)
_AGAIN = 30


@task("chaos.hang", isolation="process", timeout=1.0, grace=0.5,
      retry=RetryPolicy(max_attempts=_AGAIN, backoff=0.2, retry_on=(TaskTimedOut,)),
      description="its first attempt hangs, ignoring its token")
def chaos_hang(ctx: TaskContext, payload: dict[str, Any]) -> None:
    while ctx.attempt.seq == 1:
        time.sleep(0.2)


@task("chaos.crash", isolation="process",
      retry=RetryPolicy(max_attempts=_AGAIN, backoff=0.2, retry_on=(HandlerCrashed,)),
      description="its first attempt segfaults")
def chaos_crash(ctx: TaskContext, payload: dict[str, Any]) -> None:
    if ctx.attempt.seq == 1:
        import ctypes

        ctypes.string_at(0)
