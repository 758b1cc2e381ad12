"""A fixed store workload and a normalised dump of the graph it leaves: what the store writes,
property by property, compared with a dump the code before a change wrote
(``tests/data/golden_store.json``; ``tests/test_store_golden.py``).

The workload makes every kind of write the runner makes (tasks alone and in bulk, claims alone
and in bulk, every kind of attempt end, the reaper's close, an operator's cancel, a release, a
last effect with its success, checkpoints, incidents, schedules, ontologies, avatars and their
aspects). The clock is frozen (every ``codec.now()`` the same instant) and ids are replaced by
what they name: a task by its type and payload, an attempt by its task and number; any other
uuid left in a value is a difference. Vertex ids (the server's own) are left out; an edge is
named by its two ends.

Run as a script to write the dump of one graph: ``python tests/golden_store.py OUT.json
[--server]`` (the server: a Gremlin Server of its own, started and stopped).
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

FROZEN = datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=UTC)
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def freeze_clock() -> Any:
    """Make the store's one clock (``codec.now``) stand still; the undo."""
    from runner.store import codec

    was = codec.now
    codec.now = lambda: FROZEN  # type: ignore[assignment]
    return lambda: setattr(codec, "now", was)


def workload(store: Any) -> None:
    """Every kind of write the runner makes, in a fixed order (the store's public writes)."""
    from golden_store_api import conclude, conclude_many

    from runner.store import AttemptStatus, Avatar, Fence, Ontology, OntologyClass, TaskStatus
    from runner.tasks.outcomes import Outcome, task_changes

    later = FROZEN + timedelta(hours=1)
    t = store.tasks
    a = t.create("g.alone", {"n": 1}, priority=5)
    keyed = t.create("g.keyed", {"n": 2}, unique_key="key-2")
    t.create("g.keyed", {"n": 2}, unique_key="key-2")  # the same task, nothing new
    t.create("g.later", {"n": 3}, run_at=later, ordering_key="ord")
    res = t.create("g.res", {"n": 4}, resources=["printer", "scanner"])
    bulk = t.add_many([t.new("g.bulk", {"n": 10 + i}, priority=i % 3) for i in range(6)])

    # a claim and a success; a claim with resources and a success
    task, attempt = store.claim(a, 11, "m1:1:aa")
    conclude(store, attempt, AttemptStatus.SUCCEEDED, task, task_changes(Outcome.FINISHED))
    task, attempt = store.claim(res, 12, "m1:1:aa")
    conclude(store, attempt, AttemptStatus.SUCCEEDED, task, task_changes(Outcome.FINISHED))

    # claims in bulk, and every kind of end in bulk: success, retry now, retry later, stop,
    # a failure with its stack, an end with the handler's last progress
    claims = store.claim_many([(b, 20 + i) for i, b in enumerate(bulk)], "m2:2:bb")
    claimed = [c for c in claims if not isinstance(c, Exception)]
    assert len(claimed) == 6, claims
    (t0, a0), (t1, a1), (t2, a2), (t3, a3), (t4, a4), (t5, a5) = claimed
    conclude_many(store, [
        (a0, AttemptStatus.SUCCEEDED, t0, task_changes(Outcome.FINISHED), {}),
        (a1, AttemptStatus.FAILED, t1, task_changes(Outcome.RETRY),
         {"error": "commit conflict: again"}),
        (a2, AttemptStatus.FAILED, t2, task_changes(Outcome.RETRY_LATER, later),
         {"error": "boom", "stack": "Traceback: boom"}),
        (a3, AttemptStatus.FAILED, t3, task_changes(Outcome.STOPPED),
         {"error": "ValueError: bad", "stack": "Traceback: bad"}),
        (a4, AttemptStatus.TIMED_OUT, t4, task_changes(Outcome.RETRY),
         {"error": "time limit of 1s reached"}),
        (a5, AttemptStatus.SUCCEEDED, t5, task_changes(Outcome.FINISHED),
         {"progress": json.dumps({"done": 3, "total": 3, "message": "all",
                                  "at": "2026-12-01T12:00:00.000000Z"})}),
    ])

    # a task written claimed; its end alone after a checkpoint, a progress and a heartbeat
    new = t.new("g.claimed", {"n": 30})
    task, attempt = store.create_claimed(new, 31, "m1:1:aa")
    store.checkpoints.commit(Fence(task.id, 31, attempt.id), 1, {"offset": 7})
    store.attempts.progress(attempt.id, 1, 2, "half")
    store.attempts.heartbeat(attempt.id, {"at": 1})
    conclude(store, attempt, AttemptStatus.SUCCEEDED, task, task_changes(Outcome.FINISHED))

    # the reaper closes a dead owner's attempt; an operator cancels; an owner releases
    task, attempt = store.claim(keyed, 40, "dead:9:cc")
    store.close_attempts(task.id, AttemptStatus.CANCELLED_BY_SYSTEM,
                         "cancelled by system: member dead:9:cc left", executor="dead:9:cc")
    task, attempt = store.claim(store.tasks.get(keyed.id), 41, "m1:1:aa")
    store.cancel(task.id, "ops", "not needed")
    later_task = store.tasks.with_key("ord")[0]
    store.release(later_task.id, later_task.fence, {"priority": 9})

    # a last effect written with its success
    eff = t.create("g.effect", {"n": 50})
    task, attempt = store.claim(eff, 51, "m1:1:aa")
    store.complete(attempt, task, 51,
                   lambda g: g.add_v("marker").property("marker_name", "effect-50"))

    # incidents, schedules, ontologies, avatars and their aspects
    store.incidents.raise_(keyed.id, "stuck", "first", "no progress for 1h")
    store.schedules.add("nightly", {"type": "g.alone", "every": 86400, "payload": {"n": 60}})
    classes = (OntologyClass("urn:c:A", "A"), OntologyClass("urn:c:B", "B", ("urn:c:A",)))
    store.ontologies.load(Ontology("urn:onto", "1.0", "sum-1", classes))
    store.avatars.upsert([Avatar("av-1", "urn:c:B", {"name": "one"}),
                          Avatar("av-2", "urn:c:A", {"name": "two"})])
    store.avatars.upsert_aspect("geo", {"av-1": {"type": "Point", "coordinates": [1, 2]}})
    assert store.tasks.get(a.id).status is TaskStatus.WAITING


