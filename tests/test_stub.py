"""The stub harness for users' unit tests (runner.testing.stub): a handler's logic without
ZooKeeper, RabbitMQ or a node, over a real embedded graph, concluded as the task loop concludes.
The same behaviours have their real-server tests elsewhere (test_runner, test_reliability)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from runner.errors import InvalidPayload
from runner.store import AttemptStatus
from runner.tasks import RetryPolicy, TaskContext, TaskRegistry, task
from runner.tasks.features.diag import effects, register_diagnostics
from runner.tasks.outcomes import Outcome
from runner.testing.stub import TaskStub


class Invoices(BaseModel):
    account: str
    count: int = 3


@task("billing.pull", payload=Invoices)
def pull(ctx: TaskContext, payload: Invoices) -> None:
    """Pull invoices, then write one record of them with the success."""
    for n in range(1, payload.count + 1):
        ctx.progress(n, payload.count, f"inv-{n}")
    ctx.check()
    ctx.complete(lambda g: g.add_v("invoice_batch").property("account", payload.account))


@task("billing.flaky", retry=RetryPolicy(max_attempts=3, backoff=30.0, retry_on=(OSError,)))
def flaky(ctx: TaskContext, payload: dict[str, Any]) -> None:
    raise OSError("the ledger timed out")


@task("billing.wait")
def wait(ctx: TaskContext, payload: dict[str, Any]) -> None:
    if not ctx.cancel.wait(30):
        raise AssertionError("never cancelled")


@task("billing.replay", retry=RetryPolicy(max_attempts=2, backoff=1.0, retry_on=(OSError,)))
def replay(ctx: TaskContext, payload: dict[str, Any]) -> None:
    """Replay ledger pages 0..9, committing the next page after each; page 6 fails once."""
    for page in range((ctx.resume or {}).get("page", 0), 10):
        ctx.progress(page, 10)
        if page == 6 and ctx.attempt.seq == 1:
            raise OSError("the ledger timed out")
        ctx.checkpoint({"page": page + 1})


def batches(stub: TaskStub) -> list[str]:
    rows: list[str] = stub.store.graph.read(
        lambda g: g.V().has_label("invoice_batch").values("account").to_list())
    return rows


def test_a_handler_runs_to_success_with_its_progress_and_its_effect(tmp_path: Path) -> None:
    with TaskStub(tmp_path) as stub:
        run = stub.run(pull, {"account": "acme"})
        assert run.succeeded and run.completed and run.outcome is Outcome.FINISHED
        assert run.progress == [(1, 3, "inv-1"), (2, 3, "inv-2"), (3, 3, "inv-3")]
        assert run.checks == 2  # its own, and the one complete() makes
        assert run.task.finished and batches(stub) == ["acme"]
        with pytest.raises(InvalidPayload, match="account"):
            stub.run(pull, {"acount": "acme"})


def test_a_lost_task_writes_nothing_and_ends_cancelled_by_system(tmp_path: Path) -> None:
    with TaskStub(tmp_path) as stub:
        run = stub.run(pull, {"account": "acme"}, lost_at_check=1)
        assert run.attempt.status is AttemptStatus.CANCELLED_BY_SYSTEM
        assert "lock was lost" in (run.error or "") and run.outcome is Outcome.CANCELLED
        assert batches(stub) == [] and not run.task.finished


def test_a_failure_follows_the_retry_policy_and_a_second_attempt_can_run(
        tmp_path: Path) -> None:
    with TaskStub(tmp_path) as stub:
        first = stub.run(flaky)
        assert first.outcome is Outcome.RETRY_LATER and first.task.run_at is not None
        assert first.error == "OSError: the ledger timed out" and first.task.active
        second = stub.run(flaky, task=first.task)
        assert second.attempt.seq == 2 and second.outcome is Outcome.RETRY_LATER
        third = stub.run(flaky, task=second.task)
        assert third.outcome is Outcome.STOPPED and not third.task.active  # 3 attempts: spent


def test_a_retry_resumes_from_the_checkpoint_the_failed_attempt_committed(
        tmp_path: Path) -> None:
    with TaskStub(tmp_path) as stub:
        first = stub.run(replay)
        assert first.outcome is Outcome.RETRY_LATER and [p for p, _, _ in first.progress] == \
            list(range(7))
        committed = stub.store.checkpoints.read(first.task.id)
        assert committed is not None and committed.state == {"page": 6}
        second = stub.run(replay, task=first.task)
        assert second.succeeded and [p for p, _, _ in second.progress] == list(range(6, 10))
        assert stub.store.tasks.get(second.task.id).checkpoint is not None


def test_a_cancellation_reaches_a_handler_that_waits_on_its_token(tmp_path: Path) -> None:
    with TaskStub(tmp_path) as stub:
        run = stub.run(wait, cancel_after=0.05)
        assert run.attempt.status is AttemptStatus.CANCELLED_BY_SYSTEM
        assert "cancelled by the stub" in (run.error or "")


def test_the_diagnostic_types_through_the_stub(tmp_path: Path) -> None:
    """The project's own handlers of pure logic, tested the way users test theirs."""
    registry = TaskRegistry()
    register_diagnostics(registry)
    with TaskStub(tmp_path) as stub:
        failed = stub.run(registry.get("diag.fail"), {"message": "by design"})
        assert failed.outcome is Outcome.STOPPED and failed.error == "RuntimeError: by design"
        conflict = stub.run(registry.get("diag.conflict"), {"conflicts": 1})
        assert conflict.outcome is Outcome.RETRY
        assert (conflict.error or "").startswith("commit conflict")
        again = stub.run(registry.get("diag.conflict"), task=conflict.task)
        assert again.succeeded and again.attempt.seq == 2
        effect = stub.run(registry.get("diag.effect"), {"seconds": 0})
        assert effect.succeeded and [r.task_id for r in effects(stub.store)] == [effect.task.id]
        appended = tmp_path / "appended.jsonl"
        lost = stub.run(registry.get("diag.append"), {"path": str(appended)},
                        lost_at_check=1)
        assert lost.outcome is Outcome.CANCELLED and not appended.exists()
        wrote = stub.run(registry.get("diag.append"), {"path": str(appended)})
        assert wrote.succeeded and len(appended.read_text().splitlines()) == 1


def test_handlers_find_their_services_by_type(tmp_path: Path) -> None:
    """ctx.services is typed: a handler asks for a class and gets an instance of it."""
    from runner.tasks import Services

    class Ledger:
        def total(self) -> int:
            return 42

    @task("billing.total")
    def total(ctx: TaskContext, payload: dict[str, Any]) -> None:
        ctx.progress(ctx.services.get(Ledger).total(), None, "")
        assert ctx.services.find(Invoices) is None  # nothing of that class here

    with TaskStub(tmp_path, services=Services(Ledger())) as stub:
        assert stub.run(total).progress == [(42, None, "")]
    with TaskStub(tmp_path) as stub:
        missing = stub.run(total)
        assert missing.outcome is Outcome.STOPPED and "no Ledger" in (missing.error or "")
