"""Run one of your task handlers in-process, for fast unit tests of its logic: no ZooKeeper,
no RabbitMQ, no node (dramatiq's stub broker is the model)::

    from runner.testing.stub import TaskStub
    from mypkg.tasks import sync                      # a function marked with @task

    def test_sync_pulls_every_invoice(tmp_path):
        with TaskStub(tmp_path) as stub:
            run = stub.run(sync, {"account": "acme"})
        assert run.succeeded and run.progress[-1] == (3, 3, "inv-3")
        assert run.returned == {"invoices": 3}        # what the handler returned, as stored

The stub drives the task loop's own code: the attempt runs in
:class:`~runner.tasks.worker.execution.Execution` (the handler with its observers, the
classification of what it raised, conflict retries, the type's retry policy, time limits,
heartbeats, process isolation) and its end is written by the loop's
:class:`~runner.tasks.worker.commit.GroupCommit`, over a real embedded graph (gremlite: one
SQLite file in the directory you give, ``stub.store`` to look at it). Only the cluster is
replaced: a session that is always valid and a task lock that is held until
``lost_at_check`` (the small :class:`~runner.tasks.worker.running.AttemptSession` and lock the
execution needs). So:

* ``ctx.progress()`` is recorded (``run.progress``) and written like the loop writes it;
* ``ctx.check()`` passes while the stub owns the task; ``run(..., lost_at_check=n)`` makes the
  n-th check find the task lost (as a lost lock or session would: the token is cancelled and
  the check raises), and a check also fails once the task's fence moved (``stub.store``);
* ``ctx.cancel`` is a real token: ``run(..., cancel_after=seconds)`` cancels it from a timer,
  the way a shutdown or an operator's cancel would;
* ``ctx.complete(write)`` and ``store.fenced_write(ctx.fence, ...)`` are the real guarded
  writes: the effect, the attempt's success and the task's finish in one transaction.

What it cannot show is the cluster: locks, sessions, another node taking over, a kill -9.
Those stay in real-server tests (``runner.testing.plugin``'s ``cluster`` fixture): a stub run
speeds up a unit test, it never replaces the real-server test of the same behaviour.
:class:`CommandStub` (:mod:`runner.testing.command_stub`) is the same for commands.

Why one module: the stub's session, lock and progress recorder exist only for
:class:`TaskStub`, and each of them is a few lines of what the task loop's code needs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coord import SessionState, TaskLock
from runner.store import Attempt, AttemptStatus, Store, Task, open_store
from runner.tasks import CancelToken, Services, TaskContext, TaskRegistry, TaskType
from runner.tasks.authoring import TaskDeclaration, register_declared
from runner.tasks.observer import Observer
from runner.tasks.outcomes import AttemptResult, Outcome
from runner.tasks.worker.commit import GroupCommit
from runner.tasks.worker.ends import Completed, Written
from runner.tasks.worker.execution import AttemptSupport, Execution
from runner.tasks.worker.running import Claimed, Ending, Slot
from runner.testing.command_stub import CommandRun, CommandStub

__all__ = ["CommandRun", "CommandStub", "StubRun", "TaskStub", "task_type_of"]


@dataclass
class StubRun:
    """One attempt of a handler run by :class:`TaskStub`, as the store recorded it."""

    task: Task  # as written after the attempt
    attempt: Attempt
    outcome: Outcome  # what the task loop would do next (FINISHED, RETRY, STOPPED, ...)
    result: AttemptResult
    #: every ``ctx.progress(done, total, message)`` the handler reported, in order
    progress: list[tuple[int, int | None, str]] = field(default_factory=list)
    checks: int = 0  # how many times the handler's ownership was checked (ctx.check, complete)
    completed: bool = False  # the handler concluded through ctx.complete()
    #: what the handler returned, as its SUCCEEDED attempt stores it and a client reads it
    #: back (the model its return annotation names; None: nothing stored)
    returned: object = None

    @property
    def succeeded(self) -> bool:
        return self.attempt.status is AttemptStatus.SUCCEEDED

    @property
    def error(self) -> str | None:
        return self.attempt.error


def task_type_of(handler: Callable[..., Any]) -> TaskType:
    """The task type a ``@task``-marked function declares."""
    declaration = getattr(handler, "latchwork_task", None)
    if not isinstance(declaration, TaskDeclaration):
        raise TypeError(f"{handler!r} is not marked with @task")
    registry = TaskRegistry()
    register_declared(registry, declaration, handler)
    return registry.get(declaration.name)


class _Session:
    """The stub's ZooKeeper session: always valid, no deadline."""

    state = SessionState.CONNECTED
    deadline = float("inf")

    def confirm(self) -> bool:
        return True


