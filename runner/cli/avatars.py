"""``latchwork avatars``: import and export avatars as Parquet, against the local graph
store named by the settings. A malformed file exits 2 and writes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from runner.cli.client import (
    config_option,
)
from runner.cli.root import cli, fail
from runner.config import Settings
from runner.errors import ConfigError


@cli.group()
def avatars() -> None:
    """Avatars between the graph (the node configuration's `graph`) and Parquet files."""


def _local_store(config: Path | None) -> Any:
    from runner.connect import graph_store
    try:
        settings = Settings.load(config)
    except ConfigError as exc:
        raise fail(str(exc)) from exc
    return graph_store(settings)


@avatars.command("import")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@config_option
def avatars_import(path: Path, config: Path | None) -> None:
    """Upsert the avatars of a Parquet file (columns id, class_iri, properties as JSON).

    The whole file is validated first; a malformed row exits 2 and writes nothing."""
    from runner.errors import InvalidAvatars
    from runner.pipeline import extra
    if (why := extra.needs("avatars import")) is not None:
        raise fail(why, 2)
    from runner.pipeline.avatars_io import import_avatars
    store = _local_store(config)
    try:
        count = import_avatars(store, path)
    except InvalidAvatars as exc:
        raise click.UsageError(str(exc)) from exc
    finally:
        store.close()
    click.echo(f"imported {count} avatars from {path}")


@avatars.command("export")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--class", "classes", multiple=True, help="only avatars of this class IRI "
                                                        "(repeatable)")
@config_option
def avatars_export(path: Path, classes: tuple[str, ...], config: Path | None) -> None:
    """Write avatars with their aspects to a Parquet file (atomically replaced)."""
    from runner.pipeline import extra
    if (why := extra.needs("avatars export")) is not None:
        raise fail(why, 2)
    from runner.pipeline.avatars_io import export_avatars
    store = _local_store(config)
    try:
        count = export_avatars(store, path, list(classes) or None)
    finally:
        store.close()
    click.echo(f"exported {count} avatars to {path}")


