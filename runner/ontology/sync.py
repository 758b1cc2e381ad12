"""Ontology synchronisation: the SYNCHRONIZE_MODEL diff, load tasks, the directory watcher.

* An **ontology source** lists entries (a reference, the checksum of its bytes, and the IRI when
  the file parses) and fetches bytes. :class:`DirectorySource` reads OWL/Turtle files from a
  directory (change detection by checksum; while this node is master a watcher notices new or
  changed files and notifies the master with ONTOLOGY_CHANGED); :class:`OlsSource` reads an
  OLS-compatible HTTP API (``/api/ontologies`` and each ontology's ``config.fileLocation``).
* **SYNCHRONIZE_MODEL** (on master election, on notification, on ``latchwork ontology sync``)
  diffs the source against the graph and submits one **workflow** (issue 72): one
  ``ontology.load`` task per missing or changed ontology, with the uniqueness key
  ``ontology:<iri or reference>:<checksum>`` (a checksum with a load task already is left out:
  a second sync with nothing new submits nothing), then one ``ontology.broadcast`` step once
  every load succeeded (a join). A file that does not parse still gets its load, which fails
  with the parser's message: the others load, and the broadcast waits, ``blocked`` with that
  error, until the failed load is reactivated (a fixed file is a new checksum: a new sync) or
  skipped. The workflow's key is made from the loads it holds, so two syncs of the same diff
  (two messages, a failover) submit it once.
* The **ontology.load** task fetches, checks the checksum, parses with rdflib, validates, loads
  classes and subClassOf edges (idempotent), and answers the ontology and its counts (its
  result); the **ontology.broadcast** step then broadcasts MODEL UPDATE_CACHE once for all of
  them: a sync of 40 files reloads every node's :class:`OntologyCache` once, under a write
  lock. An ontology of more than
  :data:`PART` classes is written a part at a time, each part followed by a checkpoint
  (``ctx.checkpoint``), and marked loaded last: a retry after a kill -9 or a failure resumes
  at the first part not committed.

"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from runner.errors import OntologyError, SourceError
from runner.ontology.parse import checksum_of, parse_ontology_bytes
from runner.ontology.sources import DirectorySource, SourceEntry, open_source
from runner.store import Ontology, Store
from runner.tasks import TaskContext, TaskRegistry, flows
from runner.workflows import Flow, WorkflowRef, chord, group, step

if TYPE_CHECKING:
    from messaging import MessageBus

log = logging.getLogger("latchwork.ontology")

LOAD_TASK = "ontology.load"
BROADCAST_TASK = "ontology.broadcast"
#: classes an ontology.load writes per part (a bigger ontology: a checkpoint after each part)
PART = 2000


class BroadcastPayload(BaseModel):
    """``ontology.broadcast`` takes nothing: its inputs are the loads' results."""
    model_config = ConfigDict(extra="forbid")


class LoadPayload(BaseModel):
    ref: str
    checksum: str
    iri: str | None = None


class OntologySync:
    """The master's synchronisation and the loader tasks' access to the source."""

    def __init__(self, location: str | None, store: Store, bus: MessageBus,
                 member_id: str, is_master: Callable[[], bool] | None = None,
                 watch_interval: float = 2.0,
                 submit_flow: Callable[[Flow, str], WorkflowRef] | None = None) -> None:
        self.location = location
        if submit_flow is None:  # no node: into the store, validated by the ontology types
            registry = TaskRegistry()
            register_ontology_tasks(registry)
            submit_flow = functools.partial(flows.submit_flow, store, registry)
        #: how the sync submits its workflow (the node's own: it wakes the scans)
        self.submit_flow = submit_flow
        self.source = open_source(location) if location else None
        self.store = store
        self.bus = bus
        self.member_id = member_id
        self.is_master = is_master
        self.watch_interval = watch_interval
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def synchronize(self, message_id: str = "") -> list[str]:
        """Submit the workflow that loads what the graph lacks (see the module); the ids of
        its new load tasks."""
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
        loads = []
        for entry in [*by_iri.values(), *invalid]:
            if entry.iri is not None:
                record = self.store.ontologies.get(entry.iri)
                if record is not None and record.checksum == entry.checksum:
                    continue
            loads.append((f"ontology:{entry.iri or entry.ref}:{entry.checksum}", entry))
        held = self.store.tasks.with_unique([key for key, _ in loads])
        loads = [(key, entry) for key, entry in loads if key not in held]
        created: list[str] = []
        if loads:
            flow = chord(group([step(LOAD_TASK, {"ref": e.ref, "checksum": e.checksum,
                                                 "iri": e.iri}, unique_key=key, priority=10)
                                for key, e in loads]),
                         then=step(BROADCAST_TASK, {}, priority=10))
            diff = hashlib.sha256("\n".join(sorted(k for k, _ in loads)).encode()).hexdigest()
            ref = self.submit_flow(flow, f"ontology-sync:{diff[:24]}")
            created = list(ref.members[:-1])
        log.info("member %s: model synchronisation (%s): %d source entries, %d new load tasks",
                 self.member_id, message_id or "direct", len(entries), len(created))
        return created

    def load(self, ctx: TaskContext, payload: LoadPayload) -> dict[str, object]:
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
        return {"iri": ontology.iri, "version": ontology.version, "classes_added": added,
                "edges_added": edges}

    def broadcast(self, ctx: TaskContext) -> dict[str, object]:
        """The sync's last step: every node reloads its cache, once for all the loads (their
        results are this step's inputs)."""
        iris = sorted(str(value["iri"]) for _, value in ctx.results()
                      if isinstance(value, dict) and "iri" in value)
        self.bus.broadcast("UPDATE_CACHE", {"ontologies": iris})
        log.info("member %s: %d ontologies loaded: every node reloads its cache",
                 self.member_id, len(iris))
        return {"ontologies": iris}

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


def _load(ctx: TaskContext, payload: LoadPayload) -> dict[str, object]:
    sync = ctx.services.find(OntologySync)
    if sync is None:
        raise SourceError("no ontology synchroniser on this node")
    return sync.load(ctx, payload)


def _broadcast(ctx: TaskContext, payload: BroadcastPayload) -> dict[str, object]:
    sync = ctx.services.find(OntologySync)
    if sync is None:
        raise SourceError("no ontology synchroniser on this node")
    return sync.broadcast(ctx)


def register_ontology_tasks(registry: TaskRegistry) -> None:
    registry.register(LOAD_TASK, _load, LoadPayload,
                      description="load one ontology file into the graph")
    registry.register(BROADCAST_TASK, _broadcast, BroadcastPayload,
                      description="after a sync's loads: every node reloads its ontology "
                                  "cache, once")
