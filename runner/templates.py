"""What a task is made of, once: :class:`TaskFields` (its type, payload, priority, ordering key
and resources), which a submit (:class:`TaskTemplate`, each item of a bulk submit too) and a
schedule (:class:`ScheduleSpec`, the task each fire creates) share, with what each adds: a
submit its uniqueness, start time and time limit; a schedule its trigger and misfire policy.
The API's requests (:mod:`runner.requests`) and replies (:mod:`runner.replies`) use them. Pure
models; nothing here does I/O.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal, TypeAlias

from apscheduler.triggers.cron import CronTrigger
from pydantic import AwareDatetime, BaseModel, Field, JsonValue, model_validator

from runner.store import codec

#: the documented ranges of a task's numbers (docs/runner.md, "Numbers a submit accepts"): a
#: value outside is refused at submit, before any node holds it in a timer or an index
PRIORITY_MIN, PRIORITY_MAX = -1_000_000, 1_000_000
#: the furthest ahead a task may be put (``delay``, ``run_at``) or a schedule may fire: 10 years
MAX_AHEAD = 10 * 365 * 86400.0
#: the longest time limit of an attempt: a year and a day
MAX_TIME_LIMIT = 366 * 86400.0

Priority = Annotated[int, Field(ge=PRIORITY_MIN, le=PRIORITY_MAX)]

#: a JSON object (a payload, a JSON schema, a stream handler's state); a JSON value is
#: pydantic's ``JsonValue``
JsonObject: TypeAlias = dict[str, JsonValue]


class TaskFields(BaseModel):
    """The fields of a task to create (``priority`` None: its type's default)."""

    type: str = Field(min_length=1)
    payload: JsonObject = Field(default_factory=dict)
    priority: Priority | None = None
    ordering_key: str | None = Field(default=None, min_length=1, max_length=200)
    resources: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list, max_length=32)


class TaskTemplate(TaskFields):
    """One task to create now: a submit's fields, each item of a bulk submit's."""

    model_config = {"extra": "forbid"}
    unique_key: str | None = None
    run_at: AwareDatetime | None = None  # not claimed before this instant
    #: seconds from now (instead of run_at)
    delay: float | None = Field(default=None, ge=0, le=MAX_AHEAD, allow_inf_nan=False)
    #: seconds an attempt may run (its type's ``timeout``, when it has one, caps it)
    timeout: float | None = Field(default=None, gt=0, le=MAX_TIME_LIMIT, allow_inf_nan=False)

    @model_validator(mode="after")
    def _one_time(self) -> TaskTemplate:
        if self.run_at is not None and self.delay is not None:
            raise ValueError("give run_at or delay, not both")
        if self.run_at is not None:
            try:
                at = self.run_at.astimezone(UTC)
            except (OverflowError, ValueError):
                raise ValueError(f"run_at {self.run_at.isoformat()} is out of range") from None
            if at > codec.now() + timedelta(seconds=MAX_AHEAD):
                raise ValueError(f"run_at {self.run_at.isoformat()} is more than 10 years "
                                 "ahead")
        return self

    def when(self) -> datetime | None:
        if self.delay is not None:
            return codec.now() + timedelta(seconds=self.delay)
        return self.run_at


class ScheduleSpec(TaskFields):
    """What a schedule fires: a cron expression (UTC) or an interval in seconds, and the task
    each fire creates."""

    cron: str | None = None
    every: float | None = Field(default=None, gt=0, le=MAX_AHEAD, allow_inf_nan=False)
    misfire: Literal["run_once", "skip"] = "run_once"

    @model_validator(mode="after")
    def _one_trigger(self) -> ScheduleSpec:
        if (self.cron is None) == (self.every is None):
            raise ValueError("give a cron expression or an interval, one of them")
        if self.cron is not None:
            try:
                CronTrigger.from_crontab(self.cron, timezone="UTC")
            except ValueError as exc:
                raise ValueError(f"bad cron expression {self.cron!r}: {exc}") from exc
        return self
