"""Several processes on one embedded graph file: conditional updates claim each task once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

from coord.testing import NodeProcess
from runner.store import TaskStatus, open_store

TASKS = 500
PROCESSES = 4


def test_four_processes_claim_500_tasks_each_exactly_once(
        tmp_path: Path, spawn_node: Callable[..., NodeProcess]) -> None:
    graph = str(tmp_path / "graph.db")
    with open_store(graph) as store:
        created = {store.tasks.create("t", {"n": i}).id for i in range(TASKS)}
    log = tmp_path / "claims"
    nodes = [spawn_node(["-m", "runner.testing.storeclaimer", graph, f"p{i}", f"{log}{i}"],
                        name=f"claimer{i}") for i in range(PROCESSES)]
    for i in range(PROCESSES):
        Path(f"{log}{i}.go").touch()
    for node in nodes:
        line = node.wait_for_line("", 180)
        assert line.startswith("DONE"), line  # an ERROR line would carry the lock error
        assert node.wait(30) == 0
    claims = {f"p{i}": Path(f"{log}{i}").read_text().split() for i in range(PROCESSES)}
    every = Counter(t for ids in claims.values() for t in ids)
    assert set(every) == created
    assert max(every.values()) == 1
    with open_store(graph) as store:
        for owner, ids in claims.items():
            for task_id in ids:
                task = store.tasks.get(task_id)
                assert (task.status, task.owner, task.version) == (TaskStatus.RUNNING, owner, 1)
    assert sum(1 for ids in claims.values() if ids) >= 2  # they really raced
