"""An operator's view of many tasks: filtered, newest first, a page at a time, and counted per
state, at a cost that grows with a page, not with the history (the web console's task list on a
graph of 100,000 tasks; ``bench/bench_web_list.py``).

Every filter is an equality on an indexed property the task writes keep current
(:func:`~runner.store.gremlin.rows.task_props`): ``task_type``, ``task_list`` (the state:
waiting, running, stopped, finished, skipped), ``task_owner``, ``task_okey``, and one key per
resource (``task_res_<hex of the name>``). Newest first without sorting the history: the page
is found by windows of creation time (``task_created``, a fixed-width UTC string, compared as
text: the portable subset's ``P.gt``/``P.lt`` on strings) below the cursor, counted first (a
count is answered by the index) and grown eight times until it holds a page, then narrowed
while it holds far more; only that window's tasks are read, sorted and cut to the page.

Failure behaviour: a graph out of reach raises ``StoreUnavailable`` like every read; a cursor
that does not parse is :class:`~runner.errors.InvalidValue` (refused).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from gremlin_python.process.traversal import P

from runner.errors import InvalidValue
from runner.store import codec
from runner.store.graph import Graph
from runner.store.gremlin.rows import LIST_STATES, resource_key, task_from_row
from runner.store.model import Task

#: a window is read once it holds at least a page; narrowed while it holds more than this
#: many pages (a burst of creations inside one window)
MAX_PAGES_READ = 8
#: the first window below the cursor; then eight times wider each step, up to the oldest task
FIRST_WINDOW = timedelta(seconds=2)
OLDEST = "0000-01-01T00:00:00.000000Z"


@dataclass(frozen=True)
class TaskFilter:
    """What a task list asks for; None: any."""

    type: str | None = None
    state: str | None = None  # one of LIST_STATES
    owner: str | None = None
    ordering_key: str | None = None
    resource: str | None = None

    def __post_init__(self) -> None:
        if self.state is not None and self.state not in LIST_STATES:
            raise InvalidValue(f"unknown task state {self.state!r} (one of "
                               f"{', '.join(LIST_STATES)})")

    def equalities(self) -> list[tuple[str, str]]:
        found = []
        for key, value in (("task_type", self.type), ("task_list", self.state),
                           ("task_owner", self.owner), ("task_okey", self.ordering_key)):
            if value is not None:
                found.append((key, value))
        if self.resource is not None:
            found.append((resource_key(self.resource), "1"))
        return found


@dataclass(frozen=True)
class TaskPage:
    tasks: list[Task]
    #: where the next (older) page starts: pass it as ``before``; None: this was the last
    next: str | None


def cursor_of(task: Task) -> str:
    return f"{codec.encode_time(task.created_at)}|{task.id}"


def _parse(cursor: str | None) -> tuple[str, str]:
    """(created, id) of a cursor; the newest possible for None."""
    if cursor is None:
        return "9999-12-31T23:59:59.999999Z", "\uffff"
    created, sep, task_id = cursor.partition("|")
    try:
        codec.decode_time(created)
    except (ValueError, InvalidValue) as exc:
        raise InvalidValue(f"not a task list cursor: {cursor!r}") from exc
    if not sep or not task_id:
        raise InvalidValue(f"not a task list cursor: {cursor!r}")
    return created, task_id


class TaskSearch:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def _filtered(self, g: Any, where: TaskFilter) -> Any:
        t = g.V().has_label("task")
        for key, value in where.equalities():
            t = t.has(key, value)
        return t

    def _count(self, where: TaskFilter, low: str, high: str) -> int:
        """Tasks matching with ``low <= created <= high`` (the cursor's own instant included:
        ties are cut by id afterwards)."""
        return int(self.graph.read(
            lambda g: self._filtered(g, where).has("task_created", P.gte(low))
            .has("task_created", P.lte(high)).count().next()))

    def page(self, where: TaskFilter, before: str | None = None, limit: int = 50) -> TaskPage:
        """Up to ``limit`` tasks matching ``where``, newest first, created before the cursor
        ``before`` (from a previous page's ``next``)."""
        if limit < 1:
            raise InvalidValue(f"a page holds at least one task, not {limit}")
        top, top_id = _parse(before)
        # the first page starts a day ahead of now (clocks of other hosts may run ahead)
        high = top if before is not None else codec.encode_time(codec.now() + timedelta(days=1))
        width = FIRST_WINDOW
        low = OLDEST
        while True:
            low = self._minus(high, width)
            count = self._count(where, low, high)
            if count > limit or low == OLDEST:
                break
            width *= 8
        # a burst: narrow the window while it holds many pages (halving is safe: the count
        # only drops, and stays at least a page unless a narrower window loses it)
        while count > limit * MAX_PAGES_READ and width > timedelta(microseconds=2):
            narrower = width / 2
            candidate = self._minus(high, narrower)
            fewer = self._count(where, candidate, high)
            if fewer <= limit:
                break
            width, low, count = narrower, candidate, fewer
        rows = self.graph.read(
            lambda g: self._filtered(g, where).has("task_created", P.gte(low))
            .has("task_created", P.lte(high)).element_map().to_list())
        tasks = [task_from_row(r) for r in rows]
        tasks = [t for t in tasks if (codec.encode_time(t.created_at), t.id) < (top, top_id)]
        tasks.sort(key=lambda t: (t.created_at, t.id), reverse=True)
        page = tasks[:limit]
        more = len(tasks) > limit or (low != OLDEST and self._count(
            where, OLDEST, self._minus(low, timedelta(microseconds=1))) > 0)
        return TaskPage(page, cursor_of(page[-1]) if page and more else None)

    @staticmethod
    def _minus(created: str, width: timedelta) -> str:
        try:
            return codec.encode_time(codec.decode_time(created) - width)
        except (OverflowError, ValueError):
            return OLDEST

    def counts(self, where: TaskFilter) -> dict[str, int]:
        """How many tasks match ``where`` in each state (its own ``state`` ignored)."""
        base = TaskFilter(where.type, None, where.owner, where.ordering_key, where.resource)
        return {state: self._count_state(base, state) for state in LIST_STATES}

    def _count_state(self, where: TaskFilter, state: str) -> int:
        return int(self.graph.read(
            lambda g: self._filtered(g, where).has("task_list", state).count().next()))


def filter_of(fields: Mapping[str, str | None]) -> TaskFilter:
    return TaskFilter(**{k: v for k, v in fields.items() if v is not None})
