"""The ontology domain: parse (rdflib), sources (directory, OLS), the node cache, and the
synchronisation that diffs a source against the graph and loads what is missing as tasks."""

from runner.errors import NoOntologySource, OntologyError, SourceError
from runner.ontology.cache import OntologyCache, ReadWriteLock
from runner.ontology.parse import parse_ontology, parse_ontology_bytes
from runner.ontology.sources import (
    DirectorySource,
    OlsSource,
    OntologySource,
    SourceEntry,
    open_source,
)
from runner.ontology.sync import LOAD_TASK, OntologySync, register_ontology_tasks

__all__ = [
    "LOAD_TASK",
    "DirectorySource",
    "NoOntologySource",
    "OlsSource",
    "OntologyCache",
    "OntologyError",
    "OntologySource",
    "OntologySync",
    "ReadWriteLock",
    "SourceEntry",
    "SourceError",
    "open_source",
    "parse_ontology",
    "parse_ontology_bytes",
    "register_ontology_tasks",
]
