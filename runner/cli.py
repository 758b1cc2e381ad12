"""The ``latchwork`` command line.

Exit codes: 0 ok, 1 failure (the reason on stderr, one line where it can be), 2 usage error.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import click

from coord.testing import DevServerError
from runner import __version__
from runner.config import DEFAULT_AMQP_PORT, DEFAULT_ZK_PORT, ConfigError, Settings
from runner.devenv import DevEnvironment
from runner.devenv.smoke import SmokeCheckFailed, check_rabbitmq, check_zookeeper

DEFAULT_DEV_DIR = Path(".latchwork/dev")


def _fail(message: str) -> click.ClickException:
    return click.ClickException(message)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="latchwork")
def cli() -> None:
    """latchwork: ZooKeeper-centred cluster coordination and a master/lock task runner.

    Settings come from a TOML file (--config where a command takes it) and LATCHWORK_*
    environment variables, e.g. LATCHWORK_ZK_HOSTS and LATCHWORK_AMQP_URL.
    """


# ---------------------------------------------------------------------------------------------
# dev: local servers


dir_option = click.option(
    "--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_DEV_DIR, show_default=True,
    help="where the servers keep configuration, data, logs and the state file")


@cli.group()
def dev() -> None:
    """Local ZooKeeper and RabbitMQ for development, from the Debian packages.

    The servers run as background processes bound to 127.0.0.1 with all their state under
    --dir. `up` prints the connection settings as shell exports:

        eval "$(latchwork dev up)"
    """


@dev.command("up")
@dir_option
@click.option("--zk-ensemble", type=click.IntRange(1, 9), default=1, show_default=True,
              help="number of ZooKeeper servers (1 = standalone; 3 = an ensemble on this host)")
@click.option("--zk-port", type=click.IntRange(1, 65535), default=DEFAULT_ZK_PORT,
              show_default=True, help="client port of the first ZooKeeper server "
              "(an ensemble uses the following ports)")
@click.option("--amqp-port", type=click.IntRange(1, 65533), default=DEFAULT_AMQP_PORT,
              show_default=True, help="RabbitMQ AMQP port; the next two ports are its Erlang "
              "distribution port and its private epmd")
@click.option("--tick-time", type=click.IntRange(100, 10000), default=2000, show_default=True,
              help="ZooKeeper tickTime in ms (sessions may last 2 to 20 ticks)")
@click.option("--timeout", type=click.FloatRange(1, 600), default=90.0, show_default=True,
              help="seconds to wait for the servers to be ready")
def dev_up(directory: Path, zk_ensemble: int, zk_port: int, amqp_port: int, tick_time: int,
           timeout: float) -> None:
    """Start ZooKeeper and RabbitMQ and wait until both really serve.

    Refuses to start twice from the same --dir, and refuses ports already in use. On any
    failure it stops what it had started and exits 1 with the reason.
    """
    env = DevEnvironment.plan(directory, zk_ensemble, zk_port, amqp_port, tick_time)
    click.echo(f"starting {zk_ensemble} ZooKeeper server(s) and RabbitMQ under {env.directory} ...",
               err=True)
    try:
        env.up(timeout)
    except DevServerError as exc:
        raise _fail(str(exc)) from exc
    for row in env.status():
        click.echo(f"  {row.name:<14} pid {row.pid}  {row.detail}", err=True)
    for name, value in env.exports().items():
        click.echo(f"export {name}={value}")


def _load_env(directory: Path) -> DevEnvironment:
    try:
        env = DevEnvironment.load(directory)
    except DevServerError as exc:
        raise _fail(str(exc)) from exc
    if env is None:
        raise _fail(f"nothing was started under {directory.resolve()} "
                    f"(run 'latchwork dev up --dir {directory}')")
    return env


@dev.command("status")
@dir_option
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of text")
def dev_status(directory: Path, as_json: bool) -> None:
    """Show each server's PID, whether it is still ours and running, and whether it serves.

    Exits 1 when any server is down or not ready.
    """
    env = _load_env(directory)
    rows = env.status()
    if as_json:
        click.echo(json.dumps({"services": [row.__dict__ for row in rows],
                               "exports": env.exports()}, indent=2))
    else:
        for row in rows:
            state = "ready" if row.ready else ("running, not ready" if row.running else "down")
            click.echo(f"{row.name:<14} {state:<20} pid {row.pid}  {row.detail}")
        for name, value in env.exports().items():
            click.echo(f"export {name}={value}")
    if not all(row.ready for row in rows):
        sys.exit(1)


@dev.command("down")
@dir_option
def dev_down(directory: Path) -> None:
    """Stop the servers started from --dir (only those PIDs, and only while they are ours)."""
    try:
        env = DevEnvironment.load(directory)
    except DevServerError as exc:
        raise _fail(str(exc)) from exc
    if env is None:
        click.echo(f"nothing to stop under {directory.resolve()}", err=True)
        return
    env.down()
    click.echo(f"stopped the servers under {env.directory}", err=True)


@dev.command("check")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              default=None, help="check the servers started from this --dir "
              "(default: the LATCHWORK_ZK_HOSTS / LATCHWORK_AMQP_URL settings)")
def dev_check(directory: Path | None) -> None:
    """A real round trip through both servers: a kazoo ephemeral node, a confirmed message."""
    if directory is not None:
        exports = _load_env(directory).exports()
        zk_hosts, amqp_url = exports["LATCHWORK_ZK_HOSTS"], exports["LATCHWORK_AMQP_URL"]
    else:
        try:
            settings = Settings.load()
        except ConfigError as exc:
            raise _fail(str(exc)) from exc
        zk_hosts, amqp_url = settings.zk_hosts, settings.amqp_url
    try:
        for result in (check_zookeeper(zk_hosts), check_rabbitmq(amqp_url)):
            click.echo(f"{result.service}: {result.detail}")
    except SmokeCheckFailed as exc:
        raise _fail(str(exc)) from exc


# ---------------------------------------------------------------------------------------------
# node


@cli.group()
def node() -> None:
    """Run a latchwork cluster node."""


@node.command("start")
@click.option("--config", "config", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="TOML file with settings; LATCHWORK_* variables override it")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]),
              default="INFO", show_default=True)
def node_start(config: Path | None, log_level: str) -> None:
    """Join the cluster and run tasks until SIGTERM or SIGINT.

    The node joins membership and the master election, runs the task loop, consumes MASTER
    commands while it is master (and frees the locks of dead members), consumes MODEL
    broadcasts, and answers API requests. On SIGTERM/SIGINT it stops taking tasks, cancels the
    running ones (attempts end "cancelled by system"), releases their locks, leaves and exits 0.

    Settings: LATCHWORK_CLUSTER, LATCHWORK_ZK_HOSTS, LATCHWORK_AMQP_URL, LATCHWORK_GRAPH,
    LATCHWORK_WORKERS, LATCHWORK_SCAN_INTERVAL, LATCHWORK_SESSION_TIMEOUT,
    LATCHWORK_ONTOLOGY_SOURCE, ... (or the same keys in --config).
    """
    import logging

    from coord import ConnectionLost
    from runner.node import run

    logging.basicConfig(level=log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if log_level != "DEBUG":  # libraries that narrate every query or job run at INFO
        for noisy in ("gremlite", "gremlinpython", "apscheduler", "kazoo"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
        # pika logs every failed (re)connection step at ERROR with a traceback (~200 lines per
        # broker restart); the consumers and the publisher log one WARNING per lost connection
        logging.getLogger("pika").setLevel(logging.CRITICAL)
    try:
        settings = Settings.load(config)
    except ConfigError as exc:
        raise _fail(str(exc)) from exc
    from messaging import BrokerUnavailable
    from runner.store import StoreError

    try:
        sys.exit(run(settings))
    except (ConnectionLost, BrokerUnavailable, StoreError) as exc:
        raise _fail(str(exc)) from exc


# ---------------------------------------------------------------------------------------------
# clients: task, cluster, ontology (through the API paradigm: any node answers)

config_option = click.option(
    "--config", "config", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="TOML file with settings; LATCHWORK_AMQP_URL and LATCHWORK_CLUSTER override it")
json_option = click.option("--json", "as_json", is_flag=True, help="print JSON instead of text")
timeout_option = click.option("--timeout", type=click.FloatRange(0.1, 3600), default=10.0,
                              show_default=True, help="seconds to wait for a node's answer")

#: error kinds a node answers with that mean "you asked for something invalid" (exit 2)
USAGE_KINDS = {"UnknownTaskType", "InvalidPayload", "InvalidValue", "invalid", "unknown-command",
               "UnknownAspect"}


def _request(config: Path | None, command: str, payload: dict[str, object] | None,
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
        raise _fail(str(exc)) from exc
    try:
        with ApiClient(Connector(settings.amqp_url, connect_deadline=min(timeout, 10.0),
                                 name="latchwork cli"),
                       Topology(settings.cluster), sender=_operator()) as client:
            return client.request(command, payload, timeout=timeout)
    except RemoteError as exc:
        if exc.kind in USAGE_KINDS:
            raise click.UsageError(exc.detail) from exc
        if exc.kind in ("TaskNotFound", "AspectBusy"):
            raise _fail(exc.detail) from exc
        raise _fail(f"the node answered with an error: {exc}") from exc
    except (RequestTimeout, BrokerUnavailable) as exc:
        raise _fail(str(exc)) from exc


def _operator() -> str:
    """Who is asking: the sender of the CLI's requests, named in what they change (e.g. an
    attempt "cancelled by operator alice@host")."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _print_json(value: object) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True))


