"""How the client commands reach the cluster: one request over the API paradigm (any node
answers), the options they share, and the mapping from a reply's stable ``error.code``
(:mod:`runner.errors`) to the exit code, so a renamed class never changes an exit code:

* 2 (usage error): the request was invalid (:data:`USAGE_CODES`);
* 1 with the node's message: :data:`PLAIN_CODES` (a missing task, a busy aspect);
* 1 with "the node answered with an error" for any other code; 1 for no answer in time or no
  broker.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from runner.cli.root import fail
from runner.config import ConfigError, Settings

# ---------------------------------------------------------------------------------------------
# clients: task, cluster, ontology (through the API paradigm: any node answers)

config_option = click.option(
    "--config", "config", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="TOML file with settings; LATCHWORK_AMQP_URL and LATCHWORK_CLUSTER override it")
json_option = click.option("--json", "as_json", is_flag=True, help="print JSON instead of text")
timeout_option = click.option("--timeout", type=click.FloatRange(0.1, 3600), default=10.0,
                              show_default=True, help="seconds to wait for a node's answer")

#: codes that mean "you asked for something invalid" (exit 2): errors of runner.errors and the
#: reasons the messaging layer refuses a request with (dead-lettered, see messaging.paradigms)
USAGE_CODES = {"task_type_unknown", "payload_invalid", "invalid_value", "aspect_unknown",
               "aspect_invalid", "invalid", "unknown-command", "too-large"}
#: codes whose message is the whole story (exit 1 with it alone)
PLAIN_CODES = {"task_not_found", "aspect_busy"}


def request(config: Path | None, command: str, payload: dict[str, object] | None,
             timeout: float) -> object:
    from messaging import (
        ApiClient,
        BrokerUnavailable,
        Connector,
        RemoteError,
        RequestTimeout,
        Topology,
    )

    try:
        settings = Settings.load(config)
    except ConfigError as exc:
        raise fail(str(exc)) from exc
    try:
        with ApiClient(Connector(settings.amqp_url, connect_deadline=min(timeout, 10.0),
                                 name="latchwork cli"),
                       Topology(settings.cluster), sender=operator()) as client:
            return client.request(command, payload, timeout=timeout)
    except RemoteError as exc:
        if exc.code in USAGE_CODES:
            raise click.UsageError(exc.detail) from exc
        if exc.code in PLAIN_CODES:
            raise fail(exc.detail) from exc
        raise fail(f"the node answered with an error: {exc}") from exc
    except (RequestTimeout, BrokerUnavailable) as exc:
        raise fail(str(exc)) from exc


def operator() -> str:
    """Who is asking: the sender of the CLI's requests, named in what they change (e.g. an
    attempt "cancelled by operator alice@host")."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def print_json(value: object) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True))


def output(result: object, as_json: bool, render: Callable[[Any], None]) -> None:
    """``--json`` prints the node's answer as is; otherwise ``render`` shows it."""
    if as_json:
        print_json(result)
    else:
        render(result)


