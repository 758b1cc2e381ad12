"""The API's request models (what each command accepts, validated before its handler runs)
and the schedule view."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any

from pydantic import AwareDatetime, BaseModel, Field, model_validator

from runner.store import codec
from runner.store.gremlin.schedules import Schedule
from runner.store.model import ASPECT_PATTERN
from runner.tasks.schedules import ScheduleSpec, next_after, trigger_of


class Submit(BaseModel):
    type: str = Field(min_length=1)
    payload: dict[str, Any] = Field(default_factory=dict)
    priority: int | None = None  # None: the type's default
    unique_key: str | None = None
    run_at: AwareDatetime | None = None  # not claimed before this instant
    delay: float | None = Field(None, ge=0)  # seconds from now (instead of run_at)
    ordering_key: str | None = Field(None, min_length=1, max_length=200)
    resources: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list, max_length=32)

    @model_validator(mode="after")
    def _one_time(self) -> Submit:
        if self.run_at is not None and self.delay is not None:
            raise ValueError("give run_at or delay, not both")
        return self

    def when(self) -> datetime | None:
        if self.delay is not None:
            return codec.now() + timedelta(seconds=self.delay)
        return self.run_at


def schedule_view(s: Schedule) -> dict[str, Any]:
    spec = ScheduleSpec.model_validate(s.spec)
    nxt = None if s.paused else next_after(trigger_of(spec, s.created_at),
                                           s.last_fire or s.created_at)
    return {"name": s.name, **s.spec, "paused": s.paused,
            "created_at": s.created_at.isoformat(),
            "last_fire": s.last_fire.isoformat() if s.last_fire else None,
            "next_fire": nxt.isoformat() if nxt else None}


class TaskId(BaseModel):
    id: str = Field(min_length=1)


class TaskCancel(TaskId):
    reason: str | None = Field(None, max_length=1000)


class AspectRef(BaseModel):
    name: str = Field(pattern=ASPECT_PATTERN)


class AspectCreate(AspectRef):
    batch_rows: int | None = Field(None, ge=1)
    pause: float = Field(0.0, ge=0, le=3600)


class OntologyRef(BaseModel):
    iri: str = Field(min_length=1)


class StreamRef(BaseModel):
    name: str = Field(min_length=1)


class StreamStart(StreamRef):
    redundancy: int = Field(2, ge=1, le=16)


class Recent(BaseModel):
    limit: int = Field(10, ge=1, le=1000)


class ScheduleRef(BaseModel):
    name: str = Field(min_length=1, max_length=200, pattern=r"^[^\s/]+$")


class ScheduleAdd(ScheduleRef):
    spec: ScheduleSpec


class SchedulePause(ScheduleRef):
    paused: bool = True


class TaskQuery(BaseModel):
    unfinished: bool = False
    type: str | None = None
    ordering_key: str | None = None  # the unfinished tasks of this key, in their order
