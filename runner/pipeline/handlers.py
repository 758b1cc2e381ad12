"""Aspect operations (the API side) and the pipeline's task types.

Task types:

* ``aspect.create`` (one per aspect generation, uniqueness key ``aspect:<name>:g<gen>:create``):
  freezes the eligible classes (one read of the ontology cache under its read lock), writes the
  avatar snapshot, creates the batch series, submits ``batch_workers`` helper tasks, works
  batches itself, and marks the aspect READY when the series completes (FAILED with the
  reasons when it fails). Rerun after a crash, every step finds its earlier result: the pages
  of the snapshot and the batches of the series are recorded in ZooKeeper, shared by every
  worker of the series; each task's ``ctx.checkpoint`` records its own last finished batch
  (shown by ``task show``, ``top`` and the web console; the next attempt logs it).
* ``aspect.batches``: a helper; works batches of the series until it completes.
* ``aspect.delete``: removes the aspect from every avatar in chunks, then marks it DELETED.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field

from coord import Session
from coord.batches import BatchCoordinator, SeriesNotFound, SeriesState
from runner.config import Settings
from runner.errors import AspectBusy
from runner.ontology import OntologyCache
from runner.pipeline import extra
from runner.pipeline.aspects import (
    AspectDefinition,
    AspectRegistry,
    AspectState,
    AspectStates,
    Kind,
    State,
)
from runner.pipeline.job import BatchWorker, coordinator_for, progress
from runner.pipeline.snapshot import write_snapshot
from runner.pipeline.spark import spark_session
from runner.pipeline.storage import SeriesPaths
from runner.replies import AspectTask, AspectView, SeriesProgress
from runner.requests import TaskSubmit
from runner.store import Store, Task
from runner.store.model import ASPECT_PATTERN
from runner.tasks import TaskContext, TaskRegistry

log = logging.getLogger("latchwork.pipeline")

DELETE_CHUNK = 1000


def batch_gate() -> Path | None:
    """The gate of a test that must land a kill inside a batch (``LATCHWORK_TEST_BATCH_GATE``,
    set on the nodes a test starts; docs/testing.md): None otherwise."""
    gate = os.environ.get("LATCHWORK_TEST_BATCH_GATE")
    return Path(gate) if gate else None


class AspectPayload(BaseModel):
    aspect: str = Field(pattern=ASPECT_PATTERN)
    generation: int = Field(ge=1)
    batch_rows: int | None = Field(None, ge=1)
    pause: float = Field(0.0, ge=0, le=3600)


class HelperPayload(AspectPayload):
    worker: int = Field(ge=1)


def series_id(aspect: str, generation: int) -> str:
    return f"aspect-{aspect}-g{generation}"


def eligible_classes(definition: AspectDefinition, cache: OntologyCache) -> set[str]:
    """The definition's classes and all below them: one consistent read of the cache."""
    return cache.descendants_or_self(set(definition.classes))


