"""A task's result (issue 72, item 1): what a ``@task`` handler returns, checked against its
return annotation and the 64 KiB limit where it returned (a thread of the node, or its handler
process), stored with its SUCCEEDED attempt in the end's fenced write (the store contract:
``test_a_result_lands_with_its_succeeded_attempt_only_and_a_stale_owners_never``; the group
commit's byte cap: ``test_group_commit``), and read back by the client (typed), the CLI, the web
console and the task stub."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from starlette.testclient import TestClient

from runner.client import ResultPending, ResultRef, TaskStopped
from runner.errors import RequestFailed, ResultInvalid
from runner.store import AttemptStatus
from runner.tasks import TaskContext, task
from runner.tasks.outcomes import Outcome
from runner.tasks.results import RESULT_LIMIT, ResultType
from runner.testing.cluster import Cluster
from runner.testing.stub import TaskStub
from runner.web.app import create_app

RESULTS_MODULE = '''
import os

from pydantic import BaseModel

from runner.tasks import TaskContext, task


class Batch(BaseModel):
    first: int
    last: int


class Enriched(BaseModel):
    count: int
    keys: list[str]
    pid: int = 0


@task("res.enrich", payload=Batch)
def enrich(ctx: TaskContext, p: Batch) -> Enriched:
    return Enriched(count=p.last - p.first + 1, keys=[f"k{i}" for i in range(p.first, p.first + 3)],
                    pid=os.getpid())


@task("res.isolated", payload=Batch, isolation="process")
def enrich_isolated(ctx: TaskContext, p: Batch) -> Enriched:
    return Enriched(count=p.last - p.first + 1, keys=[], pid=os.getpid())


@task("res.dict")
def as_dict(ctx: TaskContext, payload: dict) -> Enriched:
    return {"count": 2, "keys": ["a"]}


@task("res.big")
def big(ctx: TaskContext, payload: dict) -> dict[str, str]:
    return {"rows": "x" * (70 * 1024)}


@task("res.wrong")
def wrong(ctx: TaskContext, payload: dict) -> Enriched:
    return {"count": "many", "keys": []}


@task("res.isolated_big", isolation="process")
def isolated_big(ctx: TaskContext, payload: dict) -> list[str]:
    return ["y" * (70 * 1024)]


@task("res.none")
def nothing(ctx: TaskContext, payload: dict) -> None:
    return None


@task("res.untyped")
def untyped(ctx, payload):
    return [1, "two", {"three": 3.5}]


@task("res.object")
def not_json(ctx, payload):
    return object()


@task("res.slow")
def slow(ctx: TaskContext, payload: dict) -> int:
    ctx.cancel.wait(payload["seconds"])
    return 7
'''


class Shape(BaseModel):
    side: int


def test_a_result_is_checked_against_the_handlers_return_annotation() -> None:
    def typed(ctx: Any, payload: Any) -> Shape:
        raise AssertionError

    def listed(ctx: Any, payload: Any) -> list[int]:
        raise AssertionError

    def plain(ctx, payload):  # type: ignore[no-untyped-def]
        raise AssertionError

    def none(ctx: Any, payload: Any) -> None:
        raise AssertionError

    shape = ResultType.of(typed)
    assert shape.encode("t", Shape(side=3)) == '{"side":3}'
    assert shape.encode("t", {"side": "4"}) == '{"side":4}'  # validated into the model
    assert shape.decode('{"side":3}') == Shape(side=3)
    with pytest.raises(ResultInvalid, match="not Shape: side: Field required"):
        shape.encode("t", {"length": 3})
    with pytest.raises(ResultInvalid, match="is not list"):
        ResultType.of(listed).encode("t", ["a"])
    anything = ResultType.of(plain)
    assert anything.encode("t", {"b": [1, 2.5, None], "a": "x"}) == '{"a":"x","b":[1,2.5,null]}'
    assert anything.encode("t", Shape(side=1)) == '{"side":1}'  # a model: its JSON
    assert anything.encode("t", None) is None  # nothing to store
    with pytest.raises(ResultInvalid, match="not JSON"):
        anything.encode("t", {"at": object()})
    with pytest.raises(ResultInvalid, match="not JSON"):
        anything.encode("t", float("nan"))
    with pytest.raises(ResultInvalid, match=f"over the limit of {RESULT_LIMIT}"):
        anything.encode("t", "x" * RESULT_LIMIT)
    assert anything.encode("t", "x" * (RESULT_LIMIT - 2)) is not None  # its quotes: the limit
    assert ResultType.of(none).encode("t", None) is None
    with pytest.raises(ResultInvalid, match="is not None"):
        ResultType.of(none).encode("t", 3)
    # the client's reference reads the same annotation
    assert ResultRef.returned_by("id", typed).read({"side": 2}) == Shape(side=2)
    assert ResultRef.returned_by("id", plain).read({"side": 2}) == {"side": 2}


@task("stub.shape")
def shape_handler(ctx: TaskContext, payload: dict[str, Any]) -> Shape:
    return Shape(side=payload["side"])


@task("stub.huge")
def huge_handler(ctx: TaskContext, payload: dict[str, Any]) -> str:
    return "z" * RESULT_LIMIT


def test_the_stub_returns_what_the_handler_returned_as_stored(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """The stub drives the real end: the result is stored with the SUCCEEDED attempt and read
    back as the handler's type, in a thread and in a handler process; a result over the limit
    fails the attempt with the error, and nothing is stored."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "stub_results.py").write_text(RESULTS_MODULE)
    monkeypatch.syspath_prepend(str(site))
    import stub_results  # type: ignore[import-not-found]

    with TaskStub(tmp_path) as stub:
        run = stub.run(shape_handler, {"side": 4})
        assert run.succeeded and run.returned == Shape(side=4)
        stored = stub.store.attempts.result(run.task.id)
        assert stored is not None and (stored.attempt_id, stored.text) == (run.attempt.id,
                                                                           '{"side":4}')
        too_big = stub.run(huge_handler, {})
        assert too_big.attempt.status is AttemptStatus.FAILED
        assert too_big.outcome is Outcome.STOPPED and too_big.returned is None
        assert (too_big.error or "").startswith("ResultInvalid: task type 'stub.huge': its "
                                                "result is 65538 bytes of JSON"), too_big.error
        assert stub.store.attempts.result(too_big.task.id) is None

        isolated = stub.run(stub_results.enrich_isolated, {"first": 0, "last": 4})
        assert isolated.succeeded, isolated.error
        assert isinstance(isolated.returned, stub_results.Enriched)
        assert isolated.returned.count == 5 and isolated.returned.pid != os.getpid()
        refused = stub.run(stub_results.isolated_big, {})
        assert refused.attempt.status is AttemptStatus.FAILED
        assert "over the limit of 65536" in (refused.error or "")
        assert "in the handler process" in (refused.attempt.stack_trace or "")
        assert stub.run(stub_results.nothing, {}).returned is None


