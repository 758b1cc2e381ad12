"""``latchwork dev``: local ZooKeeper and RabbitMQ for development (:mod:`runner.devenv`).
A failed ``up`` leaves nothing running and exits 1 with the reason."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from coord.testing import DevServerError
from runner.cli.root import DEFAULT_DEV_DIR, cli, fail
from runner.config import (
    DEFAULT_AMQP_PORT,
    DEFAULT_GRAPH_PORT,
    DEFAULT_SPARK_PORT,
    DEFAULT_ZK_PORT,
    Settings,
)
from runner.devenv import DevEnvironment, DevPlan
from runner.devenv.smoke import CheckResult, check_graph, check_rabbitmq, check_zookeeper
from runner.errors import ConfigError, SmokeCheckFailed
from runner.store import is_server

# ---------------------------------------------------------------------------------------------
# dev: local servers


dir_option = click.option(
    "--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_DEV_DIR, show_default=True,
    help="where the servers keep configuration, data, logs and the state file")


@cli.group()
def dev() -> None:
    """Local ZooKeeper and RabbitMQ (and, on request, a Spark standalone cluster and a Gremlin
    Server) for development, from the Debian packages and registry wheels.

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
@click.option("--spark-workers", type=click.IntRange(0, 16), default=0, show_default=True,
              help="also start a Spark standalone cluster: a Master and this many Workers "
              "(pipeline tasks then run on it: LATCHWORK_SPARK_MASTER is exported)")
@click.option("--spark-port", type=click.IntRange(1, 65000), default=DEFAULT_SPARK_PORT,
              show_default=True, help="the Spark Master's port; its web UI and each Worker's "
              "port and web UI use the following ports")
@click.option("--graph-server", is_flag=True,
              help="also start a Gremlin Server (TinkerPop 3.5.1, TinkerGraph, one traversal at "
              "a time, from the jars 'make setup' installed): LATCHWORK_GRAPH=ws://... and "
              "LATCHWORK_GRAPH_SERIAL_SERVER are exported, so nodes on several machines can "
              "share one graph; its data is written to its directory on 'dev down'")
@click.option("--graph-port", type=click.IntRange(1, 65535), default=DEFAULT_GRAPH_PORT,
              show_default=True, help="the Gremlin Server's port")
@click.option("--timeout", type=click.FloatRange(1, 600), default=90.0, show_default=True,
              help="seconds to wait for the servers to be ready")
def dev_up(timeout: float, zk_ensemble: int, **options: Any) -> None:
    """Start ZooKeeper and RabbitMQ (and Spark with --spark-workers, a Gremlin Server with
    --graph-server) and wait until they really serve.

    Refuses to start twice from the same --dir, and refuses ports already in use. On any
    failure it stops what it had started and exits 1 with the reason.
    """
    plan = DevPlan(zk_size=zk_ensemble, **options)  # the other options are its fields
    if plan.spark_workers:
        from runner.pipeline import extra
        if (why := extra.needs("dev up --spark-workers")) is not None:
            raise fail(why, 2)
    env = DevEnvironment.plan(plan)
    spark = f", a Spark master with {plan.spark_workers} worker(s)" if plan.spark_workers \
        else ""
    graph = ", a Gremlin Server" if plan.graph_server else ""
    click.echo(f"starting {zk_ensemble} ZooKeeper server(s), RabbitMQ{spark}{graph} under "
               f"{env.directory} ...", err=True)
    try:
        env.up(timeout)
    except DevServerError as exc:
        raise fail(str(exc)) from exc
    for row in env.status():
        click.echo(f"  {row.name:<14} pid {row.pid}  {row.detail}", err=True)
    for name, value in env.exports().items():
        click.echo(f"export {name}={value}")


def _load_env(directory: Path) -> DevEnvironment:
    try:
        env = DevEnvironment.load(directory)
    except DevServerError as exc:
        raise fail(str(exc)) from exc
    if env is None:
        raise fail(f"nothing was started under {directory.resolve()} "
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
        raise fail(str(exc)) from exc
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
    """A real round trip through the servers: a kazoo ephemeral node, a confirmed message, and
    a vertex when the graph is a Gremlin Server."""
    if directory is not None:
        exports = _load_env(directory).exports()
        zk_hosts, amqp_url = exports["LATCHWORK_ZK_HOSTS"], exports["LATCHWORK_AMQP_URL"]
        graph = exports.get("LATCHWORK_GRAPH", "")
    else:
        try:
            settings = Settings.load()
        except ConfigError as exc:
            raise fail(str(exc)) from exc
        zk_hosts, amqp_url = settings.zk_hosts, settings.amqp_url.get_secret_value()
        graph = settings.graph
    try:
        checks: list[Callable[[], CheckResult]] = [
            lambda: check_zookeeper(zk_hosts), lambda: check_rabbitmq(amqp_url)]
        if is_server(graph):
            checks.append(lambda: check_graph(graph))
        for check in checks:
            result = check()
            click.echo(f"{result.service}: {result.detail}")
    except SmokeCheckFailed as exc:
        raise fail(str(exc)) from exc