def dump(store: Any) -> dict[str, Any]:
    """Every vertex and edge of the store's graph, ids replaced by what they name."""
    from runner.store.due import shard_of

    def read(g: Any) -> tuple[list[Any], list[Any]]:
        vs = g.V().project("id", "label", "props").by(__id()).by(__label()).by(
            __value_map()).to_list()
        es = g.E().project("label", "out", "in", "props").by(__label()).by(
            __out_id()).by(__in_id()).by(__value_map()).to_list()
        return vs, es

    vertices, edges = store.graph.read(read)
    rows = {v["id"]: (v["label"], {k: _one(x) for k, x in v["props"].items()})
            for v in vertices}
    for label, props in rows.values():
        if label == "task":  # the shard is a hash of the (random) id: checked, then named
            right = props["task_shard"] == shard_of(props["task_id"])
            props["task_shard"] = "<shard of its id>" if right else "<WRONG shard>"
    names: dict[str, str] = {}
    for label, props in rows.values():
        if label == "task":
            names[props["task_id"]] = f"task<{props['task_type']} {props['task_payload']}>"
    for label, props in rows.values():
        if label == "attempt":
            start = json.loads(props["attempt_start"])
            names[props["attempt_id"]] = f"attempt<{names[start['task']]}#{start['seq']}>"

    def named(value: Any) -> Any:
        if isinstance(value, str):
            for uid, name in names.items():
                value = value.replace(uid, name)
            return UUID.sub("<unnamed uuid>", value)
        return value

    def vertex(vid: Any) -> str:
        label, props = rows[vid]
        return json.dumps([label, {k: named(x) for k, x in sorted(props.items())}],
                          sort_keys=True)

    out_v = sorted(vertex(vid) for vid in rows)
    out_e = sorted(json.dumps([e["label"], vertex(e["out"]), vertex(e["in"]),
                               {k: named(x) for k, x in sorted(e["props"].items())}],
                              sort_keys=True) for e in edges)
    return {"vertices": [json.loads(v) for v in out_v],
            "edges": [json.loads(e) for e in out_e]}


def _one(value: Any) -> Any:
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def __id() -> Any:
    from gremlin_python.process.graph_traversal import __

    return __.id_()


def __label() -> Any:
    from gremlin_python.process.graph_traversal import __

    return __.label()


def __value_map() -> Any:
    from gremlin_python.process.graph_traversal import __

    return __.value_map()


def __out_id() -> Any:
    from gremlin_python.process.graph_traversal import __

    return __.out_v().id_()


def __in_id() -> Any:
    from gremlin_python.process.graph_traversal import __

    return __.in_v().id_()


def written(where: str, **options: Any) -> dict[str, Any]:
    """The workload run on a fresh store at ``where``; the dump it leaves."""
    from golden_store_api import open_fresh

    undo = freeze_clock()
    try:
        store = open_fresh(where, **options)
        try:
            workload(store)
            return dump(store)
        finally:
            store.close()
    finally:
        undo()


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    if "--server" in argv:
        from runner.testing.gremlinserver import GremlinServer

        with tempfile.TemporaryDirectory() as tmp:
            server = GremlinServer(Path(tmp))
            server.start()
            try:
                result = written(server.url, atomicity="serial")
            finally:
                server.stop()
    else:
        with tempfile.TemporaryDirectory() as tmp:
            result = written(str(Path(tmp) / "graph.db"))
    out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"{out}: {len(result['vertices'])} vertices, {len(result['edges'])} edges")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
