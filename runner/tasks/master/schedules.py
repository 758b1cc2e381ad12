"""Recurring schedules: the master creates one task per fire, exactly once across failovers.

A schedule (``latchwork schedule add NAME --cron "*/5 * * * *" | --every 30s --type T``) is a
``schedule`` vertex in the graph. Every round (the reaper's interval) the master computes each
unpaused schedule's fires after the last one it handled, with APScheduler's triggers, up to
:data:`LOOKAHEAD` seconds ahead, and creates a task for each, due at the fire time (the due
index and the nodes' timers start it on time) with the uniqueness key
``schedule:<name>:<fire time>``; then it records the last fire handled (a write guarded by
the schedule's version). A master that dies between the two writes leaves the record behind;
the next master creates the same tasks again, which the uniqueness keys turn into nothing new:
one task per fire, whatever the failovers.

Misfires: fires more than :data:`GRACE` seconds in the past when a master first sees them were
missed (no master existed, or the store was down). ``misfire="run_once"`` (the default)
creates one task for the latest missed fire, due now; ``misfire="skip"`` creates none. Either
way the earlier missed fires are logged and dropped, as Quartz and APScheduler do with
coalescing.

Pausing or removing a schedule (:func:`pause`, :func:`remove`) also stops the fires it made
that have not started: the tasks made ahead within :data:`LOOKAHEAD`, and any still waiting for
a worker, are deactivated with the reason ``schedule <name> paused`` (or ``removed``), which
``task show`` prints. A fire that started first runs to its end. A master whose round made a
fire while the pause was written sees its own record of the round refused (the schedule's
version moved) and stops that fire too. Resuming does not bring the stopped fires back.

Failure behaviour: a bad cron expression or spec is refused when the schedule is added
(:class:`InvalidSchedule`, exit 2 in the CLI); a store error in a round is logged and the round
tried again next time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from runner.errors import CommitConflict, ScheduleNotFound
from runner.replies import ScheduleView
from runner.requests import ScheduleSpec, TaskSubmit
from runner.store import Schedule, Store, Task, TaskStatus, codec

log = logging.getLogger("latchwork.schedules")

#: fires are turned into tasks this many seconds ahead (so they start on time)
LOOKAHEAD = 5.0
#: a fire further in the past than this when first seen was missed
GRACE = 10.0
#: fires walked per schedule and round at most (an interval of a second after a long outage)
MAX_STEPS = 100_000


def trigger_of(spec: ScheduleSpec, created: datetime) -> BaseTrigger:
    if spec.cron is not None:
        return CronTrigger.from_crontab(spec.cron, timezone="UTC")
    assert spec.every is not None
    return IntervalTrigger(seconds=spec.every, start_date=created, timezone="UTC")


def next_after(trigger: BaseTrigger, after: datetime) -> datetime | None:
    """The trigger's first fire strictly after ``after``."""
    fire: datetime | None = trigger.get_next_fire_time(after, after + timedelta(microseconds=1))
    return fire


def fire_key(name: str, fire: datetime) -> str:
    return f"schedule:{name}:{codec.encode_time(fire)}"


def stop_pending_fires(store: Store, name: str, why: str) -> list[str]:
    """Deactivate, with ``why``, the tasks of ``name``'s fires that have not started; their
    ids. Fires are made at most :data:`LOOKAHEAD` ahead, so they wait in the open queue the
    nodes list (no scan of finished tasks)."""
    prefix = f"schedule:{name}:"
    stopped = []
    for task in store.tasks.unfinished():
        if (task.unique_key or "").startswith(prefix) and task.status is TaskStatus.WAITING \
                and store.tasks.stop_unstarted(task.id, why) is not None:
            stopped.append(task.id)
    if stopped:
        log.info("%s: %d fire(s) not started are stopped: %s", why, len(stopped),
                 ", ".join(stopped))
    return stopped


