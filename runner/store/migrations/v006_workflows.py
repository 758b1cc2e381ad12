"""Workflows: a workflow vertex, members that wait for their dependencies, results.

From format 6 (issue 72) a task may be a workflow's member (``task_wf``), wait for its
dependencies (``pending`` in ``task_state``, queue ``deps``: in no ready bucket) or for its
workflow's commit (``commit`` in ``task_state``, ``task_wfwait``), and have ``depends_on``
edges; a ``workflow`` vertex (``wf_id``, ``wf_open``, ``wf_state``) holds each workflow. No
task written before is a member, so nothing is rewritten. The step raises the format so that
an older latchwork, whose end of a member's attempt would not release its dependants (the
workflow would wait for ever), refuses the graph instead. (A SUCCEEDED attempt's
``attempt_result`` came before this step and needs none: docs/graph.md.)
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.store.api import Graph
from runner.store.migrations.backfill import StepProgress


@dataclass(frozen=True)
class NoMemberBefore:
    """A step whose format adds properties no existing vertex has yet (frozen here: what
    this step does never changes with later code)."""

    version: int

    def run(self, graph: Graph, start: int, page: int, progress: StepProgress,
            dry_run: bool) -> tuple[int, int]:
        progress(0, 0)
        return 0, 0


STEP = NoMemberBefore(version=6)
