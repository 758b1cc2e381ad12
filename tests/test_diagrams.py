"""The sequence diagrams in diagrams/ stay true to the code and to their rendering.

* every MASTER/MODEL command, API command and task type a diagram names (written ``MASTER X``,
  ``MODEL X``, ``API x.y``, ``task x.y``) is registered by the node, and every MASTER and MODEL
  command the node registers appears in some diagram;
* every upper-case name with an underscore in a diagram (``CANCELLED_BY_SYSTEM``,
  ``TRIGGER_SCAN``) is a command or a state the code has, so a renamed one cannot linger;
* every diagram has its SVG, and every message label of the source is in it (``make diagrams``
  was run after the last edit).
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from coord import SessionState
from coord.batches import BatchState, SeriesState
from messaging import Connector, MessageBus, Topology
from runner.config import Settings
from runner.node.api import NodeApi
from runner.node.node import Node
from runner.pipeline.aspects import State as AspectState
from runner.store import AttemptStatus, TaskStatus

DIAGRAMS = Path(__file__).resolve().parent.parent / "diagrams"
SOURCES = sorted(DIAGRAMS.glob("*.puml"))


def registered(tmp_path: Path) -> dict[str, set[str]]:
    """What a node registers, read from a node that is built but not started."""
    node = Node(Settings.load(graph=str(tmp_path / "graph.db")))
    bus = MessageBus(Connector("amqp://guest:guest@127.0.0.1:1/%2F"), Topology("diagrams"), "m")
    node.register_messages(bus)
    return {"MASTER": set(bus.master.commands()), "MODEL": set(bus.model.commands()),
            "API": set(NodeApi.handlers()), "task": set(node.registry.names())}


def names(text: str) -> Iterator[tuple[str, str]]:
    for kind, name in re.findall(r"\b(MASTER|MODEL)\s+([A-Z][A-Z_]+)\b", text):
        yield kind, name
    for kind, name in re.findall(r"\b(API|task)\s+([a-z]+\.[a-z_]+)\b", text):
        yield kind, name


def labels(source: str) -> Iterator[str]:
    """The text lines of every message, note and title in a PlantUML source."""
    for line in source.splitlines():
        line = line.strip()
        if line.startswith("'") or line.startswith("@") or line.startswith("!"):
            continue
        match = re.match(r"^(?:title\s+(.*)|note [^:]*:\s*(.*)|.*?-[^:]*?>[^:]*:\s*(.*))$", line)
        if match:
            text = next(g for g in match.groups() if g is not None)
            yield from (part.strip() for part in text.split("\\n") if part.strip())


def test_there_are_diagrams() -> None:
    assert len(SOURCES) >= 8


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_a_diagram_names_only_what_the_code_registers(source: Path, tmp_path: Path) -> None:
    known = registered(tmp_path)
    text = source.read_text()
    unknown = [f"{kind} {name}" for kind, name in names(text) if name not in known[kind]]
    assert unknown == []
    states = {s.value for enum in (AttemptStatus, TaskStatus, BatchState, SeriesState,
                                   AspectState) for s in enum} | {s.name for s in SessionState}
    allowed = known["MASTER"] | known["MODEL"] | states
    strays = sorted({t for t in re.findall(r"\b[A-Z]+(?:_[A-Z]+)+\b", text)} - allowed)
    assert strays == []


def test_every_master_and_model_command_is_in_a_diagram(tmp_path: Path) -> None:
    known = registered(tmp_path)
    shown = {(kind, name) for source in SOURCES for kind, name in names(source.read_text())}
    missing = [f"{kind} {name}" for kind in ("MASTER", "MODEL") for name in sorted(known[kind])
               if (kind, name) not in shown]
    assert missing == []


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_the_svg_is_rendered_from_the_current_source(source: Path) -> None:
    svg = source.with_suffix(".svg")
    assert svg.exists(), f"run `make diagrams`: {svg.name} is missing"
    rendered = {html.unescape(t).strip()
                for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg.read_text())}
    stale = [label for label in labels(source.read_text()) if label not in rendered]
    assert stale == [], f"run `make diagrams`: {svg.name} is older than {source.name}"
