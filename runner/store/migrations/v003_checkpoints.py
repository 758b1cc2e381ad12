"""Checkpoints a retry resumes from: ``task_ckpt`` and ``task_ckpt_meta`` on a task.

From format 3 a long handler commits its state with ``ctx.checkpoint(state)`` and the task's
next attempt reads it back as ``ctx.resume`` (``runner/store/gremlin/checkpoints.py``): the
state in ``task_ckpt``, what a task row shows of it (when, how many bytes, which attempt) in
``task_ckpt_meta``. No task written before has a checkpoint, so nothing is rewritten: a task
without them has none. The step raises the format so that an older latchwork, which would
ignore a checkpoint (and start a resumable job again at zero) and keep one that
``task reactivate --fresh`` is to drop, refuses the graph instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.store.graph import Graph
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
