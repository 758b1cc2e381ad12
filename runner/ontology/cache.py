"""The node's ontology cache: the loaded classes, reloaded on MODEL UPDATE_CACHE under a
write lock (readers hold the read lock, so a reload never shows a half-loaded cache). A store
that cannot be read during a reload leaves the previous cache in place and raises.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from runner.store import Store

if TYPE_CHECKING:
    pass

log = logging.getLogger("latchwork.ontology")



class ReadWriteLock:
    """Many readers or one writer (the writer waits for readers to leave)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False

    @contextmanager
    def reading(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._writing)
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextmanager
    def writing(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._writing)
            self._writing = True
            self._cond.wait_for(lambda: self._readers == 0)
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


class OntologyCache:
    """A node's in-memory class hierarchy, reloaded on UPDATE_CACHE."""

    def __init__(self) -> None:
        self._lock = ReadWriteLock()
        self._parents: dict[str, frozenset[str]] = {}
        self.generation = 0

    def reload(self, store: Store) -> None:
        parents: dict[str, set[str]] = {}
        for child, parent in store.ontologies.subclass_edges():
            parents.setdefault(child, set()).add(parent)
            parents.setdefault(parent, set())
        with self._lock.writing():
            self._parents = {k: frozenset(v) for k, v in parents.items()}
            self.generation += 1

    @property
    def size(self) -> int:
        with self._lock.reading():
            return len(self._parents)

    def ancestors(self, class_iri: str) -> set[str]:
        with self._lock.reading():
            seen: set[str] = set()
            frontier = [class_iri]
            while frontier:
                nxt = [p for c in frontier for p in self._parents.get(c, ()) if p not in seen]
                seen.update(nxt)
                frontier = nxt
            seen.discard(class_iri)
            return seen

    def descendants_or_self(self, class_iris: set[str]) -> set[str]:
        """Every class that is one of ``class_iris`` or below one (eligibility checks)."""
        with self._lock.reading():
            children: dict[str, set[str]] = {}
            for child, parents in self._parents.items():
                for parent in parents:
                    children.setdefault(parent, set()).add(child)
            found = set(class_iris)
            frontier = list(class_iris)
            while frontier:
                nxt = [c for p in frontier for c in children.get(p, ()) if c not in found]
                found.update(nxt)
                frontier = nxt
            return found


