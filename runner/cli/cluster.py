"""``latchwork cluster status``: members, the master, held task locks, concurrency levels,
resources and ordering keys held, MASTER commands in flight, open incidents."""

from __future__ import annotations

from pathlib import Path

from runner.cli.client import (
    call,
    config_option,
    json_option,
    output,
    timeout_option,
)
from runner.cli.root import cli
from runner.requests import ClusterStatusQuery


@cli.group()
def cluster() -> None:
    """Look at the cluster."""


@cluster.command("status")
@config_option
@json_option
@timeout_option
def cluster_status(config: Path | None, as_json: bool, timeout: float) -> None:
    """Members, the master, and held task locks with owner and age."""
    from runner.cli.console import render_cluster_status

    output(call(config, ClusterStatusQuery, timeout), as_json, render_cluster_status)


