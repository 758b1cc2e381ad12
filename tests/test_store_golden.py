"""What the store writes does not change with its code: the golden workload
(``tests/golden_store.py``) run on each graph leaves, property by property, the dump the code
of release 0.2.0 left (``tests/data/golden_store.json``, written by that code on both graphs:
the two were identical), but for the one change made on purpose since: the format vertex says
format 6 (issue 72: workflows), written by this version. Results and workflows write what no
0.2.0 workload could; the store contract tests them on both graphs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from golden_store import written

from runner import __version__
from runner.store.migrations import CURRENT
from runner.testing.gremlinserver import GremlinServer

GOLDEN = json.loads((Path(__file__).parent / "data" / "golden_store.json").read_text())


def _compare(now: dict[str, list[object]]) -> None:
    now = {**now, "vertices": [_as_0_2_0(v) for v in now["vertices"]]}
    for kind in ("vertices", "edges"):
        was = {json.dumps(x, sort_keys=True) for x in GOLDEN[kind]}
        got = {json.dumps(x, sort_keys=True) for x in now[kind]}
        assert sorted(got - was) == [] and sorted(was - got) == [], kind
        assert len(now[kind]) == len(GOLDEN[kind]), kind


def _as_0_2_0(vertex: object) -> object:
    """The format vertex as 0.2.0 wrote it, once it is what this code writes (format 6 by
    this version); any other vertex as it is."""
    if not isinstance(vertex, list) or vertex[0] != "latchwork_format":
        return vertex
    props = dict(vertex[1])
    assert (props["format_version"], props["format_by"]) == (CURRENT, __version__) == \
        (6, "0.3.0.dev0"), props
    return [vertex[0], {**props, "format_version": 5, "format_by": "0.2.0"}]


@pytest.mark.parametrize("graph", ["embedded", "server"])
def test_the_workload_leaves_what_release_0_2_0_left(graph: str, tmp_path: Path,
                                                   request: pytest.FixtureRequest) -> None:
    if graph == "server":
        server: GremlinServer = request.getfixturevalue("gremlin_server")
        now = written(server.url, atomicity="serial")
    else:
        now = written(str(tmp_path / "graph.db"))
    _compare(now)


def test_a_changed_property_is_seen() -> None:
    """The comparison sees one property changed (the dump is not compared loosely)."""
    changed = json.loads(json.dumps(GOLDEN))
    changed["vertices"][0][1]["task_priority"] = 99
    with pytest.raises(AssertionError):
        _compare(changed)
