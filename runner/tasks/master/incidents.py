"""Incidents: the master notices tasks in trouble, records them once, and tells hooks.

Every round the master raises an incident for

* ``running_too_long``: an attempt RUNNING longer than its type's ``max_duration``;
* ``waiting_too_long``: a task WAITING longer than its type's ``max_wait`` since it was due
  (created, or its ``run_at``);
* ``stopped``: a task stopped by an error (inactive, unfinished, its last attempt FAILED or
  TIMED_OUT).

A node raises one more itself: ``ignored_timeout``, a handler still running past its time
limit and its grace (:mod:`runner.tasks.worker.limits`); the node resolves it when the
handler returns, the master once the task finished or a later attempt started (the lock the
handler kept is gone: it returned, or its node died).

An incident is a graph record keyed by (task, kind, occurrence: the attempt or the attempt
count), so a master that raises it again after a failover finds the same record: **no incident
is raised twice**. It resolves itself when its condition ends (the task finished, the attempt
ended, the stopped task was reactivated or skipped). Hooks hear both events: the Python
callables of the ``incident_hooks`` setting (``module:function``, called with the event) and
the ``incident_webhook`` URL (a JSON POST through httpx, tried three times with backoff in a
round, and again next round until it answers 2xx). Delivery is recorded per event; a master
that dies between a delivery and its record delivers again: hooks hear every event at least
once, each with the incident's key to recognise a repeat. ``cluster status`` and ``latchwork
top`` show the open incidents.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import httpx

from runner.errors import HookLoadError, TaskError, TaskNotFound
from runner.store import AttemptStatus, Incident, Store, TaskStatus, codec
from runner.tasks.master.layout import left_to_layout
from runner.tasks.outcomes import IGNORED_TIMEOUT
from runner.tasks.registry import TaskRegistry

log = logging.getLogger("latchwork.incidents")

Hook = Callable[[dict[str, Any]], object]
RUNNING = "running_too_long"
WAITING = "waiting_too_long"
STOPPED = "stopped"


def load_hooks(names: Sequence[str]) -> list[Hook]:
    hooks = []
    for name in names:
        module, _, attr = name.partition(":")
        try:
            hook = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError, ValueError) as exc:
            raise HookLoadError(f"incident hook {name!r}: {exc}") from exc
        if not callable(hook):
            raise HookLoadError(f"incident hook {name!r} is not callable")
        hooks.append(hook)
    return hooks


class IncidentWatch:
    """The master's incident round (:meth:`tick`)."""

    def __init__(self, store: Store, registry: TaskRegistry, member_id: str,
                 hooks: Sequence[Hook] = (), webhook: str | None = None,
                 webhook_timeout: float = 5.0) -> None:
        self.store = store
        self.registry = registry
        self.member_id = member_id
        self.hooks = list(hooks)
        self.webhook = webhook
        self.webhook_timeout = webhook_timeout
        #: stopped tasks (id, attempts) this master has seen raised: not read again
        self._raised_stopped: set[tuple[str, int]] = set()

    def tick(self, now: datetime | None = None) -> None:
        now = now or codec.now()
        self.detect(now)
        self.resolve()
        self.deliver()

    # -- raising ------------------------------------------------------------------------------
    def _limit(self, task_type: str, what: str) -> float | None:
        try:
            value: float | None = getattr(self.registry.get(task_type), what)
        except TaskError:
            return None  # a type this master does not know: its own nodes' business
        return value

    def _raise(self, task_id: str, kind: str, occurrence: str, detail: str) -> None:
        incident, created = self.store.incidents.raise_(task_id, kind, occurrence, detail)
        if created:
            log.warning("member %s (master): incident %s: task %s %s", self.member_id,
                        incident.key, task_id, detail)

    def detect(self, now: datetime) -> None:
        """Only what some type asks for is read: running attempts if a type has a
        ``max_duration``, the open queue if one has a ``max_wait``; stopped tasks always (an
        index of them), each once per master."""
        kinds = self.registry.all()
        durations = [k.max_duration for k in kinds if k.max_duration is not None]
        if durations:
            self._running_too_long(now, min(durations))
        if any(k.max_wait is not None for k in kinds):
            self._waiting_too_long(now)
        for task in self.store.tasks.stopped():
            if (task.id, task.attempts) in self._raised_stopped:
                continue
            attempts = self.store.attempts.for_task(task.id)
            if attempts and attempts[-1].status in (AttemptStatus.FAILED,
                                                    AttemptStatus.TIMED_OUT):
                what = "failed" if attempts[-1].status is AttemptStatus.FAILED else "timed out"
                self._raise(task.id, STOPPED, str(task.attempts),
                            f"({task.type}) stopped after attempt {attempts[-1].seq} {what}: "
                            f"{attempts[-1].error}")
            self._raised_stopped.add((task.id, task.attempts))

    def _running_too_long(self, now: datetime, shortest: float) -> None:
        for attempt in self.store.attempts.running():
            if (now - attempt.started_at).total_seconds() <= shortest:
                continue  # within every type's limit: no need to read its task
            task = self.store.tasks.get(attempt.task_id)
            limit = self._limit(task.type, "max_duration")
            ran = (now - attempt.started_at).total_seconds()
            if limit is not None and ran > limit:
                self._raise(task.id, RUNNING, attempt.id,
                            f"({task.type}) has run {ran:.0f} s on {attempt.executor}, "
                            f"over its max_duration of {limit:g} s")

    def _waiting_too_long(self, now: datetime) -> None:
        for task in self.store.tasks.unfinished():
            limit = self._limit(task.type, "max_wait")
            due = max(task.created_at, task.run_at or task.created_at)
            waited = (now - due).total_seconds()
            if limit is not None and task.status is TaskStatus.WAITING and waited > limit:
                self._raise(task.id, WAITING, str(task.attempts),
                            f"({task.type}) has waited {waited:.0f} s since it was due, over "
                            f"its max_wait of {limit:g} s")

    # -- resolving ----------------------------------------------------------------------------
    def _over(self, incident: Incident) -> bool:
        if left_to_layout(incident):  # a member's, not a task's: LayoutWatch resolves it
            return False
        try:
            task = self.store.tasks.get(incident.task_id)
        except TaskNotFound:
            return True
        if task.finished:
            return True
        if incident.kind == RUNNING:
            attempt_id = incident.key.rsplit(":", 1)[1]
            return self.store.attempts.get(attempt_id).status is not AttemptStatus.RUNNING
        if incident.kind == WAITING:
            return task.status is not TaskStatus.WAITING or not task.active
        if incident.kind == IGNORED_TIMEOUT:  # its node resolves it when the handler returns;
            # a later attempt means the lock it kept went (returned, or its node died)
            seq = self.store.attempts.get(incident.key.rsplit(":", 1)[1]).seq
            return task.attempts > seq
        return task.active  # STOPPED: reactivated

    def resolve(self) -> None:
        for incident in self.store.incidents.open():
            if self._over(incident) and self.store.incidents.resolve(incident):
                log.info("member %s (master): incident %s resolved", self.member_id,
                         incident.key)

    # -- telling the hooks --------------------------------------------------------------------
    def deliver(self) -> None:
        if not self.hooks and not self.webhook:
            return
        for incident in self.store.incidents.undelivered():
            for event in ("raised", "resolved"):
                if event in incident.delivered or (event == "resolved" and incident.open):
                    continue
                body = {"event": event, **incident.view()}
                if not self._tell(body):
                    break  # in order: the resolution waits for the raise
                self.store.incidents.delivered(incident, event)
                incident = dataclasses.replace(incident,
                                               delivered=incident.delivered | {event})

    def _tell(self, body: dict[str, Any]) -> bool:
        for hook in self.hooks:
            try:
                hook(body)
            except Exception:
                log.exception("incident hook %r failed for %s", hook, body["key"])
        if self.webhook is None:
            return True
        for attempt in range(3):
            try:
                reply = httpx.post(self.webhook, json=body, timeout=self.webhook_timeout)
                if 200 <= reply.status_code < 300:
                    return True
                problem = f"HTTP {reply.status_code}"
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            log.warning("incident webhook: %s %s not delivered (try %d): %s", body["event"],
                        body["key"], attempt + 1, problem)
            time.sleep(0.5 * 2 ** attempt)
        return False
