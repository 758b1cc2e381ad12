"""``latchwork task``: submit, list, show, result, deactivate, cancel, reactivate, skip,
types."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TextIO

import click

from messaging import EnvelopeError, parse_json
from runner.cli.client import (
    call,
    config_option,
    connect,
    from_options,
    json_option,
    output,
    print_json,
    timeout_option,
)
from runner.cli.root import cli
from runner.replies import Cancelled
from runner.requests import TaskCheckpoint, TaskGet, TaskTemplate


@cli.group()
def task() -> None:
    """Submit, list, inspect, stop and restart tasks (through any running node)."""


@task.command("submit")
@click.argument("task_type", metavar="TYPE", required=False)
@click.option("--file", "from_file", type=click.File("r"), default=None,
              help="submit every task of a JSON Lines file instead (- for stdin): one object "
                   'per line with the same fields, {"type": ..., "payload": ..., "priority": '
                   '..., "unique_key": ..., "run_at": ..., "delay": ..., "ordering_key": ..., '
                   '"resources": [...], "timeout": ...}, sent in pages of 500 (one request and '
                   "one store write each); prints the ids in order")
@click.option("--payload", default="{}", show_default=True,
              help='the task payload as a JSON object, e.g. \'{"seconds": 5}\'')
@click.option("--priority", type=int, default=None,
              help="higher runs first, -1000000 to 1000000 (default: the type's own, see "
                   "`latchwork task types`)")
@click.option("--unique-key", default=None,
              help="submitting again with the same key returns the existing task")
@click.option("--run-at", default=None, metavar="TIME",
              help="not started before TIME: ISO 8601 with a zone, e.g. "
                   "2026-11-23T08:00:00+00:00, at most 10 years ahead")
@click.option("--delay", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="not started before SECONDS from now (at most 10 years)")
@click.option("--ordering-key", default=None, metavar="KEY",
              help="tasks with the same key run one at a time, in submission order")
@click.option("--resource", "resources", multiple=True, metavar="NAME",
              help="a resource the task holds while it runs, taken all-or-nothing with the "
                   "others (repeat for more), e.g. --resource ontology:brick")
@click.option("--time-limit", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="SECONDS", help="an attempt may run this long (at most 366 days), then it "
              "is cancelled and ends TIMED_OUT (the type's own timeout, when it has one, caps "
              "it)")
@config_option
@json_option
@timeout_option
def task_submit(task_type: str | None, from_file: TextIO | None, config: Path | None,
                as_json: bool, timeout: float, **fields: Any) -> None:
    """Submit a task of TYPE (or every task of --file); prints its id. `latchwork task types`
    lists the types the nodes know (built-in ones, and yours loaded with `node start
    --tasks`)."""
    if from_file is not None:
        if task_type is not None:
            raise click.UsageError("give TYPE or --file, not both")
        _submit_file(from_file, config, as_json, timeout)
        return
    if task_type is None:
        raise click.UsageError("give the TYPE of the task to submit, or --file")
    template = submitted(task_type, fields)
    with connect(config, timeout) as client:
        task = client.submit(template.type, **template.model_dump(exclude={"type"}))
    if as_json:
        print_json(task.model_dump(mode="json"))
    else:
        click.echo(task.id)


#: ``task submit``'s options, each the :class:`~runner.requests.TaskTemplate` field it fills
#: (a test checks that every field but ``type``, the argument, has its option)
SUBMIT_OPTIONS = {"payload": "payload", "priority": "priority", "unique_key": "unique_key",
                  "run_at": "run_at", "delay": "delay", "ordering_key": "ordering_key",
                  "resources": "resources", "time_limit": "timeout"}


def submitted(task_type: str, options: dict[str, Any]) -> TaskTemplate:
    """The task ``task submit``'s options describe (:func:`~runner.cli.client.from_options`:
    every rule the model's)."""
    return from_options(TaskTemplate, {"task_type": "type", **SUBMIT_OPTIONS},
                        {**options, "task_type": task_type})


def _submit_file(lines: TextIO, config: Path | None, as_json: bool, timeout: float) -> None:
    """``task submit --file``: every line a task; a line that is not a JSON object stops it
    before anything is sent (exit 2, naming the line)."""
    items = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            item = parse_json(line)
        except EnvelopeError as exc:
            raise click.BadParameter(f"line {number}: {exc}", param_hint="--file") from exc
        if not isinstance(item, dict):
            raise click.BadParameter(f"line {number}: must be a JSON object",
                                     param_hint="--file")
        items.append(item)
    with connect(config, timeout) as client:
        ids = client.submit_many(items)
    if as_json:
        print_json(ids)
    else:
        for task_id in ids:
            click.echo(task_id)


@task.command("list")
@click.option("--unfinished", is_flag=True, help="only active, unfinished tasks")
@click.option("--type", "task_type", default=None, help="only tasks of this type")
@click.option("--ordering-key", default=None, metavar="KEY",
              help="the unfinished tasks of KEY (stopped ones too), in the order they run")
@config_option
@json_option
@timeout_option
def task_list(unfinished: bool, task_type: str | None, ordering_key: str | None,
              config: Path | None, as_json: bool, timeout: float) -> None:
    """List tasks (newest first; --unfinished: in the order nodes pick them)."""
    from runner.cli.console import render_task_list

    with connect(config, timeout) as client:  # it walks the pages
        tasks = client.list(unfinished=unfinished, task_type=task_type,
                            ordering_key=ordering_key)
    output([t.model_dump(mode="json") for t in tasks], as_json, render_task_list)