class _Lock(TaskLock):
    """The stub's task lock: held, and confirmed by each check until the ``lost_at``-th, from
    which on it is lost (as a lock taken away with its session would be). Nothing to release
    (the group commit skips a lock without a node)."""

    def __init__(self, task_id: str, owner: str, lost_at: int | None) -> None:
        self.task_id = task_id
        self.owner = owner
        self._node = None
        self._token = None
        self._mutex = threading.Lock()
        self.lost_at = lost_at
        self.checks = 0

    @property
    def is_held(self) -> bool:
        return self.lost_at is None or self.checks < self.lost_at

    def verify(self) -> bool:
        self.checks += 1
        return self.is_held


class _Recorder(Observer):
    """Records each progress report of the attempt the stub runs (wrapping the context's
    reporter, which writes it as the loop writes it)."""

    def __init__(self) -> None:
        self.progress: list[tuple[int, int | None, str]] = []

    def before_attempt(self, ctx: TaskContext) -> None:
        write = ctx.reporter

        def report(done: int, total: int | None, message: str) -> None:
            self.progress.append((done, total, message))
            if write is not None:
                write(done, total, message)
        ctx.reporter = report


class TaskStub:
    """Runs ``@task`` handlers one attempt at a time over an embedded graph in ``directory``."""

    def __init__(self, directory: str | Path, *, member_id: str = "stub:0:test",
                 services: Services | None = None) -> None:
        self.member_id = member_id
        self.services = services or Services()
        self.store: Store = open_store(str(Path(directory) / "stub-graph.db"))
        self._tokens = 0
        self._ended: dict[int, Written] = {}
        #: the loop's one writer of ends; it tells this stub what it wrote (EndReporter)
        self._commits = GroupCommit(self.store, member_id, self)
        self._executions: dict[str, tuple[Execution, _Recorder]] = {}

    def written(self, ending: Ending, written: Written) -> None:
        """The group commit wrote ``ending``: its attempt's observers hear it."""
        self._executions[ending.claim.task.type][0].report(ending.audience, written.status,
                                                            written.error)

    def ended(self, ending: Ending, written: Written) -> None:
        self._ended[id(ending)] = written

    def _execution(self, kind: TaskType) -> tuple[Execution, _Recorder]:
        """The execution of ``kind``'s attempts (kept: a process-isolated type's handler
        processes are started once), and its progress recorder, emptied."""
        if kind.name not in self._executions:
            registry = TaskRegistry()
            registry.add(kind)
            recorder = _Recorder()
            self._executions[kind.name] = (
                Execution(_Session(), self.member_id, self.store, registry, self._commits,
                          AttemptSupport([recorder], self.services)), recorder)
        execution, recorder = self._executions[kind.name]
        recorder.progress = []
        return execution, recorder

    def run(self, handler: Callable[..., Any] | TaskType,
            payload: Mapping[str, Any] | None = None, *, lost_at_check: int | None = None,
            cancel_after: float | None = None, task: Task | None = None) -> StubRun:
        """Run one attempt of ``handler`` (a function marked with ``@task``, or a registered
        :class:`~runner.tasks.TaskType`) on a new task of its type with ``payload`` (validated
        by its model: an invalid one raises :class:`~runner.errors.InvalidPayload`, as a
        submission would), or on ``task`` again (a retry: ``run.task`` of an earlier run)."""
        kind = handler if isinstance(handler, TaskType) else task_type_of(handler)
        if task is None:
            kind.parse(payload or {})
            task = self.store.tasks.create(kind.name, dict(payload or {}),
                                           resources=kind.resources)
        self._tokens += 1
        token = max(self._tokens, task.fence + 1)
        claimed, attempt = self.store.claim(task, token, self.member_id)
        lock = _Lock(claimed.id, self.member_id, lost_at_check)
        slot = Slot(claimed, lock, None, CancelToken(),
                    claim=Claimed(claimed, attempt, token))
        execution, recorder = self._execution(kind)
        timer = None
        if cancel_after is not None:
            timer = threading.Timer(cancel_after, slot.cancel.cancel, ("cancelled by the stub",))
            timer.daemon = True
            timer.start()
        try:
            ending = execution.run(slot)
            self._commits.conclude(ending)  # written and told as the loop's group commit does
        finally:
            if timer is not None:
                timer.cancel()
        written = self._ended.pop(id(ending))
        attempt = self.store.attempts.get(ending.claim.attempt.id)
        stored = (self.store.attempts.result(claimed.id)
                  if attempt.status is AttemptStatus.SUCCEEDED else None)
        return StubRun(written.task or self.store.tasks.get(claimed.id), attempt,
                       written.outcome, ending.result, progress=recorder.progress,
                       checks=lock.checks, completed=isinstance(ending.end, Completed),
                       returned=kind.result.decode(stored.text if stored else None))

    def close(self) -> None:
        for execution, _ in self._executions.values():
            execution.close()
        self._commits.close()
        self.store.close()

    def __enter__(self) -> TaskStub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
