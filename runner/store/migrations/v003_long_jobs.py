"""Long jobs: checkpoints, TIMED_OUT attempts and heartbeat details.

From format 3 (issue 44) a task may carry its last checkpoint (``task_ckpt``, the state a
handler committed with ``ctx.checkpoint``; ``task_ckpt_meta``, what a task row shows of it:
when, how many bytes, which attempt), an attempt may end ``TIMED_OUT`` (past its type's
``timeout`` or ``heartbeat_timeout``), and a running attempt may carry the last details it beat
(``attempt_beat``). No task or attempt written before has any of them, so nothing is
rewritten. The step raises the format so that an older latchwork, which cannot read a
TIMED_OUT attempt and would ignore a checkpoint (and start a resumable job again at zero),
refuses the graph instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.store.api import Graph
from runner.store.migrations.backfill import StepProgress


@dataclass(frozen=True)
class NothingToRewrite:
    """A step whose format adds properties no existing vertex has yet."""

    version: int

    def run(self, graph: Graph, start: int, page: int, progress: StepProgress,
            dry_run: bool) -> tuple[int, int]:
        progress(0, 0)
        return 0, 0


STEP = NothingToRewrite(version=3)
