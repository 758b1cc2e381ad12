"""Ontology synchronisation: the SYNCHRONIZE_MODEL diff, load tasks, the directory watcher.

* An **ontology source** lists entries (a reference, the checksum of its bytes, and the IRI when
  the file parses) and fetches bytes. :class:`DirectorySource` reads OWL/Turtle files from a
  directory (change detection by checksum; while this node is master a watcher notices new or
  changed files and notifies the master with ONTOLOGY_CHANGED); :class:`OlsSource` reads an
  OLS-compatible HTTP API (``/api/ontologies`` and each ontology's ``config.fileLocation``).
* **SYNCHRONIZE_MODEL** (on master election, on notification, on ``latchwork ontology sync``)
  diffs the source against the graph and creates one ``ontology.load`` task per missing or
  changed ontology, with the uniqueness key ``ontology:<iri or reference>:<checksum>``: a second
  sync with nothing new creates no task. A file that does not parse still gets its task, which
  fails with the parser's message; the others load.
* The **ontology.load** task fetches, checks the checksum, parses with rdflib, validates, loads
  classes and subClassOf edges (idempotent), then broadcasts MODEL UPDATE_CACHE; every node
  reloads its :class:`OntologyCache` under a write lock. An ontology of more than
  :data:`PART` classes is written a part at a time, each part followed by a checkpoint
  (``ctx.checkpoint``), and marked loaded last: a retry after a kill -9 or a failure resumes
  at the first part not committed.

"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from runner.errors import OntologyError, SourceError
from runner.ontology.parse import checksum_of, parse_ontology_bytes
from runner.ontology.sources import DirectorySource, SourceEntry, open_source
from runner.store import Ontology, Store
from runner.tasks import TaskContext, TaskRegistry

if TYPE_CHECKING:
    from messaging import MessageBus

log = logging.getLogger("latchwork.ontology")

LOAD_TASK = "ontology.load"
#: classes an ontology.load writes per part (a bigger ontology: a checkpoint after each part)
PART = 2000


class LoadPayload(BaseModel):
    ref: str
    checksum: str
    iri: str | None = None


class OntologySync:
    """The master's synchronisation and the loader tasks' access to the source."""

    def __init__(self, location: str | None, store: Store, bus: MessageBus,
                 member_id: str, is_master: Callable[[], bool] | None = None,
                 watch_interval: float = 2.0) -> None:
        self.location = location
        self.source = open_source(location) if location else None
        self.store = store
        self.bus = bus
        self.member_id = member_id
        self.is_master = is_master
        self.watch_interval = watch_interval
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def synchronize(self, message_id: str = "") -> list[str]:
        """Create load tasks for what the graph lacks; returns the ids of new tasks."""
        if self.source is None:
            log.info("member %s: no ontology source configured; nothing to synchronise",
                     self.member_id)
            return []
        entries = self.source.entries()
        by_iri: dict[str, SourceEntry] = {}
        invalid = []
        for entry in entries:
            if entry.iri is None:
                invalid.append(entry)
            elif entry.iri in by_iri:
                kept = max(by_iri[entry.iri], entry, key=lambda e: (e.version, e.ref))
                log.warning("two files declare ontology %s (%s, %s); loading %s", entry.iri,
                            by_iri[entry.iri].ref, entry.ref, kept.ref)
                by_iri[entry.iri] = kept
            else:
                by_iri[entry.iri] = entry
        created = []
        known_tasks = {t.id for t in self.store.tasks.all(LOAD_TASK)}
        for entry in [*by_iri.values(), *invalid]:
            if entry.iri is not None:
                record = self.store.ontologies.get(entry.iri)
                if record is not None and record.checksum == entry.checksum:
                    continue
            key = f"ontology:{entry.iri or entry.ref}:{entry.checksum}"
            task = self.store.tasks.create(
                LOAD_TASK, {"ref": entry.ref, "checksum": entry.checksum, "iri": entry.iri},
                unique_key=key, priority=10)
            if task.id not in known_tasks:  # the uniqueness key returned an existing task
                created.append(task.id)
        log.info("member %s: model synchronisation (%s): %d source entries, %d new load tasks",
                 self.member_id, message_id or "direct", len(entries), len(created))
        if created:
            self.bus.broadcast("TRIGGER_SCAN", {"tasks": created})
        return created

    def load(self, ctx: TaskContext, payload: LoadPayload) -> None:
        if self.source is None:
            raise SourceError("this node has no ontology source configured")
        data = self.source.fetch(payload.ref)
        if checksum_of(data) != payload.checksum:
            raise SourceError(f"{payload.ref} changed since it was synchronised; the next "
                              "synchronisation creates a task for the new content")
        ctx.cancel.raise_if_cancelled()
        ontology = parse_ontology_bytes(data, Path(payload.ref).name)  # OntologyError: stop
        if payload.iri is not None and ontology.iri != payload.iri:
            raise OntologyError(f"{payload.ref} now declares {ontology.iri}, not {payload.iri}")
        added, edges = self._write(ctx, ontology)
        log.info("member %s: loaded %s %s from %s: %d classes, %d edges added", self.member_id,
                 ontology.iri, ontology.version, payload.ref, added, edges)
        self.bus.broadcast("UPDATE_CACHE", {"ontology": ontology.iri})

    def _write(self, ctx: TaskContext, ontology: Ontology) -> tuple[int, int]:
        """The load, fenced: one write for an ontology of up to :data:`PART` classes; a bigger
        one in parts of that many classes (sorted by IRI), each followed by a checkpoint, then
        the ontology marked loaded: a retry after a kill -9 or a failure resumes at the first
        part not committed (``ctx.resume``, kept only for the same checksum)."""
        classes = sorted(ontology.classes, key=lambda c: c.iri)
        parts = [classes[n:n + PART] for n in range(0, len(classes), PART)]
        if len(parts) <= 1:
            ctx.check()  # still the owner, right before the load (itself fenced)
            result = self.store.ontologies.load(ontology, fence=ctx.fence)
            return result.added_classes, result.added_edges
        loaded = self.store.ontologies.get(ontology.iri)
        if loaded is not None and loaded.checksum == ontology.checksum:
            return 0, 0  # loaded already (a retry after its last write)
        resume = ctx.resume or {}
        start = int(resume.get("next", 0)) if resume.get("checksum") == ontology.checksum \
            else 0
        if start:
            log.info("member %s: %s resumes at part %d of %d (its checkpoint)",
                     self.member_id, ontology.iri, start + 1, len(parts))
        added = edges = 0
        for n in range(start, len(parts)):
            ctx.check()
            result = self.store.ontologies.load_part(ontology, parts[n], fence=ctx.fence)
            added, edges = added + result.added_classes, edges + result.added_edges
            ctx.checkpoint({"checksum": ontology.checksum, "next": n + 1})
            ctx.progress(n + 1, len(parts), f"{ontology.iri}: classes in parts")
        ctx.check()
        self.store.ontologies.finish(ontology, fence=ctx.fence)
        return added, edges

    # -- watching a directory source -----------------------------------------------------------
    def start_watching(self) -> None:
        """Poll the directory for changes; the baseline is taken now, so a file added before
        the first poll still counts as a change."""
        if isinstance(self.source, DirectorySource) and self._watcher is None:
            try:
                baseline: dict[str, tuple[int, int]] | None = self.source.fingerprint()
            except (SourceError, OSError) as exc:
                log.warning("ontology watch: %s", exc)
                baseline = None
            self._watcher = threading.Thread(target=self._watch, args=(baseline,),
                                             name="ontology-watch", daemon=True)
            self._watcher.start()

    def _watch(self, last: dict[str, tuple[int, int]] | None) -> None:
        assert isinstance(self.source, DirectorySource)
        while not self._stop.wait(self.watch_interval):
            try:
                current = self.source.fingerprint()
            except (SourceError, OSError) as exc:
                log.warning("ontology watch: %s", exc)
                continue
            if last is not None and current != last and not (
                    self.is_master is None or self.is_master()):
                log.info("member %s: ontology files changed; the master will report it",
                         self.member_id)
            elif last is not None and current != last:
                changed = sorted(set(current.items()) ^ set(last.items()))
                log.info("member %s: ontology files changed (%d); notifying the master",
                         self.member_id, len(changed))
                try:
                    self.bus.send_master("ONTOLOGY_CHANGED",
                                         {"files": sorted({c[0] for c in changed})})
                except Exception as exc:
                    log.warning("could not notify the master: %s", exc)
                    continue
            last = current

    def close(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(5)


def _load(ctx: TaskContext, payload: LoadPayload) -> None:
    sync = ctx.services.find(OntologySync)
    if sync is None:
        raise SourceError("no ontology synchroniser on this node")
    sync.load(ctx, payload)


def register_ontology_tasks(registry: TaskRegistry) -> None:
    registry.register(LOAD_TASK, _load, LoadPayload,
                      description="load one ontology file into the graph")
