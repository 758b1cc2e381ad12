"""``latchwork stream``: start a concurrent exactly-once stream as N copy tasks on N nodes, look
at its state (phase, input positions, output end) and its running copies, feed its input queues
(``push``) and read any queue: inputs, outputs and dead letters (``read``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from messaging import EnvelopeError, parse_json
from runner.cli.client import (
    call,
    config_option,
    connect,
    json_option,
    output,
    timeout_option,
)
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


def _values(value: tuple[str, ...], file: Path | None) -> list[Any]:
    texts = list(value)
    if file is not None:
        texts += [line for line in file.read_text().splitlines() if line.strip()]
    if not texts:
        raise click.UsageError("give --value JSON (repeatable) or --file PATH (JSON Lines)")
    values = []
    for number, text in enumerate(texts, 1):
        try:
            values.append(parse_json(text))
        except EnvelopeError as exc:
            raise click.BadParameter(f"value {number} is not JSON: {exc}: {text[:80]!r}") \
                from exc
    return values


@stream.command("push")
@click.argument("queue")
@click.option("--value", "value", multiple=True, help="a JSON value (repeatable)")
@click.option("--file", "file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="a file of JSON values, one per line (JSON Lines)")
@click.option("--raw", is_flag=True, help="store each value (a JSON string) as its own text "
                                          "instead of as JSON")
@click.option("--token", default=None,
              help="the push's idempotency token: sent again with it, nothing more is pushed")
@config_option
@json_option
@timeout_option
def stream_push(queue: str, value: tuple[str, ...], file: Path | None, raw: bool,
                token: str | None, config: Path | None, as_json: bool, timeout: float) -> None:
    """Append values to QUEUE (a stream's input) in one step; prints their indexes."""
    values = _values(value, file)
    with connect(config, timeout) as client:
        indexes = client.stream_push(queue, values, token=token, raw=raw)
    output({"queue": queue, "indexes": indexes}, as_json,
           lambda r: click.echo(f"pushed {len(indexes)} to {queue} at "
                                f"{indexes[0]}..{indexes[-1]}"))


def _element(element: dict[str, Any]) -> str:
    for key in ("value", "text", "base64"):
        if key in element:
            shown = json.dumps(element[key]) if key == "value" else element[key]
            return f"{element['index']}\t{shown}" + ("" if key != "base64" else " (base64)")
    return f"{element['index']}"


@stream.command("read")
@click.argument("queue")
@click.option("--from", "start", type=click.IntRange(0), default=0, show_default=True,
              help="the first index to read")
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True,
              help="elements per request")
@click.option("--follow", is_flag=True, help="keep reading as elements arrive (Ctrl-C stops)")
@config_option
@json_option
@timeout_option
def stream_read(queue: str, start: int, limit: int, follow: bool, config: Path | None,
                as_json: bool, timeout: float) -> None:
    """Print QUEUE's elements from --from: an input, an output or a dead-letter queue
    (``<stream>.dead``), one per line: index, then the value."""
    with connect(config, timeout) as client:
        while True:
            page = client.stream_read(queue, start, limit)
            for element in page.elements:
                shown = element.model_dump(mode="json")
                if as_json:
                    click.echo(json.dumps(shown, sort_keys=True))
                else:
                    click.echo(_element(shown))
            start = page.next
            if len(page.elements) == limit:
                continue
            if not follow:
                return
            time.sleep(0.5)
