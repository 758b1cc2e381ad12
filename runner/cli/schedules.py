"""``latchwork schedule``: recurring schedules the master fires, one task per fire."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click

from runner.cli.client import (
    call,
    config_option,
    connect,
    from_options,
    json_option,
    output,
    timeout_option,
)
from runner.cli.root import cli
from runner.errors import InvalidSchedule
from runner.requests import ScheduleList, SchedulePause, ScheduleRemove, ScheduleSpec

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_every(text: str) -> float:
    """``30s``, ``5m``, ``1.5h``, ``2d``, ``250ms`` or plain seconds."""
    match = _DURATION.match(text)
    if not match:
        raise InvalidSchedule(f"not a duration: {text!r} (e.g. 30s, 5m, 1h)")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds <= 0:
        raise InvalidSchedule(f"the interval must be positive, not {text!r}")
    return seconds


@cli.group()
def schedule() -> None:
    """Recurring schedules: the master creates one task per fire, exactly once across master
    failovers (docs/runner.md)."""


@schedule.command("add")
@click.argument("name")
@click.option("--cron", default=None, metavar="EXPR",
              help='a crontab expression in UTC, e.g. "*/5 * * * *"')
@click.option("--every", default=None, metavar="DURATION",
              help="an interval: 30s, 5m, 1h, 2d or seconds")
@click.option("--type", "task_type", required=True, help="the task type each fire creates")
@click.option("--payload", default="{}", show_default=True, help="the tasks' payload (JSON)")
@click.option("--priority", type=int, default=None, help="the tasks' priority")
@click.option("--ordering-key", default=None, help="the tasks' ordering key")
@click.option("--resource", "resources", multiple=True, help="a resource the tasks hold")
@click.option("--misfire", type=click.Choice(["run_once", "skip"]), default="run_once",
              show_default=True,
              help="fires missed while no master existed: run the latest once, or skip them")
@config_option
@json_option
@timeout_option
def schedule_add(name: str, config: Path | None, as_json: bool, timeout: float,
                 **options: Any) -> None:
    """Add schedule NAME: every fire of --cron or --every creates a task of --type."""
    spec = scheduled(options)
    with connect(config, timeout) as client:
        added = client.schedule_add(name, spec)
    output(added, as_json, lambda s: click.echo(f"schedule {s['name']} added; next fire "
                                                f"{s['next_fire']}"))


#: ``schedule add``'s options, each the :class:`~runner.requests.ScheduleSpec` field it fills
#: (a test checks that every field has its option)
SCHEDULE_OPTIONS = {"cron": "cron", "every": "every", "task_type": "type",
                    "payload": "payload", "priority": "priority",
                    "ordering_key": "ordering_key", "resources": "resources",
                    "misfire": "misfire"}


def scheduled(options: dict[str, Any]) -> ScheduleSpec:
    """The schedule ``schedule add``'s options describe: the interval's text parsed here
    (30s, 5m...), every rule the model's (:func:`~runner.cli.client.from_options`)."""
    if options.get("every") is not None:
        try:
            options = {**options, "every": parse_every(options["every"])}
        except InvalidSchedule as exc:
            raise click.BadParameter(str(exc), param_hint="--every") from exc
    return from_options(ScheduleSpec, SCHEDULE_OPTIONS, options)


def _render(schedules: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{len(schedules)} schedule(s)")
    for column in ("name", "when", "type", "state", "last fire", "next fire", "misfire"):
        table.add_column(column)
    for s in schedules:
        when = s["cron"] if s.get("cron") else f"every {s['every']:g}s"
        table.add_row(s["name"], when, s["type"], "paused" if s["paused"] else "active",
                      s["last_fire"] or "-", s["next_fire"] or "-", s["misfire"])
    Console().print(table)


@schedule.command("list")
@config_option
@json_option
@timeout_option
def schedule_list(config: Path | None, as_json: bool, timeout: float) -> None:
    """Every schedule with its last and next fire."""
    output(call(config, ScheduleList, timeout), as_json, _render)


@schedule.command("remove")
@click.argument("name")
@config_option
@timeout_option
def schedule_remove(name: str, config: Path | None, timeout: float) -> None:
    """Remove schedule NAME (the tasks it created stay; those made ahead that have not
    started are stopped, with the reason "schedule NAME removed")."""
    call(config, ScheduleRemove, timeout, name=name)
    click.echo(f"schedule {name} removed")


@schedule.command("pause")
@click.argument("name")
@click.option("--resume", is_flag=True, help="resume it instead (from now on)")
@config_option
@timeout_option
def schedule_pause(name: str, resume: bool, config: Path | None, timeout: float) -> None:
    """Pause schedule NAME: no fires until it is resumed (fires while paused are not made
    up). Fires already made ahead (up to 5 s) that have not started are stopped too, with the
    reason "schedule NAME paused" (task show prints it); one that started runs to its end."""
    call(config, SchedulePause, timeout, name=name, paused=not resume)
    click.echo(f"schedule {name} {'resumed' if resume else 'paused'}")
