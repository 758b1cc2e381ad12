"""One observer seam for what the runner does (dramatiq's middleware is the model).

The node builds its observers once (its metrics, then any given to ``Node(observers=...)``) and
hands the same list to everything that reports: the task loop tells each when an attempt starts
and ends and how long each scan took, the master's duties each lock they free of a member that
is gone, the declared commands and broadcasts each run of their handlers (``after_command``),
and the message bus, through one adapter (:func:`delivery_hook`), what became of each message
(``on_delivery``). Metrics (:class:`runner.node.metrics.NodeMetrics`) and the attempt log
(:class:`AttemptLogger`, always first) implement it; so can a user's tracing or audit. Every hook
is a no-op here: implement the ones you need. The task loop also tells them of workflow members
an end of its made claimable (``on_released``: the node's own observer broadcasts a scan).

Order: ``before_attempt`` runs in the order the observers were given, ``after_attempt``
unwinds in reverse, and only for the observers whose ``before_attempt`` ran (a raising
``before_attempt`` fails the attempt with its error, like a handler's). An ``after_attempt``,
``after_scan`` or ``on_delivery`` that raises is logged and the others still run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from runner import logs
from runner.store import AttemptStatus, Task
from runner.tasks.context import TaskContext

if TYPE_CHECKING:
    from messaging import Delivery, DeliveryOutcome, Envelope

log = logging.getLogger("latchwork.tasks")


class Observer:
    """What the runner tells observers; every hook does nothing unless overridden."""

    def before_attempt(self, ctx: TaskContext) -> None:
        """An attempt is about to run its handler (the attempt is written RUNNING)."""

    def after_attempt(self, ctx: TaskContext, status: AttemptStatus, error: str | None) -> None:
        """The attempt ended with ``status``: called once its end is written (the status and
        error written: a handler's success that its node could no longer record is told as
        CANCELLED_BY_SYSTEM), so nothing reports an end the store does not have."""

    def after_scan(self, seconds: float) -> None:
        """One pass of the task loop took ``seconds``."""

    def on_delivery(self, delivery: Delivery, envelope: Envelope | None,
                    outcome: DeliveryOutcome, detail: str) -> None:
        """A message was settled (handled, duplicate, retried, dead-lettered, requeued)."""

    def on_lock_freed(self, task_id: str, owner: str) -> None:
        """The master freed the lock of ``task_id`` held by ``owner``, a member that is gone
        (its attempts closed CANCELLED_BY_SYSTEM)."""

    def after_command(self, name: str, seconds: float, result: str) -> None:
        """A declared command's or broadcast's handler ran for ``seconds``: ``result`` is
        ``ok``, ``failed`` or ``cancelled`` (what became of its message is ``on_delivery``)."""

    def on_released(self, tasks: Sequence[Task], behind: datetime) -> None:
        """An end this node wrote made workflow members claimable (their last dependency
        succeeded), ready from ``behind``: the node tells every node to scan."""


class Hooks(Observer):
    """An observer made of plain functions (any of them may be left out)."""

    def __init__(self, before: Callable[[TaskContext], object] | None = None,
                 after: Callable[[TaskContext, AttemptStatus, str | None], object] | None = None,
                 scan: Callable[[float], object] | None = None) -> None:
        self._before, self._after, self._scan = before, after, scan

    def before_attempt(self, ctx: TaskContext) -> None:
        if self._before is not None:
            self._before(ctx)

    def after_attempt(self, ctx: TaskContext, status: AttemptStatus, error: str | None) -> None:
        if self._after is not None:
            self._after(ctx, status, error)

    def after_scan(self, seconds: float) -> None:
        if self._scan is not None:
            self._scan(seconds)


class AttemptLogger(Observer):
    """The attempt's start and end as log records, with their stable event names
    (``attempt.started``, ``attempt.ended``: :data:`runner.logs.EVENTS`)."""

    def before_attempt(self, ctx: TaskContext) -> None:
        log.info("member %s: task %s (%s) attempt %d started", ctx.member_id, ctx.task.id,
                 ctx.task.type, ctx.attempt.seq,
                 extra=logs.event("attempt.started", type=ctx.task.type))

    def after_attempt(self, ctx: TaskContext, status: AttemptStatus, error: str | None) -> None:
        level = logging.INFO if status is AttemptStatus.SUCCEEDED else logging.WARNING
        # the status is the one written; when the handler was stopped for a reason of this
        # node's (a lost lock, a lost session), that reason is said too
        why = ctx.cancel.reason if ctx.cancel.cancelled else ""
        also = f" (its handler was stopped: {why})" if why and why not in (error or "") else ""
        log.log(level, "member %s: task %s (%s) attempt %d %s%s%s", ctx.member_id, ctx.task.id,
                ctx.task.type, ctx.attempt.seq, status.value, f": {error}" if error else "",
                also, extra=logs.event("attempt.ended", type=ctx.task.type,
                                       status=status.value))


def notify_scan(observers: Sequence[Observer], seconds: float) -> None:
    """Tell each observer a scan took ``seconds``; one that raises is logged."""
    for observer in observers:
        try:
            observer.after_scan(seconds)
        except Exception:
            log.exception("observer %r failed on a scan", observer)


def notify_command(observers: Sequence[Observer], name: str, seconds: float,
                   result: str) -> None:
    """Tell each observer a command's handler ran; one that raises is logged."""
    for observer in observers:
        try:
            observer.after_command(name, seconds, result)
        except Exception:
            log.exception("observer %r failed after command %s", observer, name)


def delivery_hook(observers: Sequence[Observer]) -> Callable[..., None]:
    """The one adapter from the observers to the message bus: an ``on_outcome`` hook that
    tells each observer what became of a message; one that raises is logged."""
    def hook(delivery: Delivery, envelope: Envelope | None, outcome: DeliveryOutcome,
             detail: str) -> None:
        for observer in observers:
            try:
                observer.on_delivery(delivery, envelope, outcome, detail)
            except Exception:
                log.exception("observer %r failed on a delivery", observer)
    return hook


def notify_released(observers: Sequence[Observer], tasks: Sequence[Task],
                    behind: datetime) -> None:
    """Tell each observer an end released workflow members; one that raises is logged."""
    for observer in observers:
        try:
            observer.on_released(tasks, behind)
        except Exception:
            log.exception("observer %r failed on %d released members", observer, len(tasks))


def notify_freed(observers: Sequence[Observer], task_id: str, owner: str) -> None:
    """Tell each observer the master freed a lock; one that raises is logged."""
    for observer in observers:
        try:
            observer.on_lock_freed(task_id, owner)
        except Exception:
            log.exception("observer %r failed on a freed lock", observer)
