"""The bench's own task type, loaded by its nodes through the ``tasks`` setting.

``bench.mark`` ``{"sent": <epoch seconds>}`` appends one line ``sent began ended`` to a file of
its node process in the directory ``LATCHWORK_BENCH_MARKS``: ``sent`` is the submitter's clock
just before its request, ``began`` the handler's first line. It is the record the peer's Celery
task keeps (bench/bench_peer.py), so submit -> start is measured alike on both runners: from
before the submit to the start of the body, both clocks of this host.
"""

from __future__ import annotations

import os
import time

from pydantic import BaseModel, ConfigDict

from runner.tasks import TaskContext, task


class Mark(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sent: float


@task("bench.mark", payload=Mark, description="record when it was sent and when it ran")
def mark(ctx: TaskContext, payload: Mark) -> None:
    began = time.time()
    path = os.path.join(os.environ["LATCHWORK_BENCH_MARKS"], str(os.getpid()))
    with open(path, "a") as out:
        out.write(f"{payload.sent} {began} {time.time()}\n")
