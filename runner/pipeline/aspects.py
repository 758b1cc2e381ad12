"""Aspect definitions, their computations (Spark built-in expressions) and their state.

An aspect is a named value on avatars (``aspect.<name>`` in the graph). Its definition says
which ontology classes are eligible (the classes and everything below them in the node's
ontology cache) and whether it is

* **simple** (e.g. ``timeseries``): creating it only marks it READY; values arrive later with
  the avatars' own writes, so no task runs;
* **heavy** (e.g. ``geo``, a GeoJSON point from each avatar's ``lat``/``lon`` properties):
  creating it runs a pipeline task that enriches every eligible avatar.

Deleting an aspect of either kind runs an ``aspect.delete`` task that removes it from every
avatar (a simple aspect's values may be on many avatars too).

The state of each aspect (``/aspects/<name>`` in ZooKeeper, a :class:`VersionedRegister`) goes
ABSENT -> CREATING -> READY -> DELETING -> DELETED (or FAILED), with a generation number that
grows with each creation; the task's uniqueness key contains it, so the same aspect requested
twice, from any number of nodes, yields one task.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from coord import Session, VersionConflict, VersionedRegister
from messaging import summary
from runner.errors import InvalidAspect, UnknownAspect
from runner.store.model import ASPECT_PATTERN

BRICK = "https://brickschema.org/schema/Brick#"


class Kind(enum.StrEnum):
    SIMPLE = "simple"
    HEAVY = "heavy"


class State(enum.StrEnum):
    ABSENT = "ABSENT"
    CREATING = "CREATING"
    READY = "READY"
    DELETING = "DELETING"
    DELETED = "DELETED"
    FAILED = "FAILED"


def geojson_point(df: Any) -> Any:
    """GeoJSON ``Point`` from ``props.lat``/``props.lon``; null where either is missing."""
    from pyspark.sql import functions as F
    lat = F.get_json_object(df["props"], "$.lat").cast("double")
    lon = F.get_json_object(df["props"], "$.lon").cast("double")
    point = F.to_json(F.struct(F.lit("Point").alias("type"),
                               F.array(lon, lat).alias("coordinates")))
    return F.when(lat.isNotNull() & lon.isNotNull(), point)


# name -> function(DataFrame with pos, id, class_iri, props) -> Column of JSON strings or null
COMPUTATIONS: dict[str, Callable[[Any], Any]] = {"geojson-point": geojson_point}


class AspectDefinition(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=ASPECT_PATTERN)
    kind: Kind
    classes: tuple[str, ...] = Field(min_length=1)
    compute: str | None = None  # a key of COMPUTATIONS; heavy aspects only
    description: str = ""

    def model_post_init(self, _: Any) -> None:
        if self.kind is Kind.HEAVY and self.compute not in COMPUTATIONS:
            raise ValueError(f"heavy aspect {self.name!r} needs compute in "
                             f"{sorted(COMPUTATIONS)}, not {self.compute!r}")


def compute(snapshot: Any, definition: AspectDefinition) -> Any:
    """``snapshot`` rows -> (id, value) rows of the aspect, with built-in expressions only."""
    if definition.compute is None:
        raise ValueError(f"aspect {definition.name} is simple: nothing to compute")
    value = COMPUTATIONS[definition.compute](snapshot)
    return snapshot.select(snapshot["id"], value.alias("value")).where("value IS NOT NULL")


BUILTIN = (
    AspectDefinition(name="geo", kind=Kind.HEAVY, compute="geojson-point",
                     classes=(f"{BRICK}Location", f"{BRICK}Equipment"),
                     description="GeoJSON point from the avatar's lat/lon properties"),
    AspectDefinition(name="timeseries", kind=Kind.SIMPLE, classes=(f"{BRICK}Point",),
                     description="time-series reference of a point, written by its producers"),
)


class AspectRegistry:
    """The built-in definitions, overridden or extended by the ``aspects`` configuration."""

    def __init__(self, configured: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self._defs = {d.name: d for d in BUILTIN}
        for name, raw in (configured or {}).items():
            base = self._defs[name].model_dump() if name in self._defs else {}
            try:
                self._defs[name] = AspectDefinition.model_validate(
                    {**base, **dict(raw), "name": name})
            except ValidationError as exc:
                raise InvalidAspect(f"invalid configuration: aspects.{name}: "
                                    f"{summary(exc)}") from exc
            except ValueError as exc:
                raise InvalidAspect(f"invalid configuration: aspects.{name}: {exc}") from exc

    def get(self, name: str) -> AspectDefinition:
        try:
            return self._defs[name]
        except KeyError:
            raise UnknownAspect(f"unknown aspect {name!r} (known: "
                                f"{', '.join(sorted(self._defs))})") from None

    def all(self) -> list[AspectDefinition]:
        return [self._defs[n] for n in sorted(self._defs)]


@dataclass(frozen=True)
class AspectState:
    name: str
    state: State
    generation: int
    task_id: str | None
    updated_at: float
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "state": self.state.value, "generation": self.generation,
                "task_id": self.task_id, "updated_at": self.updated_at, "error": self.error}


class AspectStates:
    """The ``/aspects/<name>`` registers."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def register(self, name: str) -> VersionedRegister:
        return VersionedRegister(self.session, f"/aspects/{name}")

    def get(self, name: str) -> tuple[AspectState, int]:
        value, version = self.register(name).get()
        if value is None:
            return AspectState(name, State.ABSENT, 0, None, 0.0), version
        return AspectState(name, State(value["state"]), value["generation"], value["task_id"],
                           value["updated_at"], value.get("error")), version

    def change(self, name: str,
               decide: Callable[[AspectState], AspectState | None]) -> AspectState:
        """Compare-and-set loop: ``decide`` returns the new state, or None to leave it."""
        while True:
            current, version = self.get(name)
            new = decide(current)
            if new is None:
                return current
            try:
                self.register(name).compare_and_set(version, new.to_json())
                return new
            except VersionConflict:
                continue

    def transition(self, name: str, generation: int, expected: State, to: State,
                   error: str | None = None) -> AspectState:
        """Move from ``expected`` to ``to`` if the aspect is still at ``generation``."""
        def decide(cur: AspectState) -> AspectState | None:
            if cur.generation != generation or cur.state is not expected:
                return None
            return AspectState(name, to, cur.generation, cur.task_id, time.time(), error)
        return self.change(name, decide)
