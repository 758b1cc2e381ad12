"""``latchwork workflow``: show a workflow's members and their states, cancel what is left."""

from __future__ import annotations

from pathlib import Path

import click

from runner.cli.client import config_option, connect, json_option, output, timeout_option
from runner.cli.root import cli


@cli.group()
def workflow() -> None:
    """Follow and stop workflows (submitted with Client.submit_workflow)."""


@workflow.command("show")
@click.argument("workflow_id")
@config_option
@json_option
@timeout_option
def workflow_show(workflow_id: str, config: Path | None, as_json: bool, timeout: float) -> None:
    """A workflow and its members as a tree: each member's state (blocked: waiting for one
    that failed or was cancelled, with its error), attempts and error."""
    from runner.cli.console import render_workflow

    with connect(config, timeout) as client:
        report = client.workflow(workflow_id)
    output(report.model_dump(mode="json"), as_json, render_workflow)


@workflow.command("cancel")
@click.argument("workflow_id")
@click.option("--reason", default=None, help="recorded on each cancelled attempt")
@config_option
@timeout_option
def workflow_cancel(workflow_id: str, reason: str | None, config: Path | None,
                    timeout: float) -> None:
    """Cancel every unfinished member of a workflow (running ones are stopped as with
    `task cancel`); what succeeded stays."""
    with connect(config, timeout) as client:
        done = client.cancel_workflow(workflow_id, reason=reason)
    click.echo(f"workflow {workflow_id}: {len(done.cancelled)} members cancelled")
