"""Ontology sources (a directory; an OLS-compatible HTTP API served for real on loopback),
the synchronisation diff and the node's ontology cache."""

from __future__ import annotations

import functools
import http.server
import importlib.util
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.errors import SourceError
from runner.ontology import DirectorySource, OlsSource, OntologyCache, OntologySync
from runner.ontology.parse import checksum_of
from runner.store import Ontology, OntologyClass, Store, open_store

ALIGN = Path(importlib.util.find_spec("brickschema").submodule_search_locations[0]) / (  # type: ignore[union-attr,index]
    "ontologies/1.2/alignments")


@pytest.fixture
def ols(tmp_path: Path) -> Iterator[str]:
    """A static OLS-like API on 127.0.0.1: two pages of ontologies, files under /files/."""
    root = tmp_path / "www"
    (root / "api").mkdir(parents=True)
    (root / "files").mkdir()
    for name in ("Brick-BOT-alignment.ttl", "Brick-REC-alignment.ttl"):
        shutil.copy(ALIGN / name, root / "files" / name)
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    base = f"http://127.0.0.1:{server.server_address[1]}"

    def page(name: str, file: str, nxt: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {"_embedded": {"ontologies": [
            {"ontologyId": name, "config": {"fileLocation": f"{base}/files/{file}"}}]}}
        if nxt:
            body["_links"] = {"next": {"href": f"{base}/api/{nxt}"}}
        return body

    (root / "api" / "ontologies").write_text(json.dumps(
        page("bot", "Brick-BOT-alignment.ttl", "ontologies-2")))
    (root / "api" / "ontologies-2").write_text(json.dumps(
        page("rec", "Brick-REC-alignment.ttl", None)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield base
    server.shutdown()
    server.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class RecordingBus:
    """Stands in for the message bus in this pure-logic test (the real one is covered by
    tests/test_runner.py with node processes)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def broadcast(self, command: str, payload: dict[str, Any] | None = None) -> None:
        self.sent.append((command, payload or {}))

    def send_master(self, command: str, payload: dict[str, Any] | None = None) -> None:
        self.sent.append((command, payload or {}))


def test_ols_source_lists_every_page_and_fetches_files(ols: str) -> None:
    source = OlsSource(ols)
    entries = source.entries()
    assert {e.iri for e in entries} == {"https://w3id.org/bot/BRICKAlignment",
                                       "https://w3id.org/rec/alignments/BrickSchema"}
    for entry in entries:
        assert checksum_of(source.fetch(entry.ref)) == entry.checksum
    with pytest.raises(SourceError, match="404"):
        source.fetch(f"{ols}/files/missing.ttl")
    with pytest.raises(SourceError):
        OlsSource("http://127.0.0.1:9").entries()


def test_synchronisation_creates_one_task_per_new_or_changed_ontology(
        ols: str, tmp_path: Path) -> None:
    with open_store(str(tmp_path / "g.db")) as store:
        bus = RecordingBus()
        sync = OntologySync(ols, store, bus, "m1")  # type: ignore[arg-type]
        first = sync.synchronize()  # one workflow: a load per ontology, then the broadcast
        assert len(first) == 2
        (broadcast,) = store.tasks.all("ontology.broadcast")
        assert broadcast.workflow is not None and broadcast.pending == 2
        assert sorted(store.workflows.depends_on([broadcast.id])[broadcast.id]) == sorted(first)
        assert sync.synchronize() == []  # same content: the uniqueness keys are held
        assert len(store.tasks.all("ontology.load")) == 2
        assert len(store.tasks.all("ontology.broadcast")) == 1


def test_directory_source_reports_unparseable_files_without_an_iri(tmp_path: Path) -> None:
    (tmp_path / "good.ttl").write_bytes((ALIGN / "Brick-BOT-alignment.ttl").read_bytes())
    (tmp_path / "bad.ttl").write_text("this is not turtle")
    (tmp_path / "notes.txt").write_text("ignored: not an ontology format")
    entries = {Path(e.ref).name: e for e in DirectorySource(tmp_path).entries()}
    assert set(entries) == {"good.ttl", "bad.ttl"}
    assert entries["bad.ttl"].iri is None
    assert entries["good.ttl"].iri == "https://w3id.org/bot/BRICKAlignment"
    with pytest.raises(SourceError, match="does not exist"):
        DirectorySource(tmp_path / "nope").entries()


def test_ontology_cache_answers_from_memory_and_reloads_consistently(tmp_path: Path) -> None:
    with open_store(str(tmp_path / "g.db")) as store:
        _load(store, ("A", ()), ("B", ("A",)), ("C", ("B",)))
        cache = OntologyCache()
        cache.reload(store)
        assert cache.ancestors("x#C") == {"x#A", "x#B"}
        assert cache.descendants_or_self({"x#B"}) == {"x#B", "x#C"}
        readers_saw: list[int] = []

        def reader() -> None:
            for _ in range(200):
                size = cache.size
                readers_saw.append(size)

        threads = [threading.Thread(target=reader) for _ in range(3)]
        for t in threads:
            t.start()
        _load(store, ("D", ("C",)), iri="y")
        cache.reload(store)
        for t in threads:
            t.join()
        assert set(readers_saw) <= {3, 4}  # a reader sees the old or the new hierarchy
        assert cache.ancestors("x#D") == {"x#A", "x#B", "x#C"}


def _load(store: Store, *classes: tuple[str, tuple[str, ...]], iri: str = "x") -> None:
    store.ontologies.load(Ontology(iri, "1", iri, tuple(
        OntologyClass(f"x#{name}", name, tuple(f"x#{p}" for p in parents))
        for name, parents in classes)))
