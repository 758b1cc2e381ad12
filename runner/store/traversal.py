"""The names of what crosses from gremlinpython, which ships no types: a traversal
(:class:`Traversal`), a property value the store writes (:data:`PropValue`, :data:`Props`),
an element map a traversal answers (:data:`Row`). Below the port (:mod:`runner.store.api`)
and its values, so that both can name them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol


class Traversal(Protocol):
    """A gremlinpython traversal, or its source ``g``: every step an attribute that builds the
    next (``g.V().has(k, v).property(...)``), and the steps that run it. gremlinpython ships no
    type hints: what a run answers (element maps, counts, values) is untyped, and this names
    where such values cross."""

    #: the steps as data (gremlinpython's ``Bytecode``): what a traversal sends
    bytecode: Any

    def __getattr__(self, name: str) -> Callable[..., Traversal]: ...

    def to_list(self) -> list[Any]: ...

    def to_set(self) -> set[Any]: ...

    def next(self) -> Any: ...

    def has_next(self) -> bool: ...

    def iterate(self) -> Traversal: ...


#: a property's value as the store writes it (a string, a number, a flag, or none)
PropValue = str | int | float | bool | None
#: the properties a write sets on a vertex
Props = Mapping[str, PropValue]
#: an element map as a traversal answers it: property names (and ``T.id``, ``T.label``) to
#: values (gremlinpython's untyped answer, as :class:`Traversal`'s)
Row = Mapping[Any, Any]
