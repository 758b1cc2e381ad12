"""Recurring schedules as ``schedule`` vertices: what to create and when (``schedule_spec``),
whether paused and up to which fire it was handled (``schedule_state``, guarded by
``schedule_version``). A missing schedule raises
:class:`~runner.errors.ScheduleNotFound`, a second one of a name
:class:`~runner.errors.ScheduleExists`; a state write someone else made first,
:class:`~runner.errors.CommitConflict`."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from runner.errors import CommitConflict, ScheduleExists, ScheduleNotFound
from runner.store import codec
from runner.store.api import Graph
from runner.store.gremlin.steps import get_or_add, set_props
from runner.store.gremlin.writes import matched_write
from runner.store.model import Schedule
from runner.store.traversal import Props, PropValue, Row, Traversal


def _from_row(row: Row) -> Schedule:
    state = codec.decode_json(row["schedule_state"])
    return Schedule(name=row["schedule_name"], spec=codec.decode_json(row["schedule_spec"]),
                    created_at=codec.decode_time(row["schedule_created"]),
                    paused=bool(state["paused"]),
                    last_fire=codec.decode_time(state["last"]) if state["last"] else None,
                    version=int(row["schedule_version"]))


def _state(paused: bool, last_fire: datetime | None) -> str:
    return codec.encode_json({"paused": paused,
                              "last": codec.encode_time(last_fire) if last_fire else ""})


class GremlinScheduleStore:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def add(self, name: str, spec: Mapping[str, object]) -> Schedule:
        created, spec_json = codec.encode_time(codec.now()), codec.encode_json(dict(spec))
        props: dict[str, PropValue] = {
            "schedule_name": name, "schedule_spec": spec_json, "schedule_created": created,
            "schedule_state": _state(False, None), "schedule_version": 0}
        # one traversal: the schedule of this name, or a new one (told apart by the time)
        row = self.graph.write(lambda g: get_or_add(g, "schedule_name", name, "schedule", props)
                               .element_map().next())
        schedule = _from_row(row)
        if schedule.created_at != codec.decode_time(created) or \
                schedule.spec != codec.decode_json(spec_json):
            raise ScheduleExists(f"a schedule named {name!r} exists already")
        return schedule

    def get(self, name: str) -> Schedule:
        rows = self.graph.read(
            lambda g: g.V().has("schedule_name", name).element_map().to_list())
        if not rows:
            raise ScheduleNotFound(f"no schedule {name!r}")
        return _from_row(rows[0])

    def all(self) -> list[Schedule]:
        rows = self.graph.read(lambda g: g.V().has_label("schedule").element_map().to_list())
        return sorted((_from_row(r) for r in rows), key=lambda s: s.name)

    def remove(self, name: str) -> None:
        self.get(name)
        self.graph.write(lambda g: g.V().has("schedule_name", name).drop().iterate())

    def update(self, schedule: Schedule, *, paused: bool | None = None,
               last_fire: datetime | None = None) -> Schedule:
        """Write a new state, guarded by the version ``schedule`` was read at."""
        new_paused = schedule.paused if paused is None else paused
        new_last = schedule.last_fire if last_fire is None else last_fire
        props: Props = {"schedule_state": _state(new_paused, new_last),
                 "schedule_version": schedule.version + 1}

        def guarded(g: Traversal) -> Traversal:
            return set_props(g.V().has("schedule_name", schedule.name)
                             .has("schedule_version", schedule.version), props)

        if not matched_write(self.graph, guarded):
            raise CommitConflict(f"schedule {schedule.name}", schedule.version, None)
        return Schedule(schedule.name, schedule.spec, schedule.created_at, new_paused,
                        new_last, schedule.version + 1)
