"""Ontologies and their classes (``subClassOf`` edges), loaded idempotently keyed by IRI,
in chunks that stay under gremlite's recursion limit; fenced by the loading task's token."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gremlin_python.process.graph_traversal import __
from gremlin_python.process.traversal import P

from runner.store import codec
from runner.store.api import Graph
from runner.store.gremlin.guards import under_fence
from runner.store.gremlin.steps import (
    BATCH,
    EDGE_BATCH,
    add_vertex,
    chunks,
    set_props,
)
from runner.store.model import (
    Fence,
    LoadResult,
    Ontology,
    OntologyClass,
    OntologyRecord,
)
from runner.store.traversal import Row, Traversal

# -- ontologies -------------------------------------------------------------------------------

def ontology_from_row(row: Row, classes: int) -> OntologyRecord:
    return OntologyRecord(iri=row["ontology_iri"], version=row["ontology_version"],
                          checksum=row["ontology_checksum"],
                          loaded_at=codec.decode_time(row["ontology_loaded"]),
                          class_count=classes)


class GremlinOntologyStore:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def load(self, ontology: Ontology, fence: Fence | None = None) -> LoadResult:
        """Insert the ontology's classes and subClassOf edges; idempotent.

        Loading the same IRI and checksum again changes nothing. A new checksum updates the
        ontology vertex and adds what is missing. Parents in other ontologies get a class vertex
        without ``class_defined_by`` until their own ontology is loaded. With ``fence`` (a
        task's owner loading it) the whole load is refused with StaleFencingToken, nothing
        written, once the token is no longer the task's.
        """
        return self.graph.write(lambda g: self._load(g, ontology, fence))

    def load_part(self, ontology: Ontology, part: Sequence[OntologyClass],
                  fence: Fence | None = None) -> LoadResult:
        """Insert ``part`` of the ontology's classes (placeholders for parents not there yet)
        and their subClassOf edges, in one write, leaving the ontology vertex alone: a long
        load made of parts, each followed by a checkpoint, ends with :meth:`finish`, which
        marks it loaded. Idempotent; fenced as :meth:`load`."""
        def write(g: Traversal) -> LoadResult:
            if fence is not None:
                return under_fence(g, fence, lambda fenced: self._classes(fenced, ontology.iri,
                                                                          part))
            return self._classes(g, ontology.iri, part)
        return self.graph.write(write)

    def finish(self, ontology: Ontology, fence: Fence | None = None) -> None:
        """Mark a load made of parts done: the ontology vertex with its version and checksum
        (from then on a load of the same checksum changes nothing)."""
        def write(g: Traversal) -> None:
            if fence is not None:
                under_fence(g, fence, lambda fenced: self._meta(fenced, ontology))
            else:
                self._meta(g, ontology)
        self.graph.write(write)

    def _load(self, g: Traversal, onto: Ontology, fence: Fence | None) -> LoadResult:
        if fence is not None:  # every traversal of the load guarded by the fence
            return under_fence(g, fence, lambda fenced: self._load(fenced, onto, None))
        existing = g.V().has("ontology_iri", onto.iri).element_map().to_list()
        if existing and existing[0]["ontology_checksum"] == onto.checksum:
            return LoadResult(onto.iri, 0, 0, changed=False)
        self._meta(g, onto)
        return self._classes(g, onto.iri, onto.classes)

    @staticmethod
    def _meta(g: Traversal, onto: Ontology) -> None:
        meta = {"ontology_version": onto.version, "ontology_checksum": onto.checksum,
                "ontology_loaded": codec.encode_time(codec.now())}
        if g.V().has("ontology_iri", onto.iri).limit(1).id_().to_list():
            set_props(g.V().has("ontology_iri", onto.iri), meta).iterate()
        else:
            add_vertex(g, "ontology", {"ontology_iri": onto.iri, **meta}).iterate()

    def _classes(self, g: Traversal, ontology: str, classes: Sequence[OntologyClass]) -> LoadResult:
        """``classes`` of ``ontology`` (an IRI), their placeholders and edges (see load)."""
        defined = {c.iri: c for c in classes}
        iris = sorted(set(defined) | {p for c in classes for p in c.parents})
        known = self._class_ids(g, iris)
        missing = [iri for iri in iris if iri not in known]
        for chunk in chunks(missing, BATCH):
            t = g
            for iri in chunk:
                cls = defined.get(iri)
                t = add_vertex(t, "class", {
                    "class_iri": iri, "class_label": (cls.label if cls else None) or "",
                    "class_defined_by": ontology if cls else ""})
            t.iterate()
        if missing:
            known.update(self._class_ids(g, missing))
        # claim placeholders created earlier by other ontologies' references
        adopt = [iri for iri in defined if iri not in missing and not known[iri][1]]
        for chunk in chunks(adopt, BATCH):
            t = g
            for iri in chunk:
                t = set_props(t.V(known[iri][0]), {"class_defined_by": ontology,
                                              "class_label": defined[iri].label or ""})
            t.iterate()

        present = self._edges_from(g, sorted(defined))
        wanted = [(c.iri, p) for c in classes for p in c.parents
                  if p not in present.get(c.iri, set())]
        for pairs in chunks(wanted, EDGE_BATCH):
            t = g
            for n, (child, parent) in enumerate(pairs):
                t = (t.V(known[child][0]).as_(f"c{n}").V(known[parent][0]).as_(f"p{n}")
                     .add_e("subClassOf").from_(f"c{n}").to(f"p{n}"))
            t.iterate()
        return LoadResult(ontology, len(missing), len(wanted), changed=True)

    @staticmethod
    def _class_ids(g: Traversal, iris: Sequence[str]) -> dict[str, tuple[Any, str]]:
        found: dict[str, tuple[Any, str]] = {}
        for chunk in chunks(iris, BATCH):
            rows = (g.V().has("class_iri", P.within(list(chunk)))
                    .project("iri", "id", "by").by("class_iri").by(__.id_())
                    .by("class_defined_by").to_list())
            for row in rows:
                found[row["iri"]] = (row["id"], row["by"])
        return found

    @staticmethod
    def _edges_from(g: Traversal, iris: Sequence[str]) -> dict[str, set[str]]:
        edges: dict[str, set[str]] = {}
        for chunk in chunks(iris, BATCH):
            rows = (g.V().has("class_iri", P.within(list(chunk)))
                    .project("c", "ps").by("class_iri")
                    .by(__.out("subClassOf").values("class_iri").fold()).to_list())
            for row in rows:
                edges[row["c"]] = set(row["ps"])
        return edges

    def get(self, iri: str) -> OntologyRecord | None:
        def run(g: Traversal) -> tuple[list[Row], int]:
            rows = g.V().has("ontology_iri", iri).element_map().to_list()
            count = g.V().has("class_defined_by", iri).count().next() if rows else 0
            return rows, count

        rows, count = self.graph.read(run)
        return ontology_from_row(rows[0], count) if rows else None

    def all(self) -> list[OntologyRecord]:
        def run(g: Traversal) -> list[OntologyRecord]:
            rows = g.V().has_label("ontology").element_map().to_list()
            return [ontology_from_row(r, g.V().has("class_defined_by", r["ontology_iri"]).count()
                              .next()) for r in rows]

        return sorted(self.graph.read(run), key=lambda o: o.iri)

    def classes(self, iri: str) -> list[OntologyClass]:
        """The classes ``iri`` defines, with their labels and parents, sorted by IRI."""
        def run(g: Traversal) -> list[Row]:
            return g.V().has("class_defined_by", iri).project("c", "l", "ps") \
                .by("class_iri").by("class_label") \
                .by(__.out("subClassOf").values("class_iri").fold()).to_list()

        rows = self.graph.read(run)
        return sorted((OntologyClass(r["c"], r["l"] or None, tuple(sorted(r["ps"])))
                       for r in rows), key=lambda c: c.iri)

    def ancestors(self, class_iri: str) -> set[str]:
        """Every class reachable over subClassOf (not the class itself), cycle-safe."""
        def run(g: Traversal) -> set[str]:
            seen: set[str] = set()
            frontier = [class_iri]
            while frontier:
                parents: set[str] = set()
                for chunk in chunks(frontier, BATCH):
                    parents.update(g.V().has("class_iri", P.within(list(chunk)))
                                   .out("subClassOf").values("class_iri").to_list())
                frontier = sorted(parents - seen - {class_iri})
                seen.update(frontier)
            return seen

        return self.graph.read(run)

    def subclass_edges(self) -> list[tuple[str, str]]:
        rows = self.graph.read(
            lambda g: g.E().has_label("subClassOf").project("c", "p")
            .by(__.out_v().values("class_iri")).by(__.in_v().values("class_iri")).to_list())
        return sorted((r["c"], r["p"]) for r in rows)


