"""Guards: what a write checks, in the same traversal as what it changes.

* :class:`Write`: one traversal, every guard first (each standing on its vertex under a label),
  then every change; a guard that matches nothing leaves nothing changed. It is atomic wherever
  one traversal is: a transaction, or a server that runs one traversal at a time.
* a handler's last effect (``ctx.complete()``) is built on an
  :class:`~runner.store.effects.EffectTraversal` and added after the guards by
  :meth:`Write.traverse`.
* :func:`fence_finds`, :class:`FencedSource`, :func:`under_fence`: a fence (the task's token,
  the attempt's resources) as guards, and as the first steps of every traversal of a fenced
  write; :func:`fence_guard` and :func:`resource_guard` read them and raise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

from runner.errors import InvalidValue, ResourceTaken, StaleFencingToken
from runner.store import codec
from runner.store.effects import NOT_RUN, EffectTraversal
from runner.store.gremlin.plans import Op
from runner.store.gremlin.steps import has_all, set_props
from runner.store.model import Fence
from runner.store.traversal import Props, Traversal

X = TypeVar("X")


class Write:
    """One guarded traversal: every guard first, each standing on its vertex under a label of
    its own, then every change, each from the vertex it changes (``select``).

    A guard that matches nothing leaves no traverser, so no change is made: the write is
    atomic wherever one traversal is (a transaction on the embedded graph or a transactional
    server; a server that runs one traversal at a time), and no write ever changes a vertex
    and then finds a later guard refusing (what a write of changes-then-guards, without a
    transaction to roll it back, leaves half made).

    An ``effect`` (``ctx.complete()``'s write, built on the traversal that stands on the
    guards) runs after the guards and before the changes; its traversers are folded into one
    and the guards are matched again (nothing can have moved them in the same traversal), so
    the changes are made once, whatever number of traversers the effect leaves.
    """

    def __init__(self) -> None:
        self._guards: list[tuple[str, Callable[[Traversal], Traversal]]] = []
        self._changes: list[Callable[[Traversal], Traversal]] = []
        #: the same write as data, for a graph that applies it without a traversal
        #: (:mod:`runner.store.embedded.direct`): None once a guard or change has no data form
        self.plan: list[Op] | None = []

    def guard(self, find: Callable[[Traversal], Traversal]) -> str:
        """``find(src)`` is ``src.V().has(...)...``: the vertex must match; its label."""
        label = f"w{len(self._guards)}"
        self._guards.append((label, find))
        pairs = getattr(find, "pairs", None)
        if self.plan is not None and pairs is not None:
            self.plan.append(("guard", label, pairs))
        else:
            self.plan = None
        return label

    def change(self, fn: Callable[[Traversal], Traversal],
               op: Op | None = None) -> None:
        """``fn(t)`` adds the change to ``t``; ``op``: the change as data (see :attr:`plan`):
        ``("set", label, props)`` or ``("add", vertex_label, props, edge_label, from_label)``
        (a vertex, and an edge to it from the vertex ``from_label``)."""
        self._changes.append(fn)
        op = op or getattr(fn, "op", None)
        if self.plan is not None and op is not None:
            self.plan.append(op)
        else:
            self.plan = None

    def traverse(self, g: Traversal,
                 effect: Callable[[Traversal], Traversal] | None = None) -> Traversal:
        if not self._guards:
            raise ValueError("a write needs at least one guard")
        t = self._guarded(g)
        if effect is not None:
            built = effect(EffectTraversal(t))
            if not isinstance(built, EffectTraversal):
                raise InvalidValue(NOT_RUN)
            t = self._guarded(built.traversal.fold())
        for fn in self._changes:
            t = fn(t)
        return t

    def _guarded(self, t: Traversal) -> Traversal:
        for label, find in self._guards:
            t = find(t).as_(label)
        return t


def fence_finds(fence: Fence) -> list[Callable[[Traversal], Traversal]]:
    """The guards of ``fence``: the task still carries its token, and its attempt is still the
    last claimant of each of its resources (:func:`claim_resources`)."""
    token = codec.encode_big(fence.token)
    finds = [finder(("task_id", fence.task_id), ("task_fence", token))]
    if fence.attempt_id is not None:
        finds += [finder(("resource_name", r), ("resource_holder", fence.attempt_id))
                  for r in sorted(set(fence.resources))]
    return finds


def finder(*pairs: tuple[str, object]) -> Callable[[Traversal], Traversal]:
    """A guard's ``find``: ``src.V().has(k1, v1).has(k2, v2)...``."""
    def find(src: Traversal) -> Traversal:
        return has_all(src.V(), *pairs)
    find.pairs = pairs  # type: ignore[attr-defined]  # its data form (Write.plan)
    return find