def _output(result: object, as_json: bool, render: Callable[[Any], None]) -> None:
    """``--json`` prints the node's answer as is; otherwise ``render`` shows it."""
    if as_json:
        _print_json(result)
    else:
        render(result)


@cli.group()
def task() -> None:
    """Submit, list, inspect, stop and restart tasks (through any running node)."""


@task.command("submit")
@click.argument("task_type", metavar="TYPE")
@click.option("--payload", default="{}", show_default=True,
              help='the task payload as a JSON object, e.g. \'{"seconds": 5}\'')
@click.option("--priority", type=int, default=0, show_default=True,
              help="higher runs first")
@click.option("--unique-key", default=None,
              help="submitting again with the same key returns the existing task")
@config_option
@json_option
@timeout_option
def task_submit(task_type: str, payload: str, priority: int, unique_key: str | None,
                config: Path | None, as_json: bool, timeout: float) -> None:
    """Submit a task of TYPE; prints its id. Built-in types: diag.sleep, diag.fail,
    diag.conflict, ontology.load."""
    try:
        body = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint="--payload") from exc
    if not isinstance(body, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--payload")
    result = _request(config, "task.submit", {"type": task_type, "payload": body,
                                              "priority": priority,
                                              "unique_key": unique_key}, timeout)
    assert isinstance(result, dict)
    if as_json:
        _print_json(result)
    else:
        click.echo(result["id"])


@task.command("list")
@click.option("--unfinished", is_flag=True, help="only active, unfinished tasks")
@click.option("--type", "task_type", default=None, help="only tasks of this type")
@config_option
@json_option
@timeout_option
def task_list(unfinished: bool, task_type: str | None, config: Path | None, as_json: bool,
              timeout: float) -> None:
    """List tasks (newest first; --unfinished: in the order nodes pick them)."""
    from runner.console import render_task_list

    result = _request(config, "task.list", {"unfinished": unfinished, "type": task_type},
                      timeout)
    _output(result, as_json, render_task_list)


@task.command("show")
@click.argument("task_id")
@config_option
@json_option
@timeout_option
def task_show(task_id: str, config: Path | None, as_json: bool, timeout: float) -> None:
    """The attempt report of one task: status, every attempt, errors and stack traces."""
    from runner.console import render_task_report

    _output(_request(config, "task.get", {"id": task_id}, timeout), as_json, render_task_report)


def _stopped(verb: str, task_id: str, result: object) -> None:
    assert isinstance(result, dict)
    cancelled = result.get("cancelled_attempts") or []
    running = f"; its running attempt {', '.join(cancelled)} was cancelled" if cancelled else ""
    click.echo(f"task {task_id} {verb}{running}")


@task.command("deactivate")
@click.argument("task_id")
@config_option
@timeout_option
def task_deactivate(task_id: str, config: Path | None, timeout: float) -> None:
    """Stop a task: nodes no longer pick it (it is kept, like every task). A running attempt
    is cancelled cluster-wide, as with `task cancel`."""
    _stopped("deactivated", task_id,
             _request(config, "task.deactivate", {"id": task_id}, timeout))


@task.command("cancel")
@click.argument("task_id")
@click.option("--reason", default=None, help="recorded in the cancelled attempt's error")
@config_option
@timeout_option
def task_cancel(task_id: str, reason: str | None, config: Path | None, timeout: float) -> None:
    """Cancel a task: its running attempt (if any) ends CANCELLED "cancelled by operator
    USER@HOST" at once, its owner is fenced off and told to stop through its lock, and the
    task becomes inactive (`task reactivate` runs it again)."""
    _stopped("cancelled", task_id,
             _request(config, "task.cancel", {"id": task_id, "reason": reason}, timeout))


@task.command("reactivate")
@click.argument("task_id")
@config_option
@timeout_option
def task_reactivate(task_id: str, config: Path | None, timeout: float) -> None:
    """Let nodes pick a stopped task again."""
    _request(config, "task.reactivate", {"id": task_id}, timeout)
    click.echo(f"task {task_id} reactivated")


@cli.group()
def cluster() -> None:
    """Look at the cluster."""


@cluster.command("status")
@config_option
@json_option
@timeout_option
def cluster_status(config: Path | None, as_json: bool, timeout: float) -> None:
    """Members, the master, and held task locks with owner and age."""
    from runner.console import render_cluster_status

    _output(_request(config, "cluster.status", None, timeout), as_json, render_cluster_status)


@cli.group()
def ontology() -> None:
    """Ontology synchronisation."""


@ontology.command("sync")
@config_option
@json_option
@timeout_option
def ontology_sync(config: Path | None, as_json: bool, timeout: float) -> None:
    """Ask the master to compare the ontology source with the graph and load what changed."""
    _output(_request(config, "ontology.sync", None, timeout), as_json,
            lambda _: click.echo("synchronisation requested from the master"))


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
            result = cast(dict[str, Any], _request(config, "aspect.get", {"name": name},
                                                   timeout))
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
    from runner.console import render_aspect
    _output(result, as_json, render_aspect)
    if result["state"] != want:
        raise _fail(f"aspect {result['name']} is {result['state']}"
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
    from runner.console import render_aspect
    result = cast(dict[str, Any], _request(
        config, "aspect.create", {"name": name, "batch_rows": batch_rows, "pause": pause},
        timeout))
    if not wait:
        _output(result, as_json, render_aspect)
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
    from runner.console import render_aspect
    result = cast(dict[str, Any], _request(config, "aspect.delete", {"name": name}, timeout))
    if not wait:
        _output(result, as_json, render_aspect)
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
    from runner.console import render_aspect
    _output(_request(config, "aspect.get", {"name": name}, timeout), as_json, render_aspect)


@aspect.command("list")
@config_option
@json_option
@timeout_option
def aspect_list(config: Path | None, as_json: bool, timeout: float) -> None:
    """Every defined aspect with its state."""
    from runner.console import render_aspect_list
    _output(_request(config, "aspect.list", None, timeout), as_json, render_aspect_list)


@cli.group()
def avatars() -> None:
    """Avatars between the graph (the node configuration's `graph`) and Parquet files."""


def _local_store(config: Path | None) -> Any:
    from runner.store import open_store
    try:
        settings = Settings.load(config)
    except ConfigError as exc:
        raise _fail(str(exc)) from exc
    return open_store(settings.graph)


@avatars.command("import")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@config_option
def avatars_import(path: Path, config: Path | None) -> None:
    """Upsert the avatars of a Parquet file (columns id, class_iri, properties as JSON).

    The whole file is validated first; a malformed row exits 2 and writes nothing."""
    from runner.pipeline.avatars_io import InvalidAvatars, import_avatars
    store = _local_store(config)
    try:
        count = import_avatars(store, path)
    except InvalidAvatars as exc:
        raise click.UsageError(str(exc)) from exc
    finally:
        store.close()
    click.echo(f"imported {count} avatars from {path}")


@avatars.command("export")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--class", "classes", multiple=True, help="only avatars of this class IRI "
                                                        "(repeatable)")
@config_option
def avatars_export(path: Path, classes: tuple[str, ...], config: Path | None) -> None:
    """Write avatars with their aspects to a Parquet file (atomically replaced)."""
    from runner.pipeline.avatars_io import export_avatars
    store = _local_store(config)
    try:
        count = export_avatars(store, path, list(classes) or None)
    finally:
        store.close()
    click.echo(f"exported {count} avatars to {path}")


def main() -> None:
    cli(prog_name="latchwork")


if __name__ == "__main__":
    main()
