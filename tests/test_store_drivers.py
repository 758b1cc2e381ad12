"""Each driver checks at open what it relies on, and refuses anything else in one line with
nothing written: the embedded one the gremlite and gremlinpython versions it was tested with and
the SQLite schema it writes into (read from the file), the server one the gremlinpython version.
The pins in pyproject.toml accept exactly what the checks accept."""

from __future__ import annotations

import re
import sqlite3
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from runner.errors import StoreSchemaUnknown
from runner.store import open_store
from runner.store.embedded import schema
from runner.store.server import driver
from runner.testing.gremlinserver import GremlinServer

ROOT = Path(__file__).resolve().parent.parent


def _graph_with_a_task(path: Path) -> None:
    with open_store(str(path)) as store:
        store.tasks.create("t", {"n": 1})


def _contents(path: Path) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    con = sqlite3.connect(path)
    try:
        return (con.execute("SELECT * FROM quads ORDER BY 1, 2, 3, 4").fetchall(),
                con.execute("SELECT * FROM graphelts ORDER BY 1").fetchall())
    finally:
        con.close()


@pytest.mark.parametrize(("change", "named"), [
    ("ALTER TABLE quads RENAME COLUMN o TO obj", "table quads has columns s INT, p INT, obj INT"),
    ("DROP INDEX sp", "index sp on quads is missing"),
    ("DROP INDEX ops; CREATE INDEX ops ON quads (p, o, s)", "index ops is on quads(p, o, s)"),
    ("ALTER TABLE strings RENAME TO strings_v2", "table strings is missing"),
])
def test_an_embedded_graph_whose_schema_was_altered_is_refused_and_nothing_written(
        tmp_path: Path, change: str, named: str) -> None:
    path = tmp_path / "graph.db"
    _graph_with_a_task(path)
    con = sqlite3.connect(path)
    con.executescript(change)
    con.close()
    before = path.read_bytes(), _contents(path) if "strings_v2" not in change else None
    with pytest.raises(StoreSchemaUnknown) as refused:
        open_store(str(path))
    message = str(refused.value)
    assert named in message and "nothing was written" in message and "\n" not in message
    assert (path.read_bytes(), _contents(path) if "strings_v2" not in change else None) == before


def test_an_embedded_graph_as_gremlite_made_it_opens_and_its_schema_is_the_one_relied_on(
        tmp_path: Path) -> None:
    path = tmp_path / "graph.db"
    _graph_with_a_task(path)
    con = sqlite3.connect(path)
    try:
        assert schema.differences(con) == []
    finally:
        con.close()
    with open_store(str(path)) as store:
        assert [t.type for t in store.tasks.all()] == ["t"]


@pytest.mark.parametrize(("package", "version", "named"), [
    ("gremlite", "0.1.3", "gremlite 0.1.3 is installed"),
    ("gremlite", "0.2.0", "gremlite 0.2.0 is installed"),
    ("gremlinpython", "3.8.0", "gremlinpython 3.8.0 is installed"),
])
def test_the_embedded_driver_refuses_versions_it_was_not_tested_with(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, package: str, version: str,
        named: str) -> None:
    real = metadata.version
    monkeypatch.setattr(metadata, "version",
                        lambda name: version if name == package else real(name))
    with pytest.raises(StoreSchemaUnknown, match=re.escape(named)):
        open_store(str(tmp_path / "graph.db"))
    assert not (tmp_path / "graph.db").exists()  # refused before the file was made


def test_the_server_driver_refuses_a_gremlinpython_it_was_not_written_for(
        gremlin_server: GremlinServer, monkeypatch: pytest.MonkeyPatch) -> None:
    real = metadata.version
    monkeypatch.setattr(metadata, "version",
                        lambda name: "3.8.1" if name == "gremlinpython" else real(name))
    with pytest.raises(StoreSchemaUnknown, match=re.escape("gremlinpython 3.8.1 is installed")):
        open_store(gremlin_server.url, atomicity="serial")
    monkeypatch.undo()
    driver.check_version()  # the installed one passes


def test_the_pins_accept_exactly_what_the_checks_accept() -> None:
    pins = {Requirement(r).name: Requirement(r).specifier for r in
            tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    candidates = ["0.1.1", "0.1.2", "0.1.3", "0.2.0", "3.6.9", "3.7.0", "3.7.7", "3.7.99",
                  "3.8.0"]
    for version in candidates:
        assert pins["gremlite"].contains(Version(version)) == (version in schema.GREMLITE)
        assert pins["gremlinpython"].contains(Version(version)) == \
            version.startswith(schema.GREMLINPYTHON) == version.startswith(driver.GREMLINPYTHON)
    installed = {name: metadata.version(name) for name in ("gremlite", "gremlinpython")}
    assert all(pins[name].contains(Version(v)) for name, v in installed.items())


def test_a_graph_at_a_path_with_a_space_and_a_hash_is_checked_and_opened(tmp_path: Path) -> None:
    """The check reads the file through a SQLite URI: any path is percent-encoded into it."""
    path = tmp_path / "a dir #1" / "graph.db"
    path.parent.mkdir()
    _graph_with_a_task(path)
    with open_store(str(path)) as store:
        assert [t.type for t in store.tasks.all()] == ["t"]


@pytest.mark.parametrize("code", [429, 598])
def test_a_server_that_cannot_take_a_request_now_is_out_of_reach_not_a_bare_error(
        gremlin_server: GremlinServer, code: int) -> None:
    """A Gremlin Server shutting down answered 429 "Rate limiting" to a node's master duties,
    whose thread died of the bare driver error (the node left with exit 70); such an answer is
    the graph out of reach for now (``StoreUnavailable``), which every caller handles."""
    from gremlin_python.driver.protocol import GremlinServerError

    from runner.errors import StoreUnavailable

    def refused(g: object) -> None:
        raise GremlinServerError({"code": code, "message": "Rate limiting", "attributes": {}})

    with open_store(gremlin_server.url, atomicity="serial") as store:
        with pytest.raises(StoreUnavailable, match="Rate limiting"):
            store.graph.read(refused)
        with pytest.raises(StoreUnavailable, match="Rate limiting"):
            store.graph.write(refused)
        assert store.graph.read(lambda g: g.inject(1).to_list()) == [1]
