"""Retention: the master archives finished tasks older than ``retention_days`` to Parquet in
``data_dir/archive`` and removes them from the graph, or only removes them, in small batches.

The default keeps everything. With a policy, every ``retention_interval`` seconds the master
takes at most ``retention_batch`` finished tasks, walking the days they finished on from a
cursor in ZooKeeper (``retention/day``, a :class:`~coord.VersionedRegister` started once from the
days present and moved by compare-and-set): a task, its
attempts and incidents become one row of ``archive/tasks-<day>-<first task id>.parquet``
(``mode=archive``), then leave the graph in one write that also leaves a small tombstone, so
``task show`` of an archived task says where it went. A batch is a deterministic choice (the
day's oldest ids), and its file name follows from it: a master killed between the file and the
graph write leaves a file the next master writes again, identically; a master killed after it
leaves nothing to redo. Days past the cursor are never read again: the scan and listings do
not grow with history, and the graph shrinks to a tombstone per task. A workflow goes as a
unit: its members only together, once every one finished before the cutoff (the day its last
member finished on removes all of them, and its vertex).

Failure behaviour: a file that cannot be written stops the round before anything is removed
(logged; tried again next round); store and ZooKeeper errors likewise.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timedelta
from pathlib import Path

from coord import Session, VersionConflict, VersionedRegister
from runner.store import Attempt, Store, Task, codec

log = logging.getLogger("latchwork.retention")
CURSOR = "retention/day"


class Retention:
    def __init__(self, session: Session, store: Store, member_id: str, days: float,
                 mode: str, data_dir: str, batch: int = 50, interval: float = 60.0) -> None:
        self.session = session
        self.store = store
        self.member_id = member_id
        self.days = days
        self.mode = mode
        self.archive = Path(data_dir) / "archive"
        self.batch = batch
        self.interval = interval
        self._next = 0.0
        self._register = VersionedRegister(session, CURSOR)
        self._version = -1

    def tick(self, now: datetime | None = None, force: bool = False) -> int:
        """One round (at most one per ``interval`` unless ``force``); tasks removed."""
        if not force and time.monotonic() < self._next:
            return 0
        self._next = time.monotonic() + self.interval
        now = now or codec.now()
        cutoff = now - timedelta(days=self.days)
        last_day = cutoff.strftime("%Y-%m-%d")
        day = self._cursor()
        while day is not None and day <= last_day:
            tasks = self._units([t for t in self.store.retention.finished_on(day)
                                 if t.updated_at < cutoff], cutoff)
            if tasks:
                self._remove(day, tasks)
                return len(tasks)
            if day == last_day:
                return 0  # the rest of the cutoff's day is not old enough yet
            day = self._advance(day)
        return 0

    def _units(self, tasks: list[Task], cutoff: datetime) -> list[Task]:
        """A batch of ``tasks`` (at most ``batch``), a workflow's members as a unit: a member
        goes only with every member of its workflow (whatever day each finished on), and only
        once all of them finished before ``cutoff``: a pending join may still need the results
        of the others, and a stopped member may be reactivated (its workflow is kept whole
        until it ends). A unit may be larger than ``batch``: it goes in one round."""
        batch: list[Task] = []
        seen: set[str] = set()
        for task in tasks:
            if len(batch) >= self.batch:
                break
            if task.workflow is None:
                batch.append(task)
                continue
            if task.workflow in seen:
                continue
            seen.add(task.workflow)
            members = self.store.workflows.members(task.workflow)
            if all(m.finished and m.updated_at < cutoff for m in members):
                batch.extend(members)
        return batch

    def _cursor(self) -> str | None:
        """The first day not yet walked past; started at the oldest day present."""
        value, version = self._register.get()
        if version == -1:
            days = self.store.retention.end_days()
            if not days:
                return None
            try:
                version = self._register.compare_and_set(-1, days[0])
                value = days[0]
            except VersionConflict:  # another master started it meanwhile
                value, version = self._register.get()
        self._version = version
        return str(value)

    def _advance(self, day: str) -> str:
        """Move the cursor past ``day``, unless another master moved it first (its value is
        then read again and the round goes on from there)."""
        following = (datetime.strptime(day, "%Y-%m-%d") + timedelta(days=1)).strftime(
            "%Y-%m-%d")
        try:
            self._version = self._register.compare_and_set(self._version, following)
            return following
        except VersionConflict:
            return self._cursor() or following

    def _remove(self, day: str, tasks: list[Task]) -> None:
        where = ""
        if self.mode == "archive":
            where = str(self._write(day, tasks))
        self.store.retention.remove(tasks, where)
        log.info("member %s (master): %d tasks finished on %s %s", self.member_id,
                 len(tasks), day, f"archived to {where}" if where else "removed")

    def _write(self, day: str, tasks: list[Task]) -> Path:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.archive.mkdir(parents=True, exist_ok=True)
        path = self.archive / f"tasks-{day}-{tasks[0].id}.parquet"
        rows: dict[str, list[str]] = {"id": [], "type": [], "task": [], "attempts": [],
                                      "incidents": []}
        for task in tasks:
            attempts = self.store.attempts.for_task(task.id)
            rows["id"].append(task.id)
            rows["type"].append(task.type)
            rows["task"].append(json.dumps(_task_doc(task)))
            rows["attempts"].append(json.dumps([_attempt_doc(a) for a in attempts]))
            rows["incidents"].append(json.dumps(
                [i.view() for i in self.store.incidents.for_task(task.id)]))
        partial = path.with_suffix(".parquet.partial")
        pq.write_table(pa.table(rows), partial)
        partial.replace(path)  # a reader never sees half a file
        return path


def _task_doc(task: Task) -> dict[str, object]:
    return {"id": task.id, "type": task.type, "payload": task.payload,
            "priority": task.priority, "created_at": task.created_at.isoformat(),
            "finished_at": task.updated_at.isoformat(), "attempts": task.attempts,
            "unique_key": task.unique_key, "ordering_key": task.ordering_key,
            "resources": list(task.resources), "skipped": task.skipped}


def _attempt_doc(a: Attempt) -> dict[str, object]:
    return {"id": a.id, "seq": a.seq, "status": a.status.value, "executor": a.executor,
            "started_at": a.started_at.isoformat(),
            "ended_at": a.ended_at.isoformat() if a.ended_at else None,
            "error": a.error, "stack_trace": a.stack_trace}
