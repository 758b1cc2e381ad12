"""``latchwork ontology sync``: ask the master to synchronise the ontologies."""

from __future__ import annotations

from pathlib import Path

import click

from runner.cli.client import (
    config_option,
    json_option,
    output,
    request,
    timeout_option,
)
from runner.cli.root import cli


@cli.group()
def ontology() -> None:
    """Ontology synchronisation."""


@ontology.command("sync")
@config_option
@json_option
@timeout_option
def ontology_sync(config: Path | None, as_json: bool, timeout: float) -> None:
    """Ask the master to compare the ontology source with the graph and load what changed."""
    output(request(config, "ontology.sync", None, timeout), as_json,
            lambda _: click.echo("synchronisation requested from the master"))


