"""GraphStore: the four gremlin stores over one graph, and the owner's writes that span a task
and its attempts: claim, conclude, release, close_attempts, cancel, complete, fenced_write.

Each of these is one guarded traversal or one graph transaction, so a refused guard changes
nothing. A version moved by another writer raises :class:`~runner.errors.CommitConflict`;
a fencing token that is no longer the task's raises
:class:`~runner.errors.StaleFencingToken`; an attempt someone else closed raises
:class:`~runner.errors.AttemptAlreadyFinished`.

Why one module: these are the writes that span a task and its attempts, and they share one way
of building their guards (version, fence, RUNNING attempt, resource holders); split, each part
would rebuild the others' guards.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn, TypeVar

from runner.errors import (
    AttemptAlreadyFinished,
    CommitConflict,
    InvalidValue,
    StaleFencingToken,
    StoreError,
)
from runner.store.api import (
    AttemptLog,
    AvatarStore,
    CheckpointStore,
    Graph,
    IncidentStore,
    OntologyStore,
    RetentionStore,
    ScheduleStore,
    SearchStore,
    TaskStore,
    WorkflowStore,
)
from runner.store.ends import (
    AttemptEnd,
    Conclusion,
    EndWrite,
    EndWritten,
    LastEffect,
    attempt_end,
)
from runner.store.format import stamp
from runner.store.gremlin import batch, completer, releases
from runner.store.gremlin.attempts import GremlinAttemptLog
from runner.store.gremlin.avatars import GremlinAvatarStore
from runner.store.gremlin.checkpoints import GremlinCheckpointStore
from runner.store.gremlin.guards import (
    Write,
    fence_finds,
    fence_guard,
    resource_guard,
    under_fence,
)
from runner.store.gremlin.holders import claim_resources
from runner.store.gremlin.incidents import GremlinIncidentStore
from runner.store.gremlin.ontologies import GremlinOntologyStore
from runner.store.gremlin.plans import Plans
from runner.store.gremlin.retention import GremlinRetentionStore
from runner.store.gremlin.rows import task_props
from runner.store.gremlin.schedules import GremlinScheduleStore
from runner.store.gremlin.search import GremlinTaskSearch
from runner.store.gremlin.tasks import GremlinTaskStore
from runner.store.gremlin.workflows import GremlinWorkflowStore
from runner.store.gremlin.writes import (
    AttemptStart,
    TaskChange,
    add_end,
    attempt_start,
    changed_task,
    conclusion_write,
    finished_error,
    matched_write,
    task_change,
    until_written,
)
from runner.store.model import (
    Attempt,
    AttemptStatus,
    Fence,
    StopCause,
    Task,
    TaskStatus,
)
from runner.store.traversal import PropValue, Traversal

T = TypeVar("T")


def stops(c: Conclusion) -> bool:
    """Whether conclusion ``c`` stops its task for a failure (its retries spent)."""
    return c.changes.get("active") is False and c.changes.get("stop") == StopCause.FAILED


class GraphStore:
    """The store's parts over one graph connection; ``close()`` when done. Opened through
    :func:`runner.store.open_store`, which checks the graph's store format first
    (:mod:`runner.store.migrations`); ``format_version``: what :meth:`clear` stamps."""

    def __init__(self, graph: Graph, *, format_version: int) -> None:
        self.graph: Graph = graph
        self.format_version = format_version
        self._tasks = GremlinTaskStore(graph)
        self._attempts = GremlinAttemptLog(graph)
        self.tasks: TaskStore = self._tasks
        self.attempts: AttemptLog = self._attempts
        self.ontologies: OntologyStore = GremlinOntologyStore(graph)
        self.avatars: AvatarStore = GremlinAvatarStore(graph)
        self.schedules: ScheduleStore = GremlinScheduleStore(graph)
        self.incidents: IncidentStore = GremlinIncidentStore(graph)
        self.retention: RetentionStore = GremlinRetentionStore(graph)
        #: the state long handlers commit and resume from (``ctx.checkpoint``, ``ctx.resume``)
        self.checkpoints: CheckpointStore = GremlinCheckpointStore(graph)
        #: an operator's filtered, paged, newest-first view (the web console's task list)
        self.search: SearchStore = GremlinTaskSearch(graph)
        #: workflows: their vertices, members and edges (:mod:`.workflows`)
        self.workflows: WorkflowStore = GremlinWorkflowStore(graph, self._tasks)

    def claim(self, task: Task, fence_token: int, member_id: str) -> tuple[Task, Attempt]:
        """TaskClaim ``task`` as listed (RUNNING, owner, token; guarded by its version and fence)
        and add its RUNNING attempt (numbered from the task's attempt count), in one traversal.

        A task listed as RUNNING (its owner left without ending its attempt) is claimed with
        that owner's RUNNING attempts closed in the same traversal ("superseded"), so the
        history never shows two owners running it at once. Other claims read nothing.

        A task that declares resources records the new attempt as the holder of each (a
        ``resource`` vertex per name) in the same write, and takes the attempt's start time
        once that write holds the graph's writer slot (embedded graph): so it is later than
        the end of any attempt that wrote its success before, and a previous holder that has
        not (it lost its ZooKeeper hold) can no longer write a success
        (:class:`~runner.errors.ResourceTaken`).

        A task that moved on since it was listed raises :class:`CommitConflict`, one whose
        fence is not older than ``fence_token`` :class:`StaleFencingToken`, and nothing is
        written.
        """
        change = task_change(task, fence_token,
                             {"status": TaskStatus.RUNNING, "owner": member_id}, new_attempt=True)
        ends = (self.superseded(task, member_id, fence_token)
                if task.status is TaskStatus.RUNNING else [])  # ended before the new start
        if task.resources:
            started = claim_resources(self.graph, change, ends, member_id, fence_token,
                                      task.resources)
        else:
            start = attempt_start(change.task, member_id, fence_token)
            w = Write()
            for end in ends:
                add_end(w, end)
            start.add_to(w, change.add_to(w))
            started = start.attempt if batch.matched(self.graph, w) else None
        if started is None:
            self.claim_refused(task, fence_token)
        return change.task, started

    def claim_refused(self, task: Task, fence_token: int) -> NoReturn:
        """Why a claim of ``task`` as listed matched nothing: it moved on since it was listed
        (a fresh read says how: :class:`StaleFencingToken`, ``TaskNotFound``...), or a plain
        :class:`CommitConflict`."""
        self._tasks.prepare_update(task.id, task.version, fence_token, {})
        raise CommitConflict(task.id, task.version, None)

    def superseded(self, task: Task, member_id: str, fence_token: int) -> list[AttemptEnd]:
        """The ends of the RUNNING attempts of ``task`` (listed RUNNING: its owner left without
        ending them) that a claim by ``member_id`` closes in its own write (one read)."""
        return [attempt_end(a, AttemptStatus.CANCELLED_BY_SYSTEM,
                            f"cancelled by system: superseded by {member_id} (token "
                            f"{fence_token}); its executor {a.executor} had lost the task")
                for a in self.attempts.for_task(task.id) if a.status is AttemptStatus.RUNNING]

    def create_claimed(self, task: Task, fence_token: int,
                       member_id: str) -> tuple[Task, Attempt]:
        """Write the new ``task`` (``tasks.new``) as ``claim`` leaves it, RUNNING with its
        attempt, in one write (:func:`~runner.store.gremlin.batch.created`): what ``tasks.add``
        and ``claim`` write in two. Only for a task with no ``unique_key`` (an existing task may
        hold it) and no resources (their holders are read first): InvalidValue otherwise."""
        claimed, start, props = self._claimed_new(task, fence_token, member_id)
        batch.created(self.graph, props, start)
        return claimed, start.attempt

    def create_claimed_again(self, task: Task, fence_token: int,
                             member_id: str) -> tuple[Task, Attempt] | None:
        """:meth:`create_claimed` of a task whose id an earlier sending of the same request
        may have written already (a submit redelivered after its node was killed, paused or
        cut off before its answer went): the task and its attempt written only when no task
        has its id, found or made in the one write; None, nothing written, when one has."""
        claimed, start, props = self._claimed_new(task, fence_token, member_id)
        made = batch.created(self.graph, props, start, again=task.id)
        return (claimed, start.attempt) if made else None

    @staticmethod
    def _claimed_new(task: Task, fence_token: int,
                     member_id: str) -> tuple[Task, AttemptStart, dict[str, PropValue]]:
        if task.version != 0 or task.unique_key is not None or task.resources:
            raise InvalidValue(f"task {task.id}: only a new task without a uniqueness key or "
                               "resources is created claimed")
        claimed = changed_task(task, fence_token,
                               {"status": TaskStatus.RUNNING, "owner": member_id})
        return claimed, attempt_start(claimed, member_id, fence_token), task_props(claimed)

    def conclude(self, c: Conclusion) -> Task:
        """Write conclusion ``c`` as the task's owner: the attempt's end and the task's change
        in one traversal guarded by the attempt being RUNNING and the task's version and fence;
        no read when both still hold (:meth:`conclude_many`: several in one write).

        * The attempt was closed by someone else (the master's reaper, an operator's cancel):
          :class:`AttemptAlreadyFinished`, and nothing is written: that close moved the fence.
        * The task moved on but the token is still its own (e.g. a priority change): the
          task is re-read and both are written again.
        * The token is no longer the task's (another owner claimed it): the attempt is closed
          as CANCELLED_BY_SYSTEM ("superseded"), whatever the handler did, the task is left
          alone and :class:`StaleFencingToken` is raised.
        * A success of a task with resources, one of which another attempt claimed since
          (its holder lost its ZooKeeper hold): :class:`~runner.errors.ResourceTaken`,
          and nothing is written; the owner ends the attempt otherwise.
        """
        change = task_change(c.task, c.token, c.changes)
        if batch.matched(self.graph, conclusion_write(c, change, releases=self.releases([c]))):
            return change.task
        return self.conclude_refused(c)

    def releases(self, conclusions: Sequence[Conclusion],
                 within: Traversal | None = None,
                 plans: Plans | None = None) -> list[TaskChange]:
        """The changes workflow members' conclusions make of other members: a success
        releases its dependants (:func:`~runner.store.gremlin.releases.releases`), a stop
        (failed past its retries) starts its workflow's ``on_failure`` step
        (:func:`~runner.store.gremlin.releases.on_failure`); none for other conclusions.
        ``within``: read inside the write they go in (the embedded graph's transaction; with
        ``plans``, the dependants read there by SQL)."""
        ids = [c.task.id for c in conclusions if c.task.workflow is not None
               and c.status is AttemptStatus.SUCCEEDED]
        stopped = sorted({c.task.workflow for c in conclusions
                          if c.task.workflow is not None and stops(c)})
        return ((releases.releases(self.graph, ids, within, plans) if ids else [])
                + releases.on_failure(self.graph, stopped, within))

    def conclude_refused(self, c: Conclusion) -> Task:
        """:meth:`conclude` after its guarded write matched nothing: read what moved, and
        write again, or raise what it means (see :meth:`conclude`)."""
        end, task = c.end, c.task

        def once() -> Task | None:
            current = self._attempts.get(end.attempt_id)
            # a write whose answer was lost (the server unreachable after it ran) may have
            # ended the attempt already: that end is ours, not a close by someone else
            ours = (current.status is end.attempt.status
                    and current.ended_at == end.attempt.ended_at)
            if current.status is not AttemptStatus.RUNNING and not ours:
                raise AttemptAlreadyFinished(
                    f"attempt {end.attempt_id} is already {current.status.value}")
            task_now = self._tasks.get(task.id)
            if task_now.fence > c.token:
                if not ours:
                    self._end_superseded(current, c.token)
                raise StaleFencingToken(task.id, c.token, task_now.fence)
            again = task_change(task_now, c.token, c.changes)
            if c.needs:
                self.graph.read(lambda g: resource_guard(g, task.id, end.attempt_id, c.needs))
            # its dependants read again (another end may have changed them); none when the
            # end was ours already: that write changed them
            releases = [] if ours else self.releases([c])
            written = batch.matched(self.graph, conclusion_write(c, again, not ours, releases))
            return again.task if written else None

        return until_written(once, task.id)

    def claim_many(self, claims: Sequence[tuple[Task, int]], member_id: str
                   ) -> list[tuple[Task, Attempt] | StoreError]:
        """:meth:`claim` of several tasks without resources, in one write (one traversal);
        each task's claim or the store's refusal of it, in order (:mod:`.batch`)."""
        return batch.claim_many(self, claims, member_id)

    def conclude_many(self, conclusions: Sequence[Conclusion]) -> list[Task | StoreError]:
        """:meth:`conclude` of several attempts in one write (one traversal); each task as
        written or the store's refusal of that conclusion, in order (:mod:`.batch`). The graph
        out of reach raises for the whole batch."""
        return batch.conclude_many(self, conclusions)[0]

    def conclude_released(self, conclusions: Sequence[Conclusion]
                          ) -> tuple[list[Task | StoreError], tuple[Task, ...]]:
        """:meth:`conclude_many`, and the workflow members its write made claimable."""
        return batch.conclude_many(self, conclusions)

    def write_ends(self, writes: Sequence[EndWrite]) -> list[EndWritten | StoreError]:
        """The worker's one way to write its attempts' ends (:mod:`.completer`)."""
        return completer.write_ends(self, writes)

    def _end_superseded(self, attempt: Attempt, fence_token: int) -> None:
        try:
            self.attempts.finish(attempt.id, AttemptStatus.CANCELLED_BY_SYSTEM,
                                 f"cancelled by system: superseded, fencing token "
                                 f"{fence_token} is no longer the task's")
        except AttemptAlreadyFinished:
            pass

    def release(self, task_id: str, fence_token: int, changes: Mapping[str, object]) -> Task:
        """Update the task as its owner when no attempt is to be ended with it (e.g. a retry
        that was not started): :class:`StaleFencingToken` once the token is not the task's."""
        return self._tasks.modify(task_id, fence_token, changes)

    def close_attempts(self, task_id: str, status: AttemptStatus, error: str, *,
                       executor: str | None = None,
                       changes: Mapping[str, object] | None = None,
                       refuse_finished: bool = False) -> tuple[Task, list[Attempt]]:
        """Close RUNNING attempts as someone other than their owner (the master's reaper for
        ``executor``'s attempts, an operator's cancel for all), and apply ``changes``, in one
        traversal.

        If the closed owner is the task's current owner (the task is RUNNING under it, or a
        closed attempt carries the task's token), the task goes back to WAITING and its fence
        moves on in the same write: that owner can write nothing more on the task, not even
        "finished". Re-read and written again while someone else writes first.
        ``refuse_finished``: a finished task raises :class:`TaskFinished`, nothing written.
        """
        wanted = dict(changes or {})

        def once() -> tuple[Task, list[Attempt]] | None:
            task = self._tasks.get(task_id)
            if refuse_finished and task.finished:
                raise finished_error(task, "cancelled or deactivated")
            running = [a for a in self.attempts.for_task(task_id)
                       if a.status is AttemptStatus.RUNNING
                       and (executor is None or a.executor == executor)]
            owned = task.status is TaskStatus.RUNNING and (
                executor is None or task.owner == executor)
            move = owned or any(a.fence == task.fence for a in running)
            todo = dict(wanted)
            if move:
                todo["status"] = TaskStatus.WAITING
            if not running and not move and all(
                    getattr(task, k) == v for k, v in todo.items()):
                return task, []
            ends = [attempt_end(a, status, error) for a in running]
            change = task_change(task, None, todo, move_fence=move)
            w = Write()
            for end in ends:
                add_end(w, end)
            change.add_to(w)
            if batch.matched(self.graph, w):
                return change.task, [e.attempt for e in ends]
            return None

        return until_written(once, task_id)

    def cancel(self, task_id: str, by: str,
               reason: str | None = None) -> tuple[Task, list[Attempt]]:
        """An operator stops a task: it becomes inactive and a running attempt is closed as
        CANCELLED ("cancelled by operator ``by``"), its owner fenced off, in one write. The
        caller then frees the lock, which tells the owner to stop (its lost-lock listener)."""
        why = f"cancelled by operator {by}" + (f": {reason}" if reason else "")
        return self.close_attempts(task_id, AttemptStatus.CANCELLED, why,
                                   changes={"active": False}, refuse_finished=True)

    def complete(self, attempt: Attempt, task: Task, fence_token: int,
                 effect: LastEffect) -> Task:
        """A handler's last effect, its attempt SUCCEEDED and its task finished, as one guarded
        traversal: ``effect(t)`` builds the effect on ``t`` (a traversal that stands on the
        guards: ``t.add_v(...)``, ``t.V().has(...).property(...)``) and returns it, not
        iterated; the store runs guards, effect and success together, and nothing if the
        attempt is no longer RUNNING or the task's guards refuse. A task with resources also
        needs the attempt to still be their last claimant
        (:class:`~runner.errors.ResourceTaken` otherwise, nothing written).

        An owner killed before this write leaves no effect (the task is run again); after it,
        the effect and the success are both recorded. Raises :class:`AttemptAlreadyFinished`
        (closed by someone else) or :class:`StaleFencingToken` with nothing written; a task
        that moved on while the token is still its own is re-read and written again.
        """
        end = attempt_end(attempt, AttemptStatus.SUCCEEDED)
        fence = Fence(task.id, fence_token, attempt.id, task.resources)
        changes = {"status": TaskStatus.WAITING, "finished": True}
        current = [task]

        def once() -> Task | None:
            change = task_change(current[0], fence_token, changes)
            w = Write()
            for find in fence_finds(fence):
                w.guard(find)
            add_end(w, end)
            change.add_to(w)
            if task.workflow is not None:  # a member: its success releases its dependants
                for release in releases.releases(self.graph, [task.id]):
                    release.add_to(w)
            if matched_write(self.graph, lambda g: w.traverse(g, effect)):
                return change.task
            if self._attempts.get(attempt.id).status is not AttemptStatus.RUNNING:
                raise AttemptAlreadyFinished(f"attempt {attempt.id} was closed meanwhile")
            self.graph.read(lambda g: fence_guard(g, fence))  # StaleFencingToken, ResourceTaken
            current[0] = self._tasks.get(task.id)
            return None

        return until_written(once, task.id)

    def fenced_write(self, fence: Fence, fn: Callable[[Traversal], T]) -> T:
        """Run ``fn(g)`` as one write that is refused (:class:`StaleFencingToken` or
        :class:`~runner.errors.ResourceTaken`) unless ``fence`` is still the task's. ``g`` is
        a source whose every traversal starts with the fence's guards (``V()``, ``add_v()``,
        ``add_e()``), and the fence is read again at the end (:func:`under_fence`): in a
        transaction a refusal leaves nothing; on a server that runs one traversal at a time no
        traversal of ``fn`` runs once the fence moved (docs/graph.md)."""
        return self.graph.write(lambda g: under_fence(g, fence, fn))

    def clear(self) -> None:
        """Drop every vertex, then stamp the current format (a test's fresh start)."""
        self.graph.write(lambda g: g.V().drop().iterate())
        stamp(self.graph, self.format_version)

    def close(self) -> None:
        self.graph.close()

    def __enter__(self) -> GraphStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
