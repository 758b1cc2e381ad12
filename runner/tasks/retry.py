"""Retry policies per task type: how many attempts, how long between them, after what.

A task type may carry a :class:`RetryPolicy`. When an attempt fails with an error the policy
retries (``retry_on``: exception classes, ``Exception`` by default) and fewer than
``max_attempts`` attempts were started, the task is not stopped: its owner writes the attempt's
end and the task back to WAITING with ``run_at`` = now + the backoff, in one write, and lets the
lock go. Any node takes it once that time has come; the time is stored, so a retry waiting for
its backoff survives the restart of every node and shows as ``next attempt at ...``. The
backoff is exponential (``backoff * multiplier ** (n - 1)`` after the n-th failure), capped at
``max_backoff`` and reduced by up to ``jitter`` of itself at random, so tasks that failed
together do not come back together. When the attempts are spent the task stops as without a
policy, and ``on_exhausted(task, error)`` is called on the node that ran the last attempt (an
error in it is logged, never raised). Attempts count every attempt started (a commit conflict's
retries, one cancelled by a node's death); commit conflicts are still retried in place first,
whatever the policy.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runner.store import Task


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 3
    backoff: float = 1.0
    multiplier: float = 2.0
    max_backoff: float = 300.0
    jitter: float = 0.5
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    on_exhausted: Callable[[Task, str], None] | None = None

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, not {self.max_attempts}")
        if self.backoff < 0 or self.max_backoff < 0 or self.multiplier < 1:
            raise ValueError("backoff and max_backoff must be >= 0 and multiplier >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter must be within 0..1, not {self.jitter}")
        if not self.retry_on or not all(isinstance(c, type) and issubclass(c, BaseException)
                                        for c in self.retry_on):
            raise ValueError("retry_on must name exception classes")

    def retries(self, error: BaseException | None, attempts: int) -> bool:
        """Whether a failure with ``error`` after ``attempts`` started attempts is retried."""
        return (error is not None and attempts < self.max_attempts
                and isinstance(error, self.retry_on))

    def delay(self, attempts: int, rng: random.Random | None = None) -> float:
        """Seconds before the next attempt after ``attempts`` started ones."""
        base = min(self.max_backoff, self.backoff * self.multiplier ** max(0, attempts - 1))
        return base * (1 - self.jitter * (rng or random).random())

    def describe(self) -> dict[str, object]:
        return {"max_attempts": self.max_attempts, "backoff": self.backoff,
                "multiplier": self.multiplier, "max_backoff": self.max_backoff,
                "jitter": self.jitter, "retry_on": [c.__name__ for c in self.retry_on]}