@task.command("show")
@click.argument("task_id")
@click.option("--follow", is_flag=True,
              help="then print every attempt change until the task ends; exit 0 if it "
                   "succeeded, 1 if it stopped")
@click.option("--checkpoint", "with_checkpoint", is_flag=True,
              help="show the task's last checkpoint's value instead (the first 16 KiB of its "
                   "JSON; with --json all of it: at most 64 KiB, the checkpoint limit)")
@config_option
@json_option
@timeout_option
def task_show(task_id: str, follow: bool, with_checkpoint: bool, config: Path | None,
              as_json: bool, timeout: float) -> None:
    """The attempt report of one task: status, every attempt, errors and stack traces."""
    from runner.cli.console import render_checkpoint, render_task_report

    if with_checkpoint:
        output(call(config, TaskCheckpoint, timeout, id=task_id), as_json, render_checkpoint)
        return
    output(call(config, TaskGet, timeout, id=task_id), as_json, render_task_report)
    if follow:
        from runner.cli.top import follow as follow_task

        with connect(config, timeout) as client:
            try:
                code = follow_task(client, task_id)
            except KeyboardInterrupt:
                code = 130
        sys.exit(code)


@task.command("result")
@click.argument("task_id")
@click.option("--wait", "wait", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="wait up to SECONDS for the task to end (default: answer at once)")
@config_option
@json_option
@timeout_option
def task_result(task_id: str, wait: float | None, config: Path | None, as_json: bool,
                timeout: float) -> None:
    """What the task's handler returned, once it succeeded: its JSON (--json: the answer
    whole, with its size and attempt). Exit 0 when it succeeded (with a result or none), 1
    when it stopped (failed, cancelled or skipped: the error is printed), 3 while it has not
    ended (still waiting or running after --wait)."""
    from runner.cli.console import render_result
    from runner.errors import ResultPending, TaskStopped

    with connect(config, timeout) as client:
        try:
            answer = client.result_value(task_id, wait)
        except TaskStopped as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)
        except ResultPending as exc:
            click.echo(str(exc), err=True)
            sys.exit(3)
    output(answer.model_dump(mode="json"), as_json, render_result)


def _stopped(verb: str, task_id: str, result: Cancelled) -> None:
    if not result.changed:
        click.echo(f"task {task_id} is {result.was} already: nothing changed")
        return
    cancelled = result.cancelled_attempts
    running = f"; its running attempt {', '.join(cancelled)} was cancelled" if cancelled else ""
    click.echo(f"task {task_id} {verb} (was {result.was}){running}")


@task.command("deactivate")
@click.argument("task_id")
@config_option
@timeout_option
def task_deactivate(task_id: str, config: Path | None, timeout: float) -> None:
    """Stop a task: nodes no longer pick it (it is kept, like every task). A running attempt
    is cancelled cluster-wide, as with `task cancel`."""
    with connect(config, timeout) as client:
        _stopped("deactivated", task_id, client.deactivate(task_id))


@task.command("cancel")
@click.argument("task_id")
@click.option("--reason", default=None, help="recorded in the cancelled attempt's error")
@config_option
@timeout_option
def task_cancel(task_id: str, reason: str | None, config: Path | None, timeout: float) -> None:
    """Cancel a task: its running attempt (if any) ends CANCELLED "cancelled by operator
    USER@HOST" at once, its owner is fenced off and told to stop through its lock, and the
    task becomes inactive (`task reactivate` runs it again)."""
    with connect(config, timeout) as client:
        _stopped("cancelled", task_id, client.cancel(task_id, reason))


@task.command("reactivate")
@click.argument("task_id")
@click.option("--fresh", is_flag=True, help="also drop the task's last checkpoint: its next "
              "attempt starts from the beginning (ctx.resume is None); for a checkpoint that "
              "makes every attempt fail. Refused while an attempt runs it")
@config_option
@timeout_option
def task_reactivate(task_id: str, fresh: bool, config: Path | None, timeout: float) -> None:
    """Let nodes pick a stopped (failed or cancelled) task again, from its last checkpoint if
    it has one. A task that is active already is left as it is (exit 0, "nothing changed"); a
    finished one (succeeded, skipped) is refused with exit 1 and its checkpoint kept: a task
    succeeds once, so to run its work again submit a new task."""
    with connect(config, timeout) as client:
        result = client.reactivate(task_id, fresh=fresh)
    if not result.changed:
        click.echo(f"task {task_id} is {result.was} already: nothing changed")
    elif result.was in ("failed", "cancelled"):
        click.echo(f"task {task_id} reactivated (was {result.was}), now {result.state}"
                   + ("; its checkpoint dropped" if fresh else ""))
    else:  # --fresh on a task that was active: only its checkpoint went
        click.echo(f"task {task_id} is {result.state}; its checkpoint dropped")




@task.command("skip")
@click.argument("task_id")
@config_option
@timeout_option
def task_skip(task_id: str, config: Path | None, timeout: float) -> None:
    """Finish a stopped or waiting task without running it, so that the next task of its
    ordering key can run. A running task must be cancelled first."""
    with connect(config, timeout) as client:
        result = client.skip(task_id)
    click.echo(f"task {task_id} skipped (was {result.was})")


@task.command("types")
@config_option
@json_option
@timeout_option
def task_types(config: Path | None, as_json: bool, timeout: float) -> None:
    """Every task type a running node knows: description, default priority, cluster-wide
    slots and the payload's JSON schema (--json)."""
    from runner.cli.console import render_task_types

    with connect(config, timeout) as client:
        types = client.task_types()
    output(types, as_json, render_task_types)
