"""The worker's one entry point for what its attempts came to
(:meth:`~runner.store.api.Store.write_ends`): each :data:`~runner.store.EndWrite` written as
its kind says, the conclusions together in one write (:func:`.batch.conclude_many`), the
others each alone with the owner's writes they stand for. The graph out of reach raises for the
whole call; any other refusal is that write's answer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from runner.errors import StoreError, StoreUnavailable
from runner.store.api import Graph
from runner.store.ends import (
    AttemptClose,
    Completion,
    Conclusion,
    EndWrite,
    EndWritten,
    FenceOff,
    LastEffect,
    Release,
)
from runner.store.gremlin.writes import write_end
from runner.store.model import Attempt, AttemptStatus, Task


class Owner(Protocol):
    """The owner's writes of the store (:class:`~runner.store.gremlin.store.GraphStore`)."""
    graph: Graph

    def conclude_released(self, conclusions: Sequence[Conclusion]
                          ) -> tuple[list[Task | StoreError], tuple[Task, ...]]: ...

    def release(self, task_id: str, fence_token: int, changes: Mapping[str, object]
                ) -> Task: ...

    def complete(self, attempt: Attempt, task: Task, fence_token: int,
                 effect: LastEffect) -> Task: ...

    def close_attempts(self, task_id: str, status: AttemptStatus, error: str, *,
                       executor: str | None = None,
                       changes: Mapping[str, object] | None = None,
                       refuse_finished: bool = False) -> tuple[Task, list[Attempt]]: ...


def write_ends(store: Owner, writes: Sequence[EndWrite]) -> list[EndWritten | StoreError]:
    """The worker's one way to write its attempts' ends (:class:`~runner.store.api.Store`):
    the conclusions together (:meth:`conclude_many`: one write), then each other write
    alone, in order of the call; each answered with what it left or its refusal."""
    together = [w for w in writes if isinstance(w, Conclusion)]
    answers, released = store.conclude_released(together) if together else ([], ())
    concluded = iter(answers)
    out: list[EndWritten | StoreError] = []
    for w in writes:
        if isinstance(w, Conclusion):
            answer = next(concluded)
            if isinstance(answer, StoreError):
                out.append(answer)
            else:  # what the group's write made claimable, told with the first end it wrote
                out.append(EndWritten(answer, released=released))
                released = ()
            continue
        try:
            out.append(_write_end(store, w))
        except StoreUnavailable:
            raise
        except StoreError as refused:
            out.append(refused)
    return out


def _write_end(store: Owner, w: AttemptClose | Release | Completion | FenceOff) -> EndWritten:
    if isinstance(w, AttemptClose):
        store.graph.write(write_end(w.end))
        return EndWritten(None, (w.end.attempt,))
    if isinstance(w, Release):
        return EndWritten(store.release(w.task_id, w.token, w.changes))
    if isinstance(w, Completion):
        return EndWritten(store.complete(w.attempt, w.task, w.token, w.effect))
    task, closed = store.close_attempts(w.task_id, w.status, w.error, executor=w.executor,
                                       changes=w.changes)
    return EndWritten(task, tuple(closed))