def set_on(label: str, props: Props) -> Callable[[Traversal], Traversal]:
    """A :class:`Write` change: ``props`` set on the vertex a guard labelled ``label``."""
    def change(t: Traversal) -> Traversal:
        return set_props(t.select(label), props)
    change.op = ("set", label, props)  # type: ignore[attr-defined]  # its data form (Write.plan)
    return change


class FencedSource:
    """A traversal source whose every traversal starts with ``fence``'s guards: given to a
    fenced write's function in place of ``g``, so each of its traversals is refused, as one
    traversal, once the fence moved (a server without transactions cannot refuse a write
    of several traversals as a whole; see :func:`under_fence`)."""

    def __init__(self, g: Traversal, fence: Fence) -> None:
        self._g = g
        self._finds = fence_finds(fence)

    def _prefix(self) -> Traversal:
        t = self._g
        for find in self._finds:
            t = find(t)
        return t

    def V(self, *ids: object) -> Traversal:
        return self._prefix().V(*ids)

    def add_v(self, *label: object) -> Traversal:
        return self._prefix().add_v(*label)

    def add_e(self, *label: object) -> Traversal:
        return self._prefix().add_e(*label)


def under_fence(g: Traversal, fence: Fence, fn: Callable[[Traversal], X]) -> X:
    """Inside a write: ``fn`` on a :class:`FencedSource`, then the fence read again. A fence
    only moves forward (tokens grow, a resource's holder is a new attempt each claim), so if it
    still holds after ``fn`` it held at every one of ``fn``'s traversals; if not,
    :class:`StaleFencingToken` or :class:`ResourceTaken` is raised: on the embedded graph or a
    transactional server the whole write rolls back; on a server that runs one traversal at a
    time, the traversals that ran while the fence held stay, and none ran after."""
    fence_guard(g, fence)
    out = fn(cast(Traversal, FencedSource(g, fence)))  # the source's three steps, fenced
    fence_guard(g, fence)
    return out


def fence_guard(g: Traversal, fence: Fence) -> None:
    """Inside a write: raise :class:`StaleFencingToken` unless ``fence`` is still the task's
    (one read; in a transaction nothing can move the fence between this check and the write's
    other steps; on a server without transactions, see :func:`under_fence`)."""
    if not (g.V().has("task_id", fence.task_id)
            .has("task_fence", codec.encode_big(fence.token)).id_().to_list()):
        raise StaleFencingToken(fence.task_id, fence.token, -1)
    if fence.attempt_id is not None:
        resource_guard(g, fence.task_id, fence.attempt_id, fence.resources)


def resource_guard(g: Traversal, task_id: str, attempt_id: str, resources: tuple[str, ...]) -> None:
    """Inside a write: raise :class:`ResourceTaken` unless attempt ``attempt_id`` is still the
    last to have claimed each of ``resources`` (:func:`claim_resources`). The ZooKeeper hold
    keeps live holders apart; this keeps a holder that lost its hold with its session (frozen,
    cut off) from writing after the next holder's claim, whatever it has not yet learned."""
    for resource in sorted(set(resources)):
        if not (g.V().has("resource_name", resource)
                .has("resource_holder", attempt_id).id_().to_list()):
            raise ResourceTaken(task_id, attempt_id, resource)
