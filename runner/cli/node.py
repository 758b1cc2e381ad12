"""``latchwork node start``: run a node in the foreground until SIGTERM/SIGINT
(:mod:`runner.node.main`). A bad configuration exits 2 with the key named; a failed start 1."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from runner.cli.root import cli, fail
from runner.config import Settings
from runner.errors import ConfigError

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
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="json: one object per line with member, task and "
                                      "attempt ids")
@click.option("--log-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write the log to this file instead of stderr")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None,
              help="serve Prometheus metrics on this port (metrics_port setting; off by "
                   "default), bound to metrics_host (127.0.0.1 by default)")
@click.option("--tasks", "task_modules", multiple=True, metavar="MODULE",
              help="a module of your own task types (@task), e.g. mypkg.tasks; repeatable, "
                   "added to the `tasks` setting and the latchwork.tasks entry points")
def node_start(config: Path | None, log_level: str, log_format: str, log_file: Path | None,
               metrics_port: int | None, task_modules: tuple[str, ...]) -> None:
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

    from coord import ConnectionLost, NotAuthorised
    from runner import logs
    from runner.node.main import run

    try:
        logs.configure(log_level, log_format, log_file)
    except OSError as exc:
        raise fail(f"cannot open the log file: {exc}", 2) from exc
    if log_level != "DEBUG":  # libraries that narrate every query or job run at INFO
        for noisy in ("gremlite", "gremlinpython", "apscheduler", "kazoo"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
        # pika logs every failed (re)connection step at ERROR with a traceback (~200 lines per
        # broker restart); the consumers and the publisher log one WARNING per lost connection
        logging.getLogger("pika").setLevel(logging.CRITICAL)
    try:
        settings = Settings.load(config)
        if task_modules:
            settings = settings.model_copy(update={"tasks": [*settings.tasks, *task_modules]})
        if metrics_port is not None:
            settings = settings.model_copy(update={"metrics_port": metrics_port})
    except ConfigError as exc:
        raise fail(str(exc), 2) from exc
    from messaging import BrokerUnavailable
    from runner.errors import InvalidAspect, StoreError, TaskLoadError
    from runner.node.node import Node

    try:
        node = Node(settings)  # loads task types and aspects before anything joins the cluster
    except (TaskLoadError, InvalidAspect, ConfigError) as exc:  # an extra missing among them
        raise fail(str(exc), 2) from exc
    try:
        sys.exit(run(settings, node=node))
    except (ConnectionLost, NotAuthorised, BrokerUnavailable, StoreError) as exc:
        raise fail(str(exc)) from exc


