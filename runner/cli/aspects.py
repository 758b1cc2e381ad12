"""``latchwork aspect``: create, delete, show and list aspects; ``--wait`` follows a
creation or deletion with a progress bar until it ends (exit 1 if it fails)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

import click

from runner.cli.client import (
    call,
    config_option,
    json_option,
    output,
    timeout_option,
)
from runner.cli.root import cli, fail
from runner.requests import AspectCreate, AspectDelete, AspectGet, AspectList


@cli.group()
def aspect() -> None:
    """Aspects on avatars: create (simple at once, heavy through a Spark pipeline task),
    delete, and show their state and progress."""


def _wait_aspect(name: str, config: Path | None, timeout: float, done: set[str]) -> dict[str, Any]:
    """Poll ``aspect.get`` with a rich progress bar until the state is one of ``done``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[rate]}")) as bar:
        job = bar.add_task(f"aspect {name}", total=None, rate="")
        while True:
            result = cast(dict[str, Any], call(config, AspectGet, timeout, name=name))
            p = result.get("progress") or {}
            bar.update(job, total=p.get("batches_total"), completed=p.get("batches_done", 0),
                       description=f"aspect {name} {result['state']}",
                       rate=f"{p.get('rows_per_s', 0):,.0f} rows/s" if p else "")
            if result["state"] in done:
                return result
            task = result.get("task") or {}
            if task and not task.get("active", True):
                return result  # the task stopped with an error: report it
            time.sleep(0.5)


def _aspect_outcome(result: dict[str, Any], as_json: bool, want: str) -> None:
    from runner.cli.console import render_aspect
    output(result, as_json, render_aspect)
    if result["state"] != want:
        raise fail(f"aspect {result['name']} is {result['state']}"
                    + (f": {result['error']}" if result.get("error") else ""))


@aspect.command("create")
@click.argument("name")
@click.option("--wait", is_flag=True, help="follow the creation with a progress bar until it "
                                           "is READY (exit 1 if it fails)")
@click.option("--batch-rows", type=click.IntRange(1), default=None,
              help="avatars per batch (default: the node's batch_rows)")
@click.option("--pause", type=click.FloatRange(0, 3600), default=0.0, hidden=True,
              help="seconds each batch waits before committing (throttling, tests)")
@config_option
@json_option
@timeout_option
def aspect_create(name: str, wait: bool, batch_rows: int | None, pause: float,
                  config: Path | None, as_json: bool, timeout: float) -> None:
    """Create aspect NAME on every eligible avatar (the same request twice: one task)."""
    from runner.cli.console import render_aspect
    result = cast(dict[str, Any], call(config, AspectCreate, timeout, name=name,
                                       batch_rows=batch_rows, pause=pause))
    if not wait:
        output(result, as_json, render_aspect)
        return
    _aspect_outcome(_wait_aspect(name, config, timeout, {"READY", "FAILED"}), as_json, "READY")


@aspect.command("delete")
@click.argument("name")
@click.option("--wait", is_flag=True, help="wait until the aspect is removed everywhere")
@config_option
@json_option
@timeout_option
def aspect_delete(name: str, wait: bool, config: Path | None, as_json: bool,
                  timeout: float) -> None:
    """Remove aspect NAME from every avatar (through a task)."""
    from runner.cli.console import render_aspect
    result = cast(dict[str, Any], call(config, AspectDelete, timeout, name=name))
    if not wait:
        output(result, as_json, render_aspect)
        return
    _aspect_outcome(_wait_aspect(name, config, timeout, {"DELETED", "ABSENT", "FAILED"}),
                    as_json, "DELETED")


@aspect.command("show")
@click.argument("name")
@config_option
@json_option
@timeout_option
def aspect_show(name: str, config: Path | None, as_json: bool, timeout: float) -> None:
    """State, task and progress of aspect NAME."""
    from runner.cli.console import render_aspect
    output(call(config, AspectGet, timeout, name=name), as_json, render_aspect)


@aspect.command("list")
@config_option
@json_option
@timeout_option
def aspect_list(config: Path | None, as_json: bool, timeout: float) -> None:
    """Every defined aspect with its state."""
    from runner.cli.console import render_aspect_list
    output(call(config, AspectList, timeout), as_json, render_aspect_list)


