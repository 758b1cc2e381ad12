"""``latchwork stream``: start a concurrent exactly-once stream as N copy tasks on N nodes, and
look at its state (phase, input positions, output end) and its running copies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from runner.cli.client import call, config_option, json_option, output, timeout_option
from runner.cli.root import cli
from runner.requests import StreamStart, StreamStatus


@cli.group()
def stream() -> None:
    """Concurrent exactly-once streams (docs/streams.md)."""


@stream.command("start")
@click.argument("name")
@click.option("--redundancy", type=click.IntRange(1, 16), default=2, show_default=True,
              help="copies to run at once, on as many distinct nodes")
@config_option
@json_option
@timeout_option
def stream_start(name: str, redundancy: int, config: Path | None, as_json: bool,
                 timeout: float) -> None:
    """Start stream NAME (idempotent: its copy tasks are created once)."""
    result = call(config, StreamStart, timeout, name=name, redundancy=redundancy)
    output(result, as_json,
           lambda r: click.echo(f"stream {name}: copy tasks {', '.join(r['copies'])}"))


def _render(status: dict[str, Any]) -> None:
    state = status["state"] or {}
    click.echo(f"stream {status['stream']}: {state.get('phase', 'not started')}, "
               f"inputs {state.get('positions', {})}, output end {state.get('out_next', 0)}, "
               f"dead letters {state.get('dead_next', 0)} (queue {status['stream']}.dead)")
    for member, copy in sorted(status["copies"].items(), key=lambda kv: kv[1]):
        click.echo(f"  copy {copy} on {member}")


@stream.command("status")
@click.argument("name")
@config_option
@json_option
@timeout_option
def stream_status(name: str, config: Path | None, as_json: bool, timeout: float) -> None:
    """The stream's phase, input positions, output end and running copies."""
    output(call(config, StreamStatus, timeout, name=name), as_json, _render)
