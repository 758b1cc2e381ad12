"""LoopSettings: how a node's task loop runs (the node fills it from its settings)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LoopSettings:
    """How a node's task loop runs (the node fills it from its :class:`~runner.config.Settings`).

    ``fresh_for`` / ``own_fresh_for`` / ``relist_share``: the backlog's freshness rules
    (:class:`~runner.tasks.worker.backlog.Backlog`); ``others_grace``: how long a due task waits
    for its preferred member; ``limits``: cluster-wide limits per task group
    (:func:`~runner.tasks.worker.claim.levels`); ``store_retry_for``: how long the end of an
    attempt is tried again while the graph is unreachable; ``prefetch`` / ``short_handler``:
    claiming ahead while handlers are short (:class:`~runner.tasks.worker.running.RunningSet`).
    """

    workers: int = 4
    scan_interval: float = 5.0
    max_conflict_retries: int = 10
    conflict_backoff: tuple[float, float] = (0.1, 5.0)
    fresh_for: float = 0.05
    own_fresh_for: float = 1.0
    relist_share: float = 0.5
    #: others' tasks a listing leaves to their preferred members for this long
    steal_after: float = 1.0
    others_grace: float = 0.3
    limits: Mapping[str, int] = field(default_factory=dict)
    store_retry_for: float = 60.0
    #: claimed ahead while handlers are short, in workers (:class:`RunningSet`); 0: never
    prefetch: float = 8.0
    #: a handler shorter than this (a moving mean, seconds) lets the node claim ahead
    short_handler: float = 0.05
