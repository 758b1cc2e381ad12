"""``latchwork store``: the graph store's format. ``migrate`` upgrades a graph written by an
older latchwork to the format this one writes (:mod:`runner.store.migrations`), offline.

Failure behaviour: live members of the graph's cluster (read from ZooKeeper's membership), or
a membership that cannot be read, refuse the migration in one line, exit 1, unless
``--force``; a graph newer than this latchwork exits 1 naming the version it needs; a
migration killed half-way leaves the graph at its previous format with its cursor, and the
next run finishes it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from runner.cli.client import config_option
from runner.cli.root import cli, fail
from runner.config import Settings
from runner.errors import ConfigError, MigrationRefused, StoreError

if TYPE_CHECKING:
    from rich.progress import Progress
    from rich.table import Table

    from runner.store.migrations import StepProgress, StepReport


@cli.group()
def store() -> None:
    """The graph store: its format and upgrades."""


def _bars(bar: Progress) -> Callable[[int], StepProgress]:
    """A progress bar per migration step, on ``bar``."""
    from runner.store import migrations

    def progress(version: int) -> StepProgress:
        task = bar.add_task(f"format {version}: {migrations.describe(version)}", total=None)

        def report(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total or None)
        return report
    return progress


def _report_table(reports: list[StepReport], dry_run: bool) -> Table:
    """What each migration step changed (or would), as a table."""
    from rich.table import Table

    table = Table(title="would change (dry run)" if dry_run else "changed")
    for column in ("format", "step", "tasks changed" if not dry_run else "tasks to change",
                   "unreadable", "seconds"):
        table.add_column(column)
    for r in reports:
        table.add_row(str(r.version), r.what, str(r.changed), str(r.unreadable),
                      f"{r.seconds:.1f}")
    return table


@store.command("migrate")
@click.option("--dry-run", is_flag=True,
              help="change nothing: say what each step would change")
@click.option("--force", is_flag=True,
              help="run although members of the cluster are live (or their liveness cannot "
                   "be read); they may write tasks in the old format meanwhile")
@click.option("--page-size", type=click.IntRange(1, 100_000), default=500, show_default=True,
              help="tasks read per page (embedded: vertex ids per window); each page is one "
                   "write")
@config_option
def store_migrate(dry_run: bool, force: bool, page_size: int, config: Path | None) -> None:
    """Upgrade the graph (the `graph` setting) to the store format this latchwork writes.

    Runs the steps from the graph's format to the current one, in order; each is idempotent
    and resumable, so a run that was killed is simply run again. Stop the nodes first: it
    refuses while members of the cluster are live (it reads ZooKeeper's membership of the
    `cluster` setting) unless --force. Prints a progress bar per step and, at the end, what
    each step changed.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from runner.connect import graph_store
    from runner.store import migrations
    from runner.store.api import location

    try:
        settings = Settings.load(config)
    except ConfigError as exc:
        raise fail(str(exc), 2) from exc
    out = Console()
    try:
        if not force:
            _refuse_while_live(settings)
        with graph_store(settings, check_format=False) as graph_store_:
            graph = graph_store_.graph
            where = location(graph)
            state = migrations.read_state(graph)
            version = migrations.graph_version(state)
            steps = migrations.pending(state)
            if not steps:
                if version > migrations.CURRENT:
                    migrations.open_format(graph, where)  # raises, naming what to run
                if not dry_run:
                    migrations.open_format(graph, where)  # stamps a brand-new graph
                out.print(f"the graph at {where} is at store format {version}, the current "
                          "one: nothing to migrate")
                return
            out.print(f"the graph at {where} is at store format {version}; "
                      f"{'would run' if dry_run else 'running'} "
                      f"{len(steps)} step(s) to format {migrations.CURRENT}")
            with Progress("[progress.description]{task.description}", BarColumn(),
                          MofNCompleteColumn(), TimeElapsedColumn(), console=out,
                          transient=False) as bar:
                began = time.monotonic()
                reports = migrations.migrate(graph, where, dry_run=dry_run, page=page_size,
                                             progress=_bars(bar))
    except StoreError as exc:
        raise fail(str(exc)) from exc
    out.print(_report_table(reports, dry_run))
    if dry_run:
        out.print("dry run: nothing was changed")
    else:
        out.print(f"the graph at {where} is at store format {migrations.CURRENT} "
                  f"({time.monotonic() - began:.1f}s)")


def _refuse_while_live(settings: Settings) -> None:
    """A migration is offline: nodes of an older latchwork would write tasks in the old format
    behind its steps, and nodes of this one refuse the graph until it is done."""
    from coord import live_member_ids
    from coord.errors import CoordError
    from runner.connect import zk_session

    try:
        with zk_session(settings, timeout=min(settings.session_timeout, 10.0)) as session:
            live = sorted(live_member_ids(session))
    except CoordError as exc:
        raise MigrationRefused(
            f"cannot read the membership of cluster {settings.cluster!r} at "
            f"{settings.zk_hosts} ({exc}): if no node runs, pass --force") from exc
    if live:
        raise MigrationRefused(
            f"{len(live)} member(s) of cluster {settings.cluster!r} are live "
            f"({', '.join(live[:5])}{', ...' if len(live) > 5 else ''}): stop them first "
            "(a migration runs offline), or pass --force")
