"""``latchwork command`` and ``latchwork broadcast``: send your own master-only commands (and
wait for the master's answer) and broadcasts, and list what the live nodes declare.

Exit codes: 0 answered (or queued, without ``--wait``); 2 refused (an unknown command, a payload
that does not validate: the master dead-lettered it) or a bad ``--payload``; 1 the handler
failed (out of retries), no answer within ``--wait`` (the command stays queued: a master will
still run it), or no broker.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from messaging import EnvelopeError, parse_json
from runner.cli.client import config_option, connect, json_option, output, timeout_option
from runner.cli.root import cli


def _payload(text: str) -> dict[str, Any]:
    try:
        value = parse_json(text)
    except EnvelopeError as exc:
        raise click.BadParameter(str(exc), param_hint="--payload") from exc
    if not isinstance(value, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--payload")
    return value


payload_option = click.option("--payload", "payload", default="{}", show_default=True,
                              help="the payload, a JSON object")


@cli.group("command")
def command_group() -> None:
    """Your own master-only commands (@command): send one, wait for its answer, list them."""


@command_group.command("send")
@click.argument("name")
@payload_option
@click.option("--id", "message_id", default=None,
              help="the command's id (a UUID), its idempotency key: sent again with the same "
                   "id it runs once, and every sender waiting gets its answer")
@click.option("--wait", type=click.FloatRange(0, 86400), default=None,
              help="seconds to wait for the master's answer (default: return once the broker "
                   "has the command)")
@config_option
@json_option
@timeout_option
def command_send(name: str, payload: str, message_id: str | None, wait: float | None,
                 config: Path | None, as_json: bool, timeout: float) -> None:
    """Send the MASTER command NAME; only the master runs it, once."""
    body = _payload(payload)
    with connect(config, max(timeout, wait or 0)) as client:
        answer = client.command(name, body, id=message_id, wait=wait)
    if wait is None:
        output({"queued": name}, as_json, lambda r: click.echo(f"command {name} queued"))
    else:
        output(answer, as_json, lambda r: click.echo(json.dumps(r, sort_keys=True)))


def _render_list(declared: list[dict[str, Any]]) -> None:
    for entry in declared:
        builtin = " (built-in)" if entry.get("builtin") else ""
        catch_up = ", catch-up on reconnect" if entry.get("on_reconnect") else ""
        click.echo(f"{entry['kind']:<9} {entry['name']}{builtin}{catch_up}")
        if entry.get("description"):
            click.echo(f"          {entry['description']}")
        properties = entry.get("payload_schema", {}).get("properties", {})
        if properties:
            fields = ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in properties.items())
            click.echo(f"          payload {{{fields}}}")
        click.echo(f"          on {len(entry['members'])} member(s)")


@command_group.command("list")
@config_option
@json_option
@timeout_option
def command_list(config: Path | None, as_json: bool, timeout: float) -> None:
    """Every command and broadcast the live nodes declare, with their payload schemas."""
    with connect(config, timeout) as client:
        declared = client.commands()
    output(declared, as_json, _render_list)


@cli.group("broadcast")
def broadcast_group() -> None:
    """Your own broadcasts (@broadcast): run on every connected node."""


@broadcast_group.command("send")
@click.argument("name")
@payload_option
@config_option
@json_option
@timeout_option
def broadcast_send(name: str, payload: str, config: Path | None, as_json: bool,
                   timeout: float) -> None:
    """Send the broadcast NAME to every node connected now."""
    body = _payload(payload)
    with connect(config, timeout) as client:
        message_id = client.broadcast(name, body)
    output({"sent": name, "id": message_id}, as_json,
           lambda r: click.echo(f"broadcast {name} sent ({message_id})"))