@dataclass
class Pipeline:
    """What the pipeline's handlers and API operations need from the node."""

    settings: Settings
    session: Session
    store: Store
    cache: OntologyCache
    aspects: AspectRegistry
    submit: Callable[[TaskSubmit], Task]  # creates + notifies
    member: str

    @property
    def states(self) -> AspectStates:
        return AspectStates(self.session)

    # -- API operations ---------------------------------------------------------------------

    def create(self, name: str, batch_rows: int | None = None, pause: float = 0.0
               ) -> AspectView:
        """Create an aspect: READY at once (simple) or through one task (heavy).

        The state moves first (CAS to CREATING with a new generation), then the task is
        submitted with the generation in its uniqueness key, then its id is recorded. Racing
        requests all end on the one task; a request that finds CREATING without a task id (its
        submitter died in between) submits it again, which the uniqueness key makes harmless.
        """
        definition = self.aspects.get(name)
        if definition.kind is Kind.HEAVY:
            extra.require(f"aspect create {name}")
        states = self.states
        while True:
            current, _ = states.get(name)
            if current.state is State.CREATING and current.task_id is None:
                payload = AspectPayload(aspect=name, generation=current.generation,
                                        batch_rows=batch_rows, pause=pause)
                self._attach(name, current, "aspect.create", payload, "create")
                return self.describe(name)
            if current.state in (State.CREATING, State.READY):
                return self.describe(name)  # created or being created: the same task
            if current.state is State.DELETING:
                raise AspectBusy(f"aspect {name} is being deleted by task {current.task_id}; "
                                 "create it again once that task finished")
            target = State.READY if definition.kind is Kind.SIMPLE else State.CREATING
            new = AspectState(name, target, current.generation + 1, None, time.time())
            if self._move(name, current, new):
                log.info("member %s: aspect %s generation %d -> %s", self.member, name,
                         new.generation, target.value)
            # loop: attach the task (heavy) or report (simple), on whatever state won

    def delete(self, name: str) -> AspectView:
        """Delete an aspect through a task that removes it from every avatar."""
        self.aspects.get(name)
        extra.require(f"aspect delete {name}")
        states = self.states
        while True:
            current, _ = states.get(name)
            if current.state is State.DELETING and current.task_id is None:
                payload = AspectPayload(aspect=name, generation=current.generation,
                                        batch_rows=None, pause=0.0)
                self._attach(name, current, "aspect.delete", payload, "delete")
                return self.describe(name)
            if current.state in (State.ABSENT, State.DELETED, State.DELETING):
                return self.describe(name)
            if current.state is State.CREATING:
                raise AspectBusy(f"aspect {name} is being created by task {current.task_id}; "
                                 "deactivate that task or wait for it")
            self._move(name, current,
                       AspectState(name, State.DELETING, current.generation, None, time.time()))

    def _move(self, name: str, seen: AspectState, new: AspectState) -> bool:
        """CAS ``seen`` -> ``new``; False if another node changed the aspect first."""
        return self.states.change(name, lambda cur: new if cur == seen else None) == new

    def _attach(self, name: str, current: AspectState, task_type: str,
                payload: AspectPayload, verb: str) -> None:
        task = self.submit(TaskSubmit(type=task_type, payload=payload.model_dump(),
                                      unique_key=f"aspect:{name}:g{current.generation}:{verb}"))

        def decide(cur: AspectState) -> AspectState | None:
            if cur.state is current.state and cur.generation == current.generation \
                    and cur.task_id is None:
                return AspectState(name, cur.state, cur.generation, task.id, time.time())
            return None
        self.states.change(name, decide)

    def describe(self, name: str) -> AspectView:
        definition = self.aspects.get(name)
        state, _ = self.states.get(name)
        task = progress = None
        if state.task_id is not None:
            found = self.store.tasks.get(state.task_id)
            task = AspectTask(id=found.id, type=found.type, status=found.status.value,
                              finished=found.finished, active=found.active)
            if found.type == "aspect.create":
                progress = self.progress_of(found)
        return AspectView(**state.to_json(), kind=definition.kind.value,
                          classes=list(definition.classes), description=definition.description,
                          progress=progress, task=task)

    def progress_of(self, task: Task) -> SeriesProgress | None:
        payload = task.payload
        if task.type not in ("aspect.create", "aspect.batches"):
            return None
        series = series_id(payload["aspect"], payload["generation"])
        try:
            status = BatchCoordinator(self.session, series).status()
        except SeriesNotFound:
            return SeriesProgress(series=series, state="PREPARING", batches_done=0,
                                  rows_done=0, rows_per_s=0.0, retries=0)
        return SeriesProgress.model_validate(progress(status))

    # -- task handlers ----------------------------------------------------------------------

    def _worker(self, ctx: TaskContext, payload: AspectPayload, definition: AspectDefinition,
                sid: str) -> BatchWorker:
        meta = BatchCoordinator(self.session, sid).status().meta
        spark = spark_session(self.settings, app_name=f"latchwork {self.member}")
        return BatchWorker(spark, self.store, coordinator_for(self.session, sid, meta),
                           definition, SeriesPaths(meta["root"]), self.member, ctx.cancel,
                           group=f"latchwork-task-{ctx.task.id}", fence=ctx.fence,
                           check=ctx.check, report=ctx.progress, checkpoint=ctx.checkpoint,
                           batch_rows=int(meta["batch_rows"]), pause=float(meta["pause"]),
                           gate=batch_gate())

    def _current(self, ctx: TaskContext, payload: AspectPayload, state: State) -> bool:
        """Whether the aspect still is in ``state`` at this task's generation."""
        current, _ = self.states.get(payload.aspect)
        if current.state is state and current.generation == payload.generation:
            return True
        log.warning("member %s: task %s: aspect %s is %s at generation %d, not %s at %d: "
                    "nothing to do", self.member, ctx.task.id, payload.aspect,
                    current.state.value, current.generation, state.value, payload.generation)
        return False

    def run_create(self, ctx: TaskContext, payload: AspectPayload) -> None:
        definition = self.aspects.get(payload.aspect)
        if not self._current(ctx, payload, State.CREATING):
            return
        sid = series_id(payload.aspect, payload.generation)
        coordinator = BatchCoordinator(self.session, sid)
        last = ctx.resume
        if isinstance(last, dict) and last.get("series") == sid:
            log.info("member %s: task %s: resumes series %s; its last attempt finished batch "
                     "%s (%s batches of the series done then)", self.member, ctx.task.id, sid,
                     last.get("batch"), last.get("batches_done"))
        if not coordinator.exists():
            classes = eligible_classes(definition, self.cache)
            paths = SeriesPaths.of(self.settings.data_dir, sid)
            # in pages straight to Parquet, resumable by page (progress in ZooKeeper)
            rows = write_snapshot(self.store, classes, paths, self.session, sid,
                                  check=ctx.check, report=ctx.progress)
            digest = hashlib.sha256("\n".join(sorted(classes)).encode()).hexdigest()[:16]
            coordinator.create(end=rows, meta={
                "aspect": payload.aspect, "generation": payload.generation, "root": paths.root,
                "batch_rows": payload.batch_rows or self.settings.batch_rows,
                "timeout": self.settings.batch_timeout, "max_attempts": 3,
                "pause": payload.pause, "classes": len(classes), "classes_sha": digest,
                "task": ctx.task.id})
            log.info("member %s: task %s: series %s over %d avatars of %d eligible classes",
                     self.member, ctx.task.id, sid, rows, len(classes))
        for i in range(1, self.settings.batch_workers + 1):
            self.submit(TaskSubmit(type="aspect.batches", unique_key=f"{sid}:worker:{i}",
                                   payload=HelperPayload(**payload.model_dump(), worker=i)
                                   .model_dump()))
        try:
            self._worker(ctx, payload, definition, sid).run()
        except Exception as exc:
            if BatchCoordinator(self.session, sid).status().state is SeriesState.FAILED:
                self.states.transition(payload.aspect, payload.generation, State.CREATING,
                                       State.FAILED, error=str(exc))
            raise
        self.states.transition(payload.aspect, payload.generation, State.CREATING, State.READY)
        log.info("member %s: task %s: aspect %s is READY", self.member, ctx.task.id,
                 payload.aspect)

    def run_helper(self, ctx: TaskContext, payload: HelperPayload) -> None:
        definition = self.aspects.get(payload.aspect)
        sid = series_id(payload.aspect, payload.generation)
        coordinator = BatchCoordinator(self.session, sid)
        while not coordinator.exists():  # the creating task has not made the series yet
            state, _ = self.states.get(payload.aspect)
            if state.state is not State.CREATING or state.generation != payload.generation:
                return  # that creation is over (or failed before it made a series)
            ctx.cancel.wait(0.5)
            ctx.cancel.raise_if_cancelled()
        self._worker(ctx, payload, definition, sid).run()

    def run_delete(self, ctx: TaskContext, payload: AspectPayload) -> None:
        if not self._current(ctx, payload, State.DELETING):
            return
        removed = 0
        while ids := sorted(self.store.avatars.with_aspect(payload.aspect)):
            for start in range(0, len(ids), DELETE_CHUNK):
                ctx.check()
                removed += self.store.avatars.remove_aspect(
                    payload.aspect, ids[start:start + DELETE_CHUNK], fence=ctx.fence)
        self.states.transition(payload.aspect, payload.generation, State.DELETING,
                               State.DELETED)
        log.info("member %s: task %s: aspect %s removed from %d avatars", self.member,
                 ctx.task.id, payload.aspect, removed)


def _pipeline(ctx: TaskContext) -> Pipeline:
    pipeline = ctx.services.find(Pipeline)
    if pipeline is None:
        raise RuntimeError("this node runs no pipeline (no Pipeline service)")
    return pipeline


#: the pipeline's task types
PIPELINE_TYPES = ("aspect.create", "aspect.batches", "aspect.delete")


def register_pipeline_tasks(registry: TaskRegistry) -> None:
    """The pipeline's task types; without the ``pipeline`` extra, known but refused at submit
    in one line naming it."""
    if (why := extra.needs("the aspect pipeline")) is not None:
        for name in PIPELINE_TYPES:
            registry.unavailable(name, f"task type {name!r}: {why}")
        return
    registry.register("aspect.create", lambda ctx, p: _pipeline(ctx).run_create(ctx, p),
                      AspectPayload, description="enrich every eligible avatar with an aspect")
    registry.register("aspect.batches", lambda ctx, p: _pipeline(ctx).run_helper(ctx, p),
                      HelperPayload, description="work the batches of an aspect's series")
    registry.register("aspect.delete", lambda ctx, p: _pipeline(ctx).run_delete(ctx, p),
                      AspectPayload, description="remove an aspect from every avatar")
