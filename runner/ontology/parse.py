"""Reading ontology files (OWL / Turtle / RDF-XML) with rdflib into the store's model.

``parse_ontology(path)`` returns an :class:`~runner.store.Ontology`: the ontology IRI (the
subject typed ``owl:Ontology``), its version (``owl:versionInfo``, else ``owl:versionIRI``, else
empty), a SHA-256 checksum of the file bytes (the change-detection key), and every named class
(typed ``owl:Class`` or ``rdfs:Class``, or the subject of an ``rdfs:subClassOf``) with its label
and named parents. Blank-node parents (OWL restrictions) are not classes and are skipped.

A file rdflib cannot parse, or one without an ``owl:Ontology``, raises :class:`OntologyError`
with the parser's message.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from rdflib import OWL, RDF, RDFS, Graph, Literal, URIRef

from runner.errors import OntologyError
from runner.store.model import Ontology, OntologyClass

FORMATS = {".ttl": "turtle", ".owl": "xml", ".rdf": "xml", ".xml": "xml", ".nt": "nt",
           ".n3": "n3", ".jsonld": "json-ld"}


def checksum_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def format_of(name: str) -> str:
    return FORMATS.get(Path(name).suffix.lower(), "turtle")


def parse_ontology(path: str | Path, fmt: str | None = None) -> Ontology:
    path = Path(path)
    return parse_ontology_bytes(path.read_bytes(), path.name, fmt)


def parse_ontology_bytes(data: bytes, name: str, fmt: str | None = None) -> Ontology:
    """Parse ``data`` (``name`` picks the format from its suffix unless ``fmt`` is given)."""
    graph = Graph()
    try:
        graph.parse(data=data, format=fmt or format_of(name))
    except Exception as exc:  # rdflib raises many unrelated types for bad syntax
        raise OntologyError(f"{name}: cannot parse: {exc}") from exc
    ontologies = sorted(str(s) for s in graph.subjects(RDF.type, OWL.Ontology)
                        if isinstance(s, URIRef))
    if not ontologies:
        raise OntologyError(f"{name}: no owl:Ontology declared")
    iri = ontologies[0]
    node = URIRef(iri)
    version = next((str(v) for v in graph.objects(node, OWL.versionInfo)), "") or next(
        (str(v) for v in graph.objects(node, OWL.versionIRI)), "")
    names: set[URIRef] = set()
    for kind in (OWL.Class, RDFS.Class):
        names.update(s for s in graph.subjects(RDF.type, kind) if isinstance(s, URIRef))
    names.update(s for s in graph.subjects(RDFS.subClassOf, None) if isinstance(s, URIRef))
    classes = []
    for cls in sorted(names):
        parents = sorted(str(p) for p in graph.objects(cls, RDFS.subClassOf)
                         if isinstance(p, URIRef) and p != cls)
        label = next((str(lbl) for lbl in graph.objects(cls, RDFS.label)
                      if isinstance(lbl, Literal)), None)
        classes.append(OntologyClass(str(cls), label, tuple(parents)))
    if not classes:
        raise OntologyError(f"{name}: ontology {iri} declares no classes")
    return Ontology(iri=iri, version=version, checksum=checksum_of(data),
                    classes=tuple(classes))
