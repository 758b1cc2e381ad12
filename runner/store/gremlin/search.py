"""An operator's view of many tasks: filtered, newest first, a page at a time, and counted per
state, at a cost that grows with a page, not with the history (the web console's task list on a
graph of 100,000 tasks: ``bench/bench_web_list.py``).

Every filter is an equality on an indexed property the task writes keep current
(:func:`~runner.store.gremlin.rows.task_props`): ``task_type``, ``task_list`` (the state:
waiting, running, stopped, finished, skipped), ``task_owner``, ``task_okey``, and one key per
resource (``task_res_<hex of the name>``). The portable subset has no ordered range an embedded
graph answers from an index (gremlite compares ``P.gt`` in Python, vertex by vertex), so newest
first is found by equality too: every task carries its creation hour and second (``task_h``,
``task_s``: two properties, each one more write on the hot create path; a day is its 24 hours
and a minute its 60 seconds asked with ``P.within``). A page walks the buckets back from the cursor:
a bucket is counted (up to :data:`READ_AT_MOST` + 1, an index count), skipped when empty, read
whole (creation time and id only) when it holds at most :data:`READ_AT_MOST`, and otherwise
split into its finer buckets; empty stretches of days are skipped 32 days at a time. Only the
page's own tasks are read in full.

Limits, stated: tasks created more than :data:`HORIZON_DAYS` days before the cursor are not
reached; counts per state are exact up to :data:`COUNT_CAP`, and shown as at least that above.

Failure behaviour: a graph out of reach raises ``StoreUnavailable`` like every read; a cursor
that does not parse is :class:`~runner.errors.InvalidValue` (refused).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

from gremlin_python.process.traversal import P

from runner.errors import InvalidValue
from runner.store import codec
from runner.store.api import Graph
from runner.store.gremlin.rows import resource_key, task_from_row
from runner.store.model import LIST_STATES, Task, TaskFilter, TaskPage, filter_values
from runner.store.traversal import Traversal

#: a bucket holding at most this many matching tasks is read whole (their creation time and
#: id); a fuller one is split into its finer buckets
READ_AT_MOST = 200
#: how far back a page looks, in days before its cursor
HORIZON_DAYS = 3650
#: counts per state are exact up to this many
COUNT_CAP = 10_000
#: the buckets' widths in creation time digits: day, hour, minute, second
LEVELS = (8, 10, 12, 14)
#: children of a bucket at each finer level
CHILDREN = {10: 24, 12: 60, 14: 60}


def bucket_match(bucket: str) -> tuple[str, object]:
    """The property and value that find a bucket's tasks: an hour or a second by equality, a
    day as its 24 hours and a minute as its 60 seconds (``P.within``: one index lookup)."""
    if len(bucket) == 8:
        return "task_h", P.within([f"{bucket}{h:02d}" for h in range(24)])
    if len(bucket) == 12:
        return "task_s", P.within([f"{bucket}{sec:02d}" for sec in range(60)])
    return ("task_h" if len(bucket) == 10 else "task_s"), bucket


def time_digits(created: str) -> str:
    """``2026-11-25T01:10:33.123456Z`` -> ``20261125011033123456``."""
    return "".join(ch for ch in created if ch.isdigit())


def equalities(where: TaskFilter) -> list[tuple[str, object]]:
    """The property lookups of a filter (a value, or ``P.within`` several)."""
    found: list[tuple[str, object]] = []
    for key, value in (("task_type", where.type), ("task_list", where.state),
                       ("task_owner", where.owner), ("task_okey", where.ordering_key)):
        values = filter_values(value)
        if len(values) == 1:
            found.append((key, values[0]))
        elif values:
            found.append((key, P.within(list(values))))
    if where.resource is not None:
        found.append((resource_key(where.resource), "1"))
    return found


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


class GremlinTaskSearch:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def _filtered(self, g: Traversal, where: TaskFilter, key: str, value: object) -> Traversal:
        """The tasks with ``key`` = ``value`` and every equality of ``where``: the bucket's
        property first, then the filters (no label step: every key is a task's, and a label
        step first would make gremlite walk every task)."""
        t = g.V().has(key, value)
        for other, wanted in equalities(where):
            t = t.has(other, wanted)
        return t

    def _count(self, where: TaskFilter, key: str, value: object, cap: int) -> int:
        return int(self.graph.read(
            lambda g: self._filtered(g, where, key, value).limit(cap).count().next()))

    def _keys(self, where: TaskFilter, key: str, value: object) -> list[tuple[str, str]]:
        rows = self.graph.read(
            lambda g: self._filtered(g, where, key, value)
            .element_map("task_created", "task_id").to_list())
        return [(str(r["task_created"]), str(r["task_id"])) for r in rows]

    def page(self, where: TaskFilter, before: str | None = None, limit: int = 50) -> TaskPage:
        """Up to ``limit`` tasks matching ``where``, newest first, created before the cursor
        ``before`` (from a previous page's ``next``)."""
        if limit < 1:
            raise InvalidValue(f"a page holds at least one task, not {limit}")
        top = _parse(before)
        if before is None:  # a day ahead of now: other hosts' clocks may run ahead
            top = (codec.encode_time(codec.now() + timedelta(days=1)), "\uffff")
        found: list[tuple[str, str]] = []
        need = limit + 1  # one more tells whether another page follows
        digits = time_digits(top[0])
        for day in self._days(where, codec.decode_time(top[0])):
            self._collect(where, 0, day, digits, top, found, need)
            if len(found) >= need:
                break
        found.sort(reverse=True)
        chosen = [task_id for _, task_id in found[:limit]]
        tasks = self._read(chosen)
        more = len(found) > limit
        return TaskPage(tasks, cursor_of(tasks[-1]) if tasks and more else None)

    def _days(self, where: TaskFilter, top: datetime) -> Iterator[str]:
        """Days with matching tasks, newest first, from the cursor's day back over the
        horizon; 32 days are asked about at once (one index lookup) to skip empty ones."""
        day = top
        for _ in range(HORIZON_DAYS // 32 + 1):
            block = [(day - timedelta(days=k)).strftime("%Y%m%d") for k in range(32)]
            hours = [f"{d}{h:02d}" for d in block for h in range(24)]
            if self._count(where, "task_h", P.within(hours), 1):
                yield from block
            day -= timedelta(days=32)

    def _collect(self, where: TaskFilter, level: int, bucket: str, top_digits: str,
                 top: tuple[str, str], found: list[tuple[str, str]], need: int) -> None:
        key, value = bucket_match(bucket)
        count = self._count(where, key, value, READ_AT_MOST + 1)
        if count == 0:
            return
        if count <= READ_AT_MOST or level == len(LEVELS) - 1:
            found.extend(k for k in self._keys(where, key, value) if k < top)
            return
        width = LEVELS[level + 1]
        children = CHILDREN[width]
        for n in reversed(range(children)):
            child = f"{bucket}{n:02d}"
            if child > top_digits[:width]:
                continue  # newer than the cursor
            self._collect(where, level + 1, child, top_digits, top, found, need)
            if len(found) >= need:
                return

    def _read(self, task_ids: list[str]) -> list[Task]:
        if not task_ids:
            return []
        rows = self.graph.read(lambda g: g.V().has("task_id", P.within(task_ids))
                               .element_map().to_list())
        by_id = {t.id: t for t in (task_from_row(r) for r in rows)}
        return [by_id[i] for i in task_ids if i in by_id]

    def counts(self, where: TaskFilter) -> dict[str, int]:
        """How many tasks match ``where`` in each state (its own ``state`` ignored); exact up
        to :data:`COUNT_CAP`, and that cap above it."""
        base = TaskFilter(where.type, None, where.owner, where.ordering_key, where.resource)
        return {state: self._count(base, "task_list", state, COUNT_CAP)
                for state in LIST_STATES}

