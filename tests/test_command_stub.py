"""The command stub (runner.testing.stub.CommandStub): users' @command and @broadcast handlers
driven by the consumers' own policy over an in-memory transport. The same behaviours have
their real-server tests (test_user_commands, test_messaging, test_chaos's chaos.record); one
test here runs the same command on a real cluster and through the stub and compares."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from messaging import DeliveryOutcome, DeliveryState, Reject, fenced_out
from runner.client import RequestRefused
from runner.tasks import CommandContext, Services, broadcast, command
from runner.tasks.observer import Observer
from runner.testing.cluster import Cluster
from runner.testing.stub import CommandRun, CommandStub

EFFECTS = "/effects"


class Reindex(BaseModel):
    account: str
    lose_before_commit: bool = False


@command("test.reindex", payload=Reindex)
def reindex(ctx: CommandContext, payload: Reindex) -> dict[str, Any]:
    """Record the reindex of an account once, fenced by the mastership."""
    ctx.check()
    if payload.lose_before_commit:
        ctx.services.get(CommandStub).lose_mastership()
    txn = ctx.transaction()
    txn.create(f"{EFFECTS}/{payload.account}-{ctx.message_id}", ctx.member_id.encode())
    if fenced_out(txn.commit()):
        raise RuntimeError("refused: no longer the master that started it")
    return {"reindexed": payload.account}


@command("test.flaky")
def flaky(ctx: CommandContext, payload: dict[str, Any]) -> None:
    if payload.get("reject"):
        raise Reject("bad request, by design")
    raise OSError("the index is down")


CACHE: dict[str, str] = {}


@broadcast("test.cache.put")
def put(ctx: CommandContext, payload: dict[str, Any]) -> None:
    ctx.check()
    CACHE.update(payload)


def effects(stub: CommandStub) -> list[str]:
    return stub.tree.children(EFFECTS)


def stub_with_effects() -> CommandStub:
    services = Services()
    stub = CommandStub(services=services)
    services.add(stub)  # the handler loses the mastership through it
    stub.tree.ensure_path(EFFECTS)
    return stub


def test_a_command_is_answered_recorded_and_a_copy_of_it_is_a_duplicate() -> None:
    with stub_with_effects() as stub:
        run = stub.send(reindex, {"account": "acme"})
        assert run.outcome is DeliveryOutcome.HANDLED and run.state is DeliveryState.ACKED
        assert run.answer == {"ok": True, "result": {"reindexed": "acme"}}
        assert run.checks == 1 and effects(stub) == [f"acme-{run.message_id}"]
        again = stub.send(reindex, {"account": "acme"}, message_id=run.message_id)
        assert again.outcome is DeliveryOutcome.DUPLICATE and again.answer == run.answer
        assert again.checks == 0 and effects(stub) == [f"acme-{run.message_id}"]


def test_a_mastership_lost_at_a_check_or_before_the_commit_applies_nothing() -> None:
    with stub_with_effects() as stub:
        lost = stub.send(reindex, {"account": "acme"}, lost_at_check=1)
        assert lost.outcome is DeliveryOutcome.REQUEUED and lost.state is DeliveryState.REQUEUED
        assert lost.answer is None and effects(stub) == []
        fenced = stub.send(reindex, {"account": "acme", "lose_before_commit": True})
        assert fenced.outcome is DeliveryOutcome.REQUEUED and effects(stub) == []
        assert not stub.processed.contains(fenced.message_id)
        # the next master runs the requeued message: once
        again = stub.send(reindex, {"account": "acme"}, message_id=fenced.message_id)
        assert again.outcome is DeliveryOutcome.HANDLED
        assert effects(stub) == [f"acme-{fenced.message_id}"]


def test_bad_input_is_dead_lettered_and_a_failure_is_retried_then_dead_lettered() -> None:
    with stub_with_effects() as stub:
        invalid = stub.send(reindex, {"acount": "acme"})
        assert invalid.outcome is DeliveryOutcome.DEAD_LETTERED
        assert invalid.state is DeliveryState.REJECTED and invalid.detail.startswith("invalid")
        assert invalid.answer is not None and invalid.answer["error"]["code"] == "invalid"
        assert [p.routing_key for p in invalid.published] == [stub.topology.dead_queue]
        unknown = stub.send(reindex, {"account": "acme"}, command="test.nobody")
        assert unknown.outcome is DeliveryOutcome.DEAD_LETTERED
        assert unknown.detail.startswith("unknown-command")
        rejected = stub.send(flaky, {"reject": True})
        assert rejected.outcome is DeliveryOutcome.DEAD_LETTERED
        assert "bad request, by design" in rejected.detail
        retried = stub.send(flaky)
        assert retried.outcome is DeliveryOutcome.RETRIED and retried.answer is None
        assert [p.routing_key for p in retried.published] == [stub.topology.retry_queue(1)]
        last = stub.topology.retry.max_retries
        spent = stub.send(flaky, retries=last)
        assert spent.outcome is DeliveryOutcome.DEAD_LETTERED
        assert spent.detail.startswith("retries-exhausted") and spent.answer is not None


def test_a_broadcast_runs_with_its_services_and_the_observers_hear_each_run() -> None:
    heard: list[tuple[str, str]] = []

    class Runs(Observer):
        def after_command(self, name: str, seconds: float, result: str) -> None:
            heard.append((name, result))

    with CommandStub(observers=[Runs()]) as stub:
        run = stub.send(put, {"colour": "blue"})
        assert run.outcome is DeliveryOutcome.HANDLED and CACHE["colour"] == "blue"
        assert run.checks == 1 and run.answer is None  # a broadcast is not answered
        stub.send(flaky)
    assert heard == [("test.cache.put", "ok"), ("test.flaky", "failed")]


def test_a_command_waiting_on_its_cancellation_sees_the_mastership_go() -> None:
    """``lose_mastership()`` from another thread while the handler waits on
    ``ctx.cancelled``: the wait ends and the message goes back to the queue."""
    started = threading.Event()

    @command("test.wait")
    def wait(ctx: CommandContext, payload: dict[str, Any]) -> None:
        started.set()
        if ctx.cancelled.wait(30):
            raise RuntimeError("cancelled: leadership lost")

    with CommandStub() as stub:
        threading.Thread(target=lambda: started.wait(10) and stub.lose_mastership(),
                         daemon=True).start()
        run = stub.send(wait)
        assert run.outcome is DeliveryOutcome.REQUEUED and "cancelled" in run.detail


SAME_MODULE = '''
from pydantic import BaseModel
from messaging import Reject, fenced_out
from runner.tasks import CommandContext, command


class Quote(BaseModel):
    item: str
    reject: bool = False


@command("same.quote", payload=Quote)
def quote(ctx: CommandContext, payload: Quote) -> dict:
    ctx.check()
    if payload.reject:
        raise Reject(f"no quote for {payload.item}")
    txn = ctx.transaction()
    if fenced_out(txn.commit()):
        raise RuntimeError("refused: no longer the master")
    return {"item": payload.item, "price": 3 * len(payload.item)}
'''


def test_the_stub_and_a_real_cluster_answer_the_same_command_identically(
        cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same module's command sent through a real master (RabbitMQ, ZooKeeper's processed
    log) and through the stub: for a valid payload, a copy of it, a payload that does not
    validate and a rejected one, the sender gets the same answer, and the copy is handled
    once (the same recorded answer)."""
    import importlib

    path = cluster.load_module(tmp_path / "site", "same_commands", SAME_MODULE)
    monkeypatch.syspath_prepend(str(path.parent))
    quote = importlib.import_module("same_commands").quote
    sends = [{"item": "lamp"}, {"item": "chair", "reject": True}, {"price": 1}]

    def answered(call: Callable[[], Any]) -> tuple[Any, ...]:
        try:
            return ("ok", call())
        except RequestRefused as exc:
            return ("refused", exc.code)

    cluster.start_node()
    same = uuid.uuid4()
    with cluster.client(timeout=30) as client:
        real = [answered(lambda p=p: client.command("same.quote", p, wait=30))
                for p in sends]
        real.append(answered(lambda: client.command("same.quote", sends[0], id=same,
                                                    wait=30)))
        real.append(answered(lambda: client.command("same.quote", sends[0], id=same,
                                                    wait=30)))

    def stubbed(run: CommandRun) -> tuple[Any, ...]:
        assert run.answer is not None
        if run.answer["ok"]:
            return ("ok", run.answer["result"])
        return ("refused", run.answer["error"]["code"])

    with CommandStub() as stub:
        runs = [stub.send(quote, p) for p in sends]
        runs += [stub.send(quote, sends[0], message_id=same) for _ in range(2)]
    assert [stubbed(r) for r in runs] == real
    assert real[0] == ("ok", {"item": "lamp", "price": 12}) and real[1] == ("refused",
                                                                             "rejected")
    assert real[2] == ("refused", "invalid")
    assert [r.outcome for r in runs[3:]] == [DeliveryOutcome.HANDLED, DeliveryOutcome.DUPLICATE]
