"""How the client commands reach the cluster: through :class:`runner.client.Client` (one request
over the API paradigm, any node answers), the options they share, and the mapping from a reply's
stable ``error.code`` (:mod:`runner.errors`) to the exit code, so a renamed class never changes
an exit code:

* 2 (usage error): the request was invalid (the node's error declares itself ``refused``:
  :class:`~runner.client.RequestRefused`);
* 1 with the node's message: any other declared error (:mod:`runner.errors`: a missing task, a
  busy aspect, an unreachable graph; a missing dead letter);
* 1 with "the node answered with an error" for an error nobody declared (a bug on the node:
  ``internal_error``); 1 for no answer in time or no broker.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click
from pydantic import BaseModel, JsonValue, ValidationError
from pydantic_core import to_jsonable_python

from messaging import EnvelopeError, parse_json, summary
from messaging.errors import INTERNAL_ERROR
from runner.cli.root import fail
from runner.client import Client, build
from runner.config import Settings
from runner.errors import ClientError, ConfigError, RequestFailed, RequestRefused
from runner.requests import Request

M = TypeVar("M", bound=BaseModel)
R = TypeVar("R")

# ---------------------------------------------------------------------------------------------
# clients: task, cluster, ontology (through the API paradigm: any node answers)

config_option = click.option(
    "--config", "config", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="TOML file with settings; LATCHWORK_AMQP_URL and LATCHWORK_CLUSTER override it")
json_option = click.option("--json", "as_json", is_flag=True, help="print JSON instead of text")
timeout_option = click.option("--timeout", type=click.FloatRange(0.1, 3600), default=10.0,
                              show_default=True, help="seconds to wait for a node's answer")



@contextmanager
def connect(config: Path | None, timeout: float) -> Iterator[Client]:
    """A :class:`~runner.client.Client` of the configured cluster, with its errors turned into
    the CLI's exits: a refused request (``RequestRefused``) exits 2, an error of the catalogue
    exits 1 with the node's message, any other error 1 saying the node failed."""
    try:
        settings = Settings.load(config)
    except ConfigError as exc:
        raise fail(str(exc)) from exc
    try:
        with Client.from_settings(settings, timeout=timeout, name="latchwork cli") as client:
            yield client
    except RequestRefused as exc:
        raise fail(exc.detail, 2) from exc  # one line: the node said what is wrong
    except RequestFailed as exc:
        if exc.code != INTERNAL_ERROR:  # a declared error: its message is the whole story
            raise fail(exc.detail) from exc
        raise fail(f"the node answered with an error: {exc.code}: {exc.detail}") from exc
    except ClientError as exc:
        raise fail(str(exc)) from exc


def call(config: Path | None, model: type[Request[R]], timeout: float,
         **fields: object) -> JsonValue:
    """One request of the API's contract through the client (:meth:`Client.send`, the
    request built by :func:`~runner.client.build`): its reply as JSON (what ``--json``
    prints, and what the renderers read)."""
    with connect(config, timeout) as client:
        reply = client.send(build(model, **fields))
    answer: JsonValue = model.reply_adapter().dump_python(reply, mode="json")
    return answer


def print_json(value: object) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True))


def output(result: object, as_json: bool, render: Callable[[Any], None]) -> None:
    """``--json`` prints the node's answer as JSON (a reply model as the node sent it);
    otherwise ``render`` shows that JSON."""
    data = to_jsonable_python(result)
    if as_json:
        print_json(data)
    else:
        render(data)


def from_options(model: type[M], fields_of: Mapping[str, str],
                 options: Mapping[str, Any]) -> M:
    """The request model a command's options describe: ``fields_of`` maps each option to the
    model's field it fills (an option not given is left to the model's default), a
    ``payload`` is parsed from its JSON text here, and every rule is the model's (the node
    checks the same one again: no rule lives in the CLI). A refusal is a usage error (exit 2)
    naming the options at fault."""
    fields: dict[str, Any] = {field: list(value) if isinstance(value, tuple) else value
                              for option, field in fields_of.items()
                              if (value := options.get(option)) is not None and value != ()}
    if "payload" in fields:
        try:
            fields["payload"] = parse_json(fields["payload"])
        except EnvelopeError as exc:
            raise click.BadParameter(str(exc), param_hint="--payload") from exc
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        option_of = {field: option for option, field in fields_of.items()}
        where = [str(e["loc"][0]) for e in exc.errors() if e["loc"]]
        hint = ", ".join(f"--{option_of.get(w, w).replace('_', '-')}" for w in where)
        raise click.BadParameter(summary(exc).replace("Value error, ", ""),
                                 param_hint=hint or None) from exc