def test_a_client_reads_a_tasks_result_typed_and_waits_for_it(cluster: Cluster,
                                                               tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """On a real node: a typed handler's result comes back as its model through a typed
    reference (from a thread and from a handler process); a dict validates into the model; a
    stopped task raises its error; an open one says it is pending, and a wait returns it once
    it ends; the CLI, ``task show`` and the web console show it."""
    site = tmp_path / "site"
    cluster.load_module(site, "results_tasks", RESULTS_MODULE)
    monkeypatch.syspath_prepend(str(site))
    import results_tasks  # type: ignore[import-not-found]

    member = cluster.start_node()
    node_pid = cluster.nodes[member].pid
    with cluster.client() as client:
        ref = client.submit_for(results_tasks.enrich, results_tasks.Batch(first=0, last=9))
        enriched = client.result(ref, wait=60)
        assert isinstance(enriched, results_tasks.Enriched)
        assert (enriched.count, enriched.keys, enriched.pid) == (10, ["k0", "k1", "k2"],
                                                                  node_pid)
        iso = client.result(client.submit_for(results_tasks.enrich_isolated,
                                              {"first": 1, "last": 2}), wait=60)
        assert iso.count == 2 and iso.pid not in (0, node_pid)  # from its handler process

        shaped = client.submit("res.dict")
        assert client.result(shaped.id, wait=60, model=results_tasks.Enriched) == \
            results_tasks.Enriched(count=2, keys=["a"])
        assert client.result(shaped.id) == {"count": 2, "keys": ["a"], "pid": 0}
        assert client.result(client.submit("res.untyped").id, wait=60) == \
            [1, "two", {"three": 3.5}]
        assert client.result(client.submit("res.none").id, wait=60) is None

        for kind, error in (("res.big", "its result is 71691 bytes of JSON, over the limit "
                                        "of 65536"),
                            ("res.wrong", "its handler returned a value that is not Enriched: "
                                          "count: Input should be a valid integer"),
                            ("res.object", "its handler returned a value that is not JSON "
                                           "(object)")):
            stopped = client.submit(kind)
            with pytest.raises(TaskStopped) as caught:
                client.result(stopped.id, wait=60)
            assert caught.value.state == "failed" and error in (caught.value.error or ""), \
                caught.value.error
            assert (caught.value.error or "").startswith("ResultInvalid: ")
            assert client.get(stopped.id).attempts[-1].status == "FAILED"

        slow = client.submit("res.slow", {"seconds": 60})
        with pytest.raises(ResultPending, match=f"task {slow.id} is still (waiting|running)"):
            client.result(slow.id)
        with pytest.raises(ResultPending, match=r"after 0\.3s"):
            client.result(slow.id, wait=0.3)
        quick = client.submit("res.slow", {"seconds": 0.5})
        assert client.result(quick.id, wait=60) == 7
        with pytest.raises(RequestFailed) as unknown:
            client.result("no-such-task")
        assert unknown.value.code == "task_not_found"

    pending = cluster.cli("task", "result", slow.id)
    assert pending.exit_code == 3 and f"task {slow.id} is still" in pending.output, pending
    cluster.cli("task", "cancel", slow.id)
    cancelled = cluster.cli("task", "result", slow.id)
    assert cancelled.exit_code == 1 and f"task {slow.id} cancelled" in cancelled.output, cancelled
    shown = cluster.cli("task", "result", ref.task_id)
    assert shown.exit_code == 0 and json.loads(shown.output) == {"count": 10, "keys": ["k0", "k1",
                                                                                 "k2"],
                                                             "pid": node_pid}
    whole = cluster.cli("task", "result", ref.task_id, "--json")
    answer = json.loads(whole.output)
    assert answer["present"] and answer["state"] == "succeeded" and answer["size"] > 20
    failed = cluster.cli("task", "result", stopped.id, "--wait", "5")
    assert failed.exit_code == 1 and "not JSON" in failed.output, failed
    report = cluster.cli("task", "show", ref.task_id)
    assert report.exit_code == 0 and '"count": 10' in report.output, report.output
    types = json.loads(cluster.cli("task", "types", "--json").output)
    assert {t["name"]: t["result"] for t in types}["res.enrich"] == "Enriched"

    app = create_app(lambda: cluster.client(timeout=10), None, allow_actions=False)
    with TestClient(app) as web:
        page = web.get(f"/tasks/{ref.task_id}")
        assert page.status_code == 200 and 'id="result-value"' in page.text
        assert "&#34;count&#34;: 10" in page.text or '"count": 10' in page.text
        assert 'id="result-value"' not in web.get(f"/tasks/{stopped.id}").text
    assert "results_tasks" in sys.modules
