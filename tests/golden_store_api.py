"""The part of the golden workload (``tests/golden_store.py``) that follows the store's API as
it changes: how a store is opened fresh and how an owner writes an attempt's end. The workload
itself, and what it must leave in the graph, stay fixed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from runner.store import AttemptStatus, Conclusion, open_store


def open_fresh(where: str, **options: Any) -> Any:
    store = open_store(where, **options)
    if where.startswith("ws://"):
        store.clear()
    return store


def conclude(store: Any, attempt: Any, status: AttemptStatus, task: Any,
             changes: Mapping[str, Any], **end: Any) -> Any:
    return store.conclude(Conclusion.of(attempt, status, task, changes, **end))


def conclude_many(store: Any, ends: Sequence[tuple[Any, AttemptStatus, Any,
                                                   Mapping[str, Any], dict[str, Any]]]) -> Any:
    written = store.conclude_many([Conclusion.of(a, s, t, c, **e) for a, s, t, c, e in ends])
    assert not any(isinstance(w, Exception) for w in written), written
    return written
