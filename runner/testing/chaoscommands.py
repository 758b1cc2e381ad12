"""The chaos suite's MASTER command, declared as a user's package declares one (``@command``)
and loaded by the node through the ``tasks`` setting.

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
from runner.tasks import CommandContext, command

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
