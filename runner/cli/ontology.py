"""``latchwork ontology``: ask the master to synchronise the ontologies; list and show what
the graph holds. ``sync`` with no ontology source configured exits 1 saying so."""

from __future__ import annotations

from pathlib import Path

import click

from runner.cli.client import (
    call,
    config_option,
    json_option,
    output,
    timeout_option,
)
from runner.cli.root import cli
from runner.requests import OntologyList, OntologyShow, OntologySyncRequest


@cli.group()
def ontology() -> None:
    """Ontologies: synchronise them from the source, list and show what the graph holds."""


@ontology.command("sync")
@config_option
@json_option
@timeout_option
def ontology_sync(config: Path | None, as_json: bool, timeout: float) -> None:
    """Ask the master to compare the ontology source with the graph and load what changed."""
    output(call(config, OntologySyncRequest, timeout), as_json,
            lambda _: click.echo("synchronisation requested from the master"))




@ontology.command("list")
@config_option
@json_option
@timeout_option
def ontology_list(config: Path | None, as_json: bool, timeout: float) -> None:
    """The loaded ontologies: IRI, version, classes, when loaded."""
    from runner.cli.console import render_ontologies

    output(call(config, OntologyList, timeout), as_json, render_ontologies)


@ontology.command("show")
@click.argument("iri")
@click.option("--limit", type=click.IntRange(0), default=50, show_default=True,
              help="classes to print (0: all); --json prints all")
@config_option
@json_option
@timeout_option
def ontology_show(iri: str, limit: int, config: Path | None, as_json: bool,
                  timeout: float) -> None:
    """One ontology's classes with their parents and how many children each has."""
    from runner.cli.console import render_ontology

    output(call(config, OntologyShow, timeout, iri=iri), as_json,
           lambda result: render_ontology(result, limit))