def pause(store: Store, name: str, paused: bool = True) -> Schedule:
    """Pause a schedule and stop its fires that have not started; or resume it (from now
    on: fires missed while paused are not made up). Written again when the master's round
    wrote the schedule first."""
    while True:
        schedule = store.schedules.get(name)
        try:
            updated = store.schedules.update(schedule, paused=paused,
                                             last_fire=None if paused else codec.now())
            break
        except CommitConflict:
            continue
    if paused:
        stop_pending_fires(store, name, f"schedule {name} paused")
    return updated


def remove(store: Store, name: str) -> None:
    """Remove a schedule and stop its fires that have not started."""
    store.schedules.remove(name)
    stop_pending_fires(store, name, f"schedule {name} removed")


def describe(s: Schedule) -> ScheduleView:
    """A schedule as the API shows it: its spec, paused, last and next fire."""
    spec = ScheduleSpec.model_validate(s.spec)
    nxt = None if s.paused else next_after(trigger_of(spec, s.created_at),
                                           s.last_fire or s.created_at)
    return ScheduleView.model_validate({**spec.model_dump(), "name": s.name,
                                        "paused": s.paused, "created_at": s.created_at,
                                        "last_fire": s.last_fire, "next_fire": nxt})


class ScheduleFirer:
    """The master's schedule round (:meth:`tick`); ``submit`` creates a task like the API."""

    def __init__(self, store: Store, submit: Callable[[TaskSubmit], Task]) -> None:
        self.store = store
        self.submit = submit

    def tick(self, now: datetime | None = None) -> int:
        """One round over every schedule; how many tasks it asked for."""
        now = now or codec.now()
        asked = 0
        for schedule in self.store.schedules.all():
            if schedule.paused:
                continue
            try:
                asked += self._fire(schedule, now)
            except CommitConflict:
                log.info("schedule %s changed during the round; next round", schedule.name)
                self._after_conflict(schedule.name)
        return asked

    def _after_conflict(self, name: str) -> None:
        """The round's record was refused: if a pause or a removal came in meanwhile, the
        fires this round made must not run either."""
        try:
            paused = self.store.schedules.get(name).paused
            why = f"schedule {name} paused"
        except ScheduleNotFound:
            paused, why = True, f"schedule {name} removed"
        if paused:
            stop_pending_fires(self.store, name, why)

    def _create(self, schedule: Schedule, spec: ScheduleSpec, fire: datetime,
                run_at: datetime) -> None:
        task = self.submit(TaskSubmit(type=spec.type, payload=dict(spec.payload),
                                      unique_key=fire_key(schedule.name, fire),
                                      priority=spec.priority, run_at=run_at,
                                      ordering_key=spec.ordering_key,
                                      resources=spec.resources))
        log.info("schedule %s: fire %s is task %s", schedule.name, fire.isoformat(), task.id)

    def _fire(self, schedule: Schedule, now: datetime) -> int:
        spec = ScheduleSpec.model_validate(schedule.spec)
        trigger = trigger_of(spec, schedule.created_at)
        fire = next_after(trigger, schedule.last_fire or schedule.created_at)
        missed: list[datetime] = []
        upcoming: list[datetime] = []
        steps = 0
        while fire is not None and fire <= now + timedelta(seconds=LOOKAHEAD) \
                and steps < MAX_STEPS:
            if fire < now - timedelta(seconds=GRACE):
                missed = [missed[0], fire] if missed else [fire]
            else:
                upcoming.append(fire)
            fire = next_after(trigger, fire)
            steps += 1
        asked = 0
        if missed:
            latest = missed[-1]
            if spec.misfire == "run_once":
                self._create(schedule, spec, latest, now)
                asked += 1
            log.warning("schedule %s: fires missed from %s to %s (no master); %s",
                        schedule.name, missed[0].isoformat(), latest.isoformat(),
                        "ran the latest once" if spec.misfire == "run_once" else "skipped")
        for upcoming_fire in upcoming:
            self._create(schedule, spec, upcoming_fire, upcoming_fire)
            asked += 1
        handled = upcoming[-1] if upcoming else (missed[-1] if missed else None)
        if handled is not None:
            self.store.schedules.update(schedule, last_fire=handled)
        return asked
