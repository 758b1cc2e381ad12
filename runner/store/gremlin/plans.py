"""What a driver may offer the shared Gremlin layer beyond traversals: write plans applied, and
a few reads answered, without interpreting a traversal (:class:`Direct`).

A guarded write is also data (``Write.plan``: guards and changes as ops, see
:mod:`runner.store.gremlin.guards`), so a driver that can apply it to its storage directly
does so: the embedded driver by SQL into gremlite's tables
(:mod:`runner.store.embedded.direct`); a server has no such way (its graph offers no
``direct``) and gets the traversal. The shared layer asks :func:`direct_of` and never imports
a driver."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar, cast

from runner.store.api import Graph
from runner.store.traversal import Traversal

T = TypeVar("T")

#: one op of a write plan: ``("guard", name, pairs)``, ``("absent", "", pairs)``,
#: ``("set", name, props)``, ``("add", label, props, edge, from_name)``, ``("new", label,
#: props, name)``
Op = tuple[Any, ...]


class Plans(Protocol):
    """Inside one transaction of a graph that applies plans directly."""

    def apply(self, plan: Sequence[Op]) -> bool | None:
        """Apply ``plan``: whether its guards matched (True: written), or None when it
        cannot be applied as the traversal would (the caller writes the traversal instead,
        in the same transaction)."""
        ...

    def having(self, key: str, values: Sequence[str], limit: int,
               where: tuple[str, list[str]] | None = None) -> list[int]:
        """Up to ``limit`` vertices whose ``key`` is one of ``values`` (and, ``where``, whose
        other key is one of its values)."""
        ...

    def rows(self, vertices: Sequence[int], keys: Sequence[str]) -> list[dict[str, object]]:
        """The ``keys`` of each of ``vertices``, as element maps give them."""
        ...

    def values_of(self, key: str, value: str, wanted: str) -> set[str]:
        """The ``wanted`` values of the vertices whose ``key`` is ``value``."""
        ...

    def into(self, key: str, values: Sequence[str], label: str) -> list[tuple[str, int]]:
        """For each vertex whose ``key`` is one of ``values``, the sources of its ``label``
        edges: ``(value, source vertex)``."""
        ...


class Direct(Protocol):
    def run(self, fn: Callable[[Plans, Traversal], T], *, write: bool = False) -> T:
        """``fn(plans, g)`` inside one read's (``write``: one write's) transaction."""
        ...


def direct_of(graph: Graph) -> Direct | None:
    """The graph's direct way, when its driver has one (the embedded driver)."""
    return cast("Direct | None", getattr(graph, "direct", None))
