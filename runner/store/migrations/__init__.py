"""The graph's store format, and the steps that migrate an older graph to the current one.

**The format vertex.** One vertex labelled ``latchwork_format``, found by ``format_key =
"latchwork"`` (an index lookup), holds ``format_version`` (the format the graph is written in),
``format_cursor`` (where an interrupted step resumes: ``"<version>:<next vertex id>"``, empty
otherwise), ``format_at`` (when it last changed) and ``format_by`` (the latchwork version that
changed it). A graph without it is at format 0 (written before formats existed) unless it
holds no vertex at all: a brand-new graph is stamped with :data:`CURRENT` when a store first
opens it (:func:`open_format`, one upsert). The nodes of a new cluster, started together,
open one new graph at once: a node that reads while another stamps finds the stamp
(:func:`~runner.store.format.read_state` looks again), never "format 0".

**Opening.** :func:`~runner.store.open_store` reads the format before it builds a store: an older
graph raises :class:`~runner.errors.StoreFormatOutdated` ("run `latchwork store migrate`"), a
newer one :class:`~runner.errors.StoreFormatTooNew`, each one line, before anything else is
read or written. ``latchwork store migrate`` opens it without that check.

**Steps.** One module per format version in this folder, ``vNNN_<what>.py``, whose ``STEP``
migrates a graph at format NNN - 1 to NNN and whose docstring says what it changes; the
current format is the highest step's version. A step is idempotent (it changes only what still
lacks the change) and resumable (its pages are written with its cursor, so a run killed -9
goes on where the last page committed): run again, it finishes the job and changes nothing
twice. Adding a format change later is adding a step module and its test
(``tests/test_store_format.py``); docs/graph.md says how.

Failure behaviour: a graph out of reach raises ``StoreUnavailable`` like every read; a step
interrupted leaves the graph at the previous version with its cursor (nodes still refuse it;
migrate again). Task vertices that cannot be read at all (no ``task_state``: older than format
0) are left as they are and counted as ``unreadable``.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Protocol

from runner import __version__
from runner.errors import StoreFormatOutdated, StoreFormatTooNew
from runner.store.api import Graph
from runner.store.format import FormatState, read_state, stamp
from runner.store.migrations.backfill import StepProgress, TaskBackfill

__all__ = ["CURRENT", "RELEASES", "STEPS", "FormatState", "Step", "StepProgress", "StepReport",
           "TaskBackfill", "describe", "graph_version", "migrate", "open_format", "pending",
           "read_state", "stamp"]

MODULE = re.compile(r"^v(\d{3})_\w+$")


class Step(Protocol):
    """Migrates a graph at ``version - 1`` to ``version``."""

    version: int

    def run(self, graph: Graph, start: int, page: int, progress: StepProgress,
            dry_run: bool) -> tuple[int, int]:
        """(changed, unreadable); ``start``: the vertex id an interrupted run reached."""
        ...


@dataclass(frozen=True)
class StepReport:
    version: int
    what: str  # the first line of the step's docstring
    changed: int  # vertices changed (in a dry run: that would be)
    unreadable: int  # task vertices left as they were (older than format 0)
    seconds: float


def _steps() -> dict[int, tuple[Step, ModuleType]]:
    found: dict[int, tuple[Step, ModuleType]] = {}
    for info in pkgutil.iter_modules(__path__):
        match = MODULE.match(info.name)
        if match is None:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        step: Step = module.STEP
        if step.version != int(match[1]):
            raise RuntimeError(f"migration step {info.name}: its STEP.version is "
                               f"{step.version}, its name says {int(match[1])}")
        found[step.version] = (step, module)
    if sorted(found) != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migration steps must be numbered 1..n without gaps: {sorted(found)}")
    return found


#: every step by the version it migrates to
STEPS = _steps()
#: the store format this latchwork writes
CURRENT = max(STEPS, default=0)
#: the store format each release writes, oldest first. 0.1.0 wrote formats 0 to 4 as they
#: came (the releases before formats existed among them: they do not check a graph's format,
#: docs/graph.md "Upgrading"); from 0.2.0 a release writes one format, and a new format needs a
#: new release (tests/test_store_format.py fails otherwise), so ``format_by`` and the members'
#: versions tell releases apart
RELEASES = {"0.1.0": 4, "0.2.0": 5, "0.3.0.dev0": 6}


def describe(version: int) -> str:
    """The first line of step ``version``'s docstring."""
    doc = (STEPS[version][1].__doc__ or "").strip()
    return doc.splitlines()[0] if doc else f"format {version}"


def graph_version(state: FormatState) -> int:
    """The format a graph is at: its vertex's, :data:`CURRENT` for a brand-new one, else 0."""
    if state.version is not None:
        return state.version
    return CURRENT if state.empty else 0


def open_format(graph: Graph, where: str) -> int:
    """The check a store makes when it opens ``graph`` (named ``where`` in errors): a brand-new
    graph is stamped with :data:`CURRENT`; an older or a newer one raises, naming what to do."""
    state = read_state(graph)
    if state.version is None and state.empty:
        stamp(graph, CURRENT)
        return CURRENT
    version = graph_version(state)
    if version < CURRENT:
        raise StoreFormatOutdated(
            f"the graph at {where} is at store format {version}; this latchwork "
            f"{__version__} writes format {CURRENT}: stop the nodes and run `latchwork store "
            "migrate` (docs/graph.md)")
    if version > CURRENT:
        raise StoreFormatTooNew(
            f"the graph at {where} is at store format {version}, newer than this latchwork "
            f"{__version__} knows (format {CURRENT}): run a latchwork that writes format "
            f"{version}; downgrades are not supported")
    return version


def pending(state: FormatState) -> list[int]:
    """The versions of the steps a graph needs, in order."""
    return list(range(graph_version(state) + 1, CURRENT + 1))


def migrate(graph: Graph, where: str, *, dry_run: bool = False, page: int = 500,
            progress: Callable[[int], StepProgress] | None = None) -> list[StepReport]:
    """Run the pending steps in order (``progress(version)`` makes a step's progress callback);
    each finished step sets the graph's version. A dry run changes nothing and reports what
    each step would change. A graph newer than this code raises StoreFormatTooNew."""
    state = read_state(graph)
    if graph_version(state) > CURRENT:
        open_format(graph, where)  # raises, naming the version needed
    if state.version is None and state.empty and not dry_run:
        stamp(graph, CURRENT)  # a brand-new graph: nothing to migrate
    reports = []
    for version in pending(state):
        step = STEPS[version][0]
        start = state.cursor if state.cursor_version == version else 0
        began = time.monotonic()
        report = progress(version) if progress is not None else _quiet
        changed, unreadable = step.run(graph, start, page, report, dry_run)
        if not dry_run:
            stamp(graph, version)
        reports.append(StepReport(version, describe(version), changed, unreadable,
                                  time.monotonic() - began))
    return reports


def _quiet(done: int, total: int) -> None:
    pass
