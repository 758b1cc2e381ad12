"""The owner's writes of several tasks as one traversal: claims (:func:`claim_many`) and
conclusions (:func:`conclude_many`), the task loop's batches.

Each task's write is its own guarded :class:`~runner.store.gremlin.guards.Write` (guards
first, then changes), one ``union`` branch ending in ``constant(n)``: a branch whose guards
match nothing changes nothing and says nothing, so the traversal answers the indices it wrote,
and the others go the single way (the store re-reads them and says why: moved on, fenced off,
closed by someone else). The ``union`` stands on the first task's vertex. One traversal is
atomic wherever one is (a transaction on the embedded graph, a server that runs one traversal
at a time), and on a Gremlin Server it is one request instead of one per task.

On the embedded graph the same writes are not interpreted as a traversal: each is applied from
its data form (``Write.plan``) by SQL, all in one transaction (:mod:`runner.store.embedded.direct`,
:func:`write_plans`), as are the store's single guarded writes (:func:`matched`): gremlite's
interpretation of a batch was most of a node's CPU in a drain.

Failure behaviour: the graph out of reach raises ``StoreUnavailable`` for the whole batch
(nothing of it is known written: the caller tries again, and a conclusion whose write had in
fact been applied is recognised as its own); a single task's refusal is returned in its place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NoReturn, Protocol, TypeVar

from gremlin_python.process.graph_traversal import __

from runner.errors import StoreError, StoreUnavailable, WriteRaceLost
from runner.store.api import Graph
from runner.store.ends import AttemptEnd, Conclusion
from runner.store.gremlin.guards import Write
from runner.store.gremlin.plans import Direct, Op, Plans, direct_of
from runner.store.gremlin.steps import add_vertex
from runner.store.gremlin.writes import (
    AttemptStart,
    TaskChange,
    add_conclusion,
    add_end,
    attempt_start,
    conclusion_write,
    matched_write,
    task_change,
)
from runner.store.model import Attempt, AttemptStatus, Task, TaskStatus
from runner.store.traversal import Props, Row, Traversal

X = TypeVar("X")


class _Store(Protocol):
    """What the batches need of the store (:class:`runner.store.GraphStore`): its graph, the
    ends a claim of a task left RUNNING makes, and the single way of each refused write."""

    graph: Graph

    def superseded(self, task: Task, member_id: str, fence_token: int) -> list[AttemptEnd]: ...

    def claim_refused(self, task: Task, fence_token: int) -> NoReturn: ...

    def conclude_refused(self, c: Conclusion) -> Task: ...

    def releases(self, successes: Sequence[Conclusion], within: Traversal | None = None,
                 plans: Plans | None = None) -> list[TaskChange]: ...


def written(store: _Store, writes: Sequence[Write], anchor: str) -> set[int]:
    """Run ``writes`` as one traversal standing on the task ``anchor`` (one of theirs: a
    ``union`` needs one traverser to start from); the indices of those whose guards matched
    (none when the anchor is gone: each then goes the single way)."""
    if not writes:
        return set()
    direct = direct_of(store.graph)
    if direct is not None:
        return write_plans(direct, writes)

    def run(g: Traversal) -> set[int]:
        branches = [w.traverse(__).constant(n) for n, w in enumerate(writes)]
        return set(g.V().has("task_id", anchor).union(*branches).to_list())

    try:
        return store.graph.write(run)
    except WriteRaceLost:  # a transactional server refused the commit: none was written
        return set()


def matched(graph: Graph, w: Write) -> bool:
    """:func:`matched_write` of one :class:`Write`: from its data form where the graph applies
    one (the embedded graph: :mod:`runner.store.embedded.direct`), else as its traversal."""
    direct = direct_of(graph)
    if direct is not None:
        return bool(write_plans(direct, [w]))
    return matched_write(graph, w.traverse)


def created(graph: Graph, props: Props, start: AttemptStart,
            again: str | None = None) -> bool:
    """The new task vertex ``props`` and its RUNNING attempt ``start`` (with its edge) in one
    write (``GraphStore.create_claimed``); ``again``: the task's id, which no vertex may have
    yet (a redelivered submit's: when one has, nothing is written and the answer is False).
    From its data form where the graph applies one (the embedded graph:
    :mod:`runner.store.embedded.direct`), else as one traversal."""
    def run(g: Traversal) -> bool:
        if again is None:
            start.extend(add_vertex(g, "task", props)).iterate()
            return True
        return bool(g.V().has("task_id", again).fold().coalesce(
            __.unfold().constant("found"),
            start.extend(add_vertex(__, "task", props)).constant("made")).to_list()
            == ["made"])

    direct = direct_of(graph)
    if direct is None:
        return graph.write(run)
    plan: list[Op] = [("new", "task", props, "t"), start.op("t")]
    if again is not None:
        plan.insert(0, ("absent", "", (("task_id", again),)))

    def apply(plans: Plans, g: Traversal) -> bool:
        done = plans.apply(plan)
        return run(g) if done is None else done
    return bool(direct.run(apply, write=True))


def added(graph: Graph, news: Sequence[tuple[Props, tuple[str, str] | None]],
          traverse: Callable[[Traversal, int], Row]) -> list[Row | None] | None:
    """New task vertices in one write of the embedded graph, each from its data form by SQL
    (``tasks.add_many``): ``news``, each a vertex's properties and the ``(key, value)`` no
    vertex may have yet (a uniqueness key, or a redelivered submit's id; None: no such
    guard). Per item: None, written as given; else the row its traversal ``traverse(g, n)``
    gave in the same transaction (the vertex found with that key, or one SQL could not write
    as gremlite would). None for a graph with no data form (a server)."""
    direct = direct_of(graph)
    if direct is None:
        return None

    def apply(plans: Plans, g: Traversal) -> list[Row | None]:
        rows = []
        for n, (props, unique) in enumerate(news):
            plan: list[Op] = [("new", "task", props, "t")]
            if unique is not None:
                plan.insert(0, ("absent", "", (unique,)))
            rows.append(None if plans.apply(plan) else traverse(g, n))
        return rows
    return list(direct.run(apply, write=True))


def write_plans(direct: Direct, writes: Sequence[Write]) -> set[int]:
    """``writes`` in one write transaction of the embedded graph, each from its data form by
    SQL (:func:`runner.store.embedded.direct.apply`); one that has none, or that SQL cannot apply as
    gremlite would, goes as its traversal in the same transaction. The indices of those whose
    guards matched."""
    def run(plans: Plans, g: Traversal) -> set[int]:
        out = set()
        for n, w in enumerate(writes):
            done = None if w.plan is None else plans.apply(w.plan)
            if done is None:
                done = bool(w.traverse(g).id_().to_list())
            if done:
                out.add(n)
        return out
    return set(direct.run(run, write=True))


def claim_many(store: _Store, claims: Sequence[tuple[Task, int]], member_id: str
               ) -> list[tuple[Task, Attempt] | StoreError]:
    """Claims of tasks without resources (``GraphStore.claim`` of each), written together."""
    if any(task.resources for task, _ in claims):
        raise ValueError("a task with resources is claimed alone (its holders are read first)")
    plans: list[tuple[Task, Attempt, Write] | StoreError] = []
    for task, token in claims:
        try:
            change = task_change(task, token, {"status": TaskStatus.RUNNING,
                                               "owner": member_id}, new_attempt=True)
        except StoreError as exc:  # a token older than the task's fence: refused at once
            plans.append(exc)
            continue
        w = Write()
        if task.status is TaskStatus.RUNNING:  # its owner left: close that attempt too
            for end in store.superseded(task, member_id, token):
                add_end(w, end)
        start = attempt_start(change.task, member_id, token)
        start.add_to(w, change.add_to(w))
        plans.append((change.task, start.attempt, w))
    writes = [(n, plan[2]) for n, plan in enumerate(plans) if not isinstance(plan, StoreError)]
    anchor = claims[writes[0][0]][0].id if writes else ""
    matched = {writes[k][0] for k in written(store, [w for _, w in writes], anchor)}
    out: list[tuple[Task, Attempt] | StoreError] = []
    for n, ((task, token), plan) in enumerate(zip(claims, plans, strict=True)):
        if isinstance(plan, StoreError):
            out.append(plan)
        elif n in matched:
            out.append((plan[0], plan[1]))
        else:
            out.append(_refusal(store.claim_refused, task, token))
    return out


def conclude_many(store: _Store, conclusions: Sequence[Conclusion]
                  ) -> tuple[list[Task | StoreError], tuple[Task, ...]]:
    """Conclusions of several attempts (``GraphStore.conclude`` of each), written together;
    one refused goes the single way (:meth:`GraphStore.conclude_refused`).

    The successes of workflow members that have dependants go together as one guarded write
    with the changes they make of their dependants (:meth:`_Store.releases`: one change per
    dependant, however many of them it depends on), so they are never refused against each
    other; if any of that write's guards is refused, each of them goes the single way (which
    reads its dependants again). With the answers, the dependants that write made claimable
    (none when it went the single way: those are found by the scan)."""
    changes = [task_change(c.task, c.token, c.changes) for c in conclusions]
    members = [n for n, c in enumerate(conclusions) if c.task.workflow is not None
               and (c.status is AttemptStatus.SUCCEEDED or c.changes.get("active") is False)]
    direct = direct_of(store.graph)
    if members and direct is not None:
        return _conclude_within(store, direct, conclusions, changes, members)
    releases = store.releases([conclusions[n] for n in members]) if members else []
    plain = [n for n in range(len(conclusions)) if not releases or n not in members]
    writes = [conclusion_write(conclusions[n], changes[n]) for n in plain]
    if releases:
        together = Write()
        for n in members:
            add_conclusion(together, conclusions[n], changes[n])
        for release in releases:
            release.add_to(together)
        writes.append(together)
    matched_at = written(store, writes, conclusions[0].task.id if conclusions else "")
    matched = {plain[k] for k in matched_at if k < len(plain)}
    made_ready: tuple[Task, ...] = ()
    if releases and len(plain) in matched_at:
        matched.update(members)
        made_ready = tuple(r.task for r in releases if r.task.open and r.task.pending == 0
                           and not r.task.awaits_commit)
    out: list[Task | StoreError] = []
    for n, (c, change) in enumerate(zip(conclusions, changes, strict=True)):
        if n in matched:
            out.append(change.task)
        else:
            out.append(_refusal(store.conclude_refused, c))
    return out, made_ready


def _conclude_within(store: _Store, direct: Direct, conclusions: Sequence[Conclusion],
                     changes: Sequence[TaskChange], members: Sequence[int]
                     ) -> tuple[list[Task | StoreError], tuple[Task, ...]]:
    """:func:`conclude_many` on the embedded graph, whose write holds its single writer slot:
    the ends first, then, in the same transaction, the changes the members' ends written make
    of the members they release (read inside it: nothing else can write meanwhile, so their
    guards hold and no end is refused for a dependant another end moved)."""
    writes = [conclusion_write(c, change) for c, change in zip(conclusions, changes,
                                                                strict=True)]

    def apply(plans: Plans, g: Traversal, w: Write) -> bool:
        done = None if w.plan is None else plans.apply(w.plan)
        return bool(w.traverse(g).id_().to_list()) if done is None else done

    def run(plans: Plans, g: Traversal) -> tuple[set[int], list[TaskChange]]:
        matched = {n for n, w in enumerate(writes) if apply(plans, g, w)}
        made = store.releases([conclusions[n] for n in members if n in matched], within=g,
                              plans=plans)
        for release in made:
            w = Write()
            release.add_to(w)
            if not apply(plans, g, w):  # read in this transaction: cannot have moved
                raise WriteRaceLost(f"task {release.task_id} moved inside its write")
        return matched, made

    matched, made = direct.run(run, write=True)
    out: list[Task | StoreError] = [
        change.task if n in matched else _refusal(store.conclude_refused, c)
        for n, (c, change) in enumerate(zip(conclusions, changes, strict=True))]
    return out, tuple(r.task for r in made if r.task.open and r.task.pending == 0
                      and not r.task.awaits_commit)


def _refusal(again: Callable[..., X], *args: object) -> X | StoreError:
    """What the single way makes of a write the batch's guards refused: its result, or the
    store's error; the graph out of reach propagates (the whole batch fails)."""
    try:
        return again(*args)
    except StoreUnavailable:
        raise
    except StoreError as exc:
        return exc
