"""Run one of your task handlers in-process, for fast unit tests of its logic: no ZooKeeper,
no RabbitMQ, no node (dramatiq's stub broker is the model)::

    from runner.testing.stub import TaskStub
    from mypkg.tasks import sync                      # a function marked with @task

    def test_sync_pulls_every_invoice(tmp_path):
        with TaskStub(tmp_path) as stub:
            run = stub.run(sync, {"account": "acme"})
        assert run.succeeded and run.progress[-1] == (3, 3, "inv-3")

The handler gets a real :class:`~runner.tasks.TaskContext` over a real embedded graph (gremlite:
one SQLite file in the directory you give, ``stub.store`` to look at it), on a task claimed as
the task loop claims one, and its attempt is concluded as the loop concludes it (the same
classification of what the handler raised, the type's retry policy, the same guarded writes):

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
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.errors import AttemptAlreadyFinished, ResourceTaken, StaleFencingToken
from runner.store import Attempt, AttemptStatus, Conclusion, GraphStore, Task, open_store
from runner.tasks import CancelToken, Services, TaskContext, TaskRegistry, TaskType
from runner.tasks.authoring import TaskDeclaration
from runner.tasks.outcomes import (
    AttemptResult,
    Outcome,
    attempt_result,
    task_changes,
    with_retry_policy,
)
from runner.tasks.progress import ProgressReporter


@dataclass
class StubRun:
    """One attempt of a handler run by :class:`TaskStub`, as the store recorded it."""

    task: Task  # as written after the attempt
    attempt: Attempt
    outcome: Outcome  # what the task loop would do next (FINISHED, RETRY, STOPPED, ...)
    result: AttemptResult
    #: every ``ctx.progress(done, total, message)`` the handler reported, in order
    progress: list[tuple[int, int | None, str]] = field(default_factory=list)
    checks: int = 0  # how many times the handler called ctx.check()
    completed: bool = False  # the handler concluded through ctx.complete()

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
    registry.register(declaration.name, handler, declaration.payload,
                      resources=declaration.resources, retry=declaration.retry)
    return registry.get(declaration.name)


class TaskStub:
    """Runs ``@task`` handlers one attempt at a time over an embedded graph in ``directory``."""

    def __init__(self, directory: str | Path, *, member_id: str = "stub:0:test",
                 services: Services | None = None) -> None:
        self.member_id = member_id
        self.services = services or Services()
        self.store: GraphStore = open_store(str(Path(directory) / "stub-graph.db"))
        self._tokens = 0

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
        cancel = CancelToken()
        run = StubRun(claimed, attempt, Outcome.CANCELLED, AttemptResult.succeeded())
        timer = None
        if cancel_after is not None:
            timer = threading.Timer(cancel_after, cancel.cancel, ("cancelled by the stub",))
            timer.daemon = True
            timer.start()
        reporter = ProgressReporter(self.store, attempt.id, cancel)

        def check() -> None:
            run.checks += 1
            if lost_at_check is not None and run.checks >= lost_at_check:
                cancel.cancel("its task lock was lost (lost_at_check)")
            elif self.store.tasks.get(claimed.id).fence != token:
                cancel.cancel("its fencing token was superseded")
            cancel.raise_if_cancelled()

        def complete(write: Callable[[Any], Any]) -> None:
            check()
            try:
                run.task = self.store.complete(attempt, run.task, token, write)
            except (AttemptAlreadyFinished, StaleFencingToken, ResourceTaken) as exc:
                cancel.cancel(f"it could not complete: {exc}")
                cancel.raise_if_cancelled()
            run.completed = True

        def report(done: int, total: int | None, message: str) -> None:
            run.progress.append((done, total, message))
            reporter.report(done, total, message)

        ctx = TaskContext(task=claimed, attempt=attempt, member_id=self.member_id,
                          fence_token=token, cancel=cancel, store=self.store,
                          services=self.services, checker=check, completer=complete,
                          reporter=report)
        try:
            run.result = attempt_result(lambda: kind.handler(ctx, kind.parse(claimed.payload)),
                                        cancel)
        finally:
            if timer is not None:
                timer.cancel()
        progress = reporter.close()
        run.outcome, run_at = with_retry_policy(kind, run.result, run.result.outcome,
                                                claimed.attempts)
        if run.completed:
            run.outcome = Outcome.FINISHED
        else:
            result = run.result
            run.task = self.store.conclude(Conclusion.of(
                attempt, result.status, run.task, token, task_changes(run.outcome, run_at),
                error=result.error, stack=result.stack, progress=progress))
        run.attempt = self.store.attempts.get(attempt.id)
        return run

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> TaskStub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
