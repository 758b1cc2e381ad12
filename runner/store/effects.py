"""A handler's last effect (``ctx.complete(write)``) as the store takes it: a traversal built
on ``g`` and not run (:class:`EffectTraversal` refuses to run it), and the same effect as data,
its recorded steps (:func:`effect_steps`), which a process-isolated handler sends its node and
the node adds to its own guarded write (:func:`replayed`). Part of the port: the steps are
gremlinpython bytecode, which both drivers run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from gremlin_python.process.graph_traversal import GraphTraversal
from gremlin_python.process.traversal import Bytecode

from runner.errors import InvalidValue
from runner.store.traversal import Traversal

NOT_RUN = ("ctx.complete(write): write(g) must build the effect on g and return it, not run "
            "it (no .iterate(), .to_list(), .next()): the store runs it with the success, as "
            "one traversal")
_TERMINAL = frozenset({"iterate", "next", "to_list", "to_set", "has_next", "toList", "toSet",
                       "hasNext", "__next__"})


class EffectTraversal:
    """The traversal an effect is built on (``ctx.complete()``): every step works as on a
    traversal, running it does not (:class:`InvalidValue`, before anything is sent): the
    effect is run by the store, with the guards and the success."""

    def __init__(self, traversal: Traversal) -> None:
        self.traversal = traversal

    def __getattr__(self, name: str) -> Any:
        if name in _TERMINAL:
            raise InvalidValue(NOT_RUN)
        step = getattr(self.traversal, name)
        if not callable(step):
            return step

        def call(*args: object, **kwargs: object) -> object:
            out = step(*args, **kwargs)
            return EffectTraversal(out) if out is self.traversal else out
        return call


def effect_steps(write: Callable[[Traversal], Traversal]) -> list[list[object]]:
    """The steps ``write`` (``ctx.complete()``'s effect) adds, built on a traversal of no
    graph: what a process-isolated handler sends its node, which adds them with
    :func:`replayed` to the guarded traversal of its own ``complete``, so the effect is the
    one the handler built, run under the node's guards. Raises :class:`InvalidValue` as the
    node's ``complete`` would (a ``write`` that runs its traversal)."""
    blank = GraphTraversal(None, None, Bytecode())
    built = write(EffectTraversal(blank))
    if not isinstance(built, EffectTraversal) or built.traversal is not blank:
        raise InvalidValue(NOT_RUN)
    return [list(step) for step in blank.bytecode.step_instructions]


def replayed(steps: list[list[object]]) -> Callable[[Traversal], Traversal]:
    """An effect that adds ``steps`` (from :func:`effect_steps`) to the traversal it is built
    on, as they were recorded."""
    def write(t: Traversal) -> Traversal:
        cast(EffectTraversal, t).traversal.bytecode.step_instructions.extend(
            list(step) for step in steps)
        return t
    return write
