"""``latchwork dlq``: the dead-letter queue: list and show rejected messages with their reason,
replay one to the queue it came from (same message id, so a message that was in fact handled is
recognised and acked as a duplicate). Reads RabbitMQ directly: no node needs to run."""

from __future__ import annotations

from pathlib import Path

import click

from runner.cli.client import config_option, connect, json_option, output, timeout_option
from runner.cli.root import cli


@cli.group()
def dlq() -> None:
    """The dead-letter queue: what was rejected, why, and replaying it."""


@dlq.command("list")
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True,
              help="messages to read (oldest first); the queue is left as it was")
@config_option
@json_option
@timeout_option
def dlq_list(limit: int, config: Path | None, as_json: bool, timeout: float) -> None:
    """Dead-lettered messages: id, command, reason, where from, when."""
    from runner.cli.console import render_dead_letters

    with connect(config, timeout) as client:
        letters = [letter.view() for letter in client.dead_letters(limit)]
    output(letters, as_json, render_dead_letters)


@dlq.command("show")
@click.argument("message_id")
@config_option
@json_option
@timeout_option
def dlq_show(message_id: str, config: Path | None, as_json: bool, timeout: float) -> None:
    """One dead-lettered message with its reason, detail and body."""
    from runner.cli.console import render_dead_letter

    with connect(config, timeout) as client:
        letter = client.dead_letter(message_id).view()
    output(letter, as_json, render_dead_letter)


@dlq.command("replay")
@click.argument("message_id")
@config_option
@timeout_option
def dlq_replay(message_id: str, config: Path | None, timeout: float) -> None:
    """Send a dead-lettered message back to the queue it came from, with the same id."""
    with connect(config, timeout) as client:
        letter = client.replay(message_id)
    click.echo(f"replayed {message_id} ({letter.command or 'undecodable'}) to {letter.queue}")
