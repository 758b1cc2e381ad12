"""The chaos suite's short profile (bench/chaos.py): a 3-server ensemble, RabbitMQ, 3 node
processes and mixed tasks under kill -9 (node and master), SIGSTOP, a silent partition, a
ZooKeeper leader kill, a broker restart, a forced session expiry and duplicate MASTER
publishes, once with the nodes on the embedded graph file, once on a Gremlin Server (where
a node's link to the graph is cut and the server restarted too), and once with every node and
server on a host of its own (network namespaces; link cuts and one-way cuts). Every guarantee
figure must be 0. ``make chaos`` runs the full profile."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "chaos.py"


def load_chaos() -> Any:
    spec = importlib.util.spec_from_file_location("latchwork_chaos", BENCH)
    assert spec is not None and spec.loader is not None
    chaos = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = chaos  # its dataclasses look their module up there
    spec.loader.exec_module(chaos)
    return chaos


def test_an_unfenced_line_is_excused_only_inside_a_stated_window() -> None:
    """The suite leaves out of its unfenced figures only the windows docs/reliability.md
    states: the owner SIGSTOPped after its check and before its line, and the owner killed
    -9 right after its line (before its group wrote the end: a chaos run killed a node 7 ms
    after a line, and the task's second attempt wrote it again). A kill before the line, long
    after it, or of another member, and a pause before the check, still count."""
    from runner.tasks.features.diag import AppendRecord

    chaos = load_chaos()
    line = AppendRecord("t", "a", 1, "m1", checked=100.0, at=100.001)

    def window(*disrupted: tuple[str, str, float, float]) -> Any:
        return chaos.in_stated_window(SimpleNamespace(disrupted=list(disrupted)), line)

    assert window(("m1", "kill_node", 100.008, float("inf"))) == ("kill_node", 100.008, 100.008)
    assert window(("m1", "kill_master", 100.5, float("inf")))[0] == "kill_master"
    assert window(("m1", "sigstop", 100.0005, 110.0)) == ("sigstop", 100.0005, 110.0)
    assert window(("m1", "kill_node", 99.9, float("inf"))) is None  # killed before its line
    assert window(("m1", "kill_node", 105.0, float("inf"))) is None  # its end long unwritten
    assert window(("m2", "kill_node", 100.008, float("inf"))) is None  # another member
    assert window(("m1", "sigstop", 99.0, 110.0)) is None  # paused before its check
    assert window(("m1", "partition", 100.008, 110.0)) is None


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("graph", ["embedded", "server", "hosts"])
def test_the_short_chaos_profile_breaks_no_guarantee(graph: str, tmp_path: Path) -> None:
    """``hosts``: every node and server on a host of its own (network namespaces, real link
    faults: ``bench/chaos.py --hosts``); a machine that cannot make them (not root) skips
    this case with the reason in one line, and the other cases still run."""
    from coord.testing.hosts import hosts_unavailable_reason

    if graph == "hosts" and (reason := hosts_unavailable_reason()) is not None:
        pytest.skip(reason)
    chaos = load_chaos()
    hosts = graph == "hosts"
    result = chaos.chaos("short", 20261122, tmp_path / "logs", "server" if hosts else graph,
                         hosts)
    assert result["drained"], result
    broken = {k: result[k] for k in chaos.ZERO if result[k]}
    assert broken == {}, (result, (tmp_path / "logs" / "chaos.log").read_text())
    faults = len(chaos.FAULTS) + (len(chaos.GRAPH_FAULTS) if graph != "embedded" else 0) + (
        len(chaos.HOST_FAULTS) - len(result["faults_left_out"]) if hosts else 0)
    faults += 1  # the one drawn from BURST_FAULTS while submit_many's burst is written
    assert sum(result["faults"].values()) == faults, result["faults"]
    assert result["burst"]["fault"] in chaos.BURST_FAULTS and result["burst"]["tasks"] > 0
    assert result["graph"] == ("embedded" if graph == "embedded" else "server")
    assert result["hosts"] is hosts
    assert result["tasks"] >= 120 and result["master_messages_confirmed"] >= 25
    assert not result.get("nodes_not_stopping_cleanly"), result
