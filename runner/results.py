"""A typed reference to a task's result, for the client: :class:`ResultRef` names a task and
the type its handler returns, so :meth:`~runner.client.Client.result` answers that type.

::

    @task("enrich.batch", payload=Batch)
    def enrich(ctx: TaskContext, batch: Batch) -> Enriched: ...

    ref = client.submit_for(enrich, Batch(first=0, last=999))   # ResultRef[Enriched]
    enriched = client.result(ref, wait=60)                       # an Enriched

The type is read from the handler's return annotation (as the node checks it at the attempt's
end: :mod:`runner.tasks.results`), or given (:meth:`ResultRef.of`). Pure; nothing here does
I/O, and it imports nothing of the node or the task runner.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import JsonValue, TypeAdapter

M = TypeVar("M")


@dataclass(frozen=True)
class ResultRef(Generic[M]):
    """Task ``task_id``, whose result reads as ``M`` (``adapter`` None: as stored JSON)."""
    task_id: str
    adapter: TypeAdapter[M] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, task_id: str, kind: type[M]) -> ResultRef[M]:
        """Task ``task_id``, its result read as ``kind`` (a pydantic model, ``list[str]``)."""
        return cls(task_id, TypeAdapter(kind))

    @classmethod
    def returned_by(cls, task_id: str, handler: object) -> ResultRef[Any]:
        """Task ``task_id`` of ``handler``'s type, its result read as the handler's return
        annotation says (as stored JSON when it has none or it cannot be resolved)."""
        try:
            hints = typing.get_type_hints(handler)
        except Exception:  # a name imported for type checkers only: the stored JSON
            return cls(task_id)
        kind = hints.get("return")
        if kind is None or kind is Any or kind is type(None):
            return cls(task_id)
        return cls(task_id, TypeAdapter(kind))

    def read(self, value: JsonValue) -> M:
        """A stored result (JSON) as ``M``; a value that no longer validates (the handler's
        type changed since it was stored) raises pydantic's ValidationError."""
        if self.adapter is None:
            return typing.cast(M, value)
        return self.adapter.validate_python(value)
