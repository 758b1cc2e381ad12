"""The ``latchwork`` command line: one module per command group over one client helper.

* :mod:`~runner.cli.root`: the root command; :mod:`~runner.cli.client`: requests to the
  cluster, shared options and the error-code to exit-code mapping;
* groups: :mod:`~runner.cli.dev`, :mod:`~runner.cli.node`, :mod:`~runner.cli.tasks`,
  :mod:`~runner.cli.cluster`, :mod:`~runner.cli.commands`, :mod:`~runner.cli.ontology`,
  :mod:`~runner.cli.aspects`,
  :mod:`~runner.cli.avatars`, :mod:`~runner.cli.dlq`, :mod:`~runner.cli.streams`,
  :mod:`~runner.cli.store`,
  :mod:`~runner.cli.schedules`,
  :mod:`~runner.cli.top`, :mod:`~runner.cli.web` (the web console); rendering:
  :mod:`~runner.cli.console`.
"""

import os
import sys
import traceback

import click

from runner.cli import (
    aspects,
    avatars,
    cluster,
    commands,
    dev,
    dlq,
    node,
    ontology,
    schedules,
    store,
    streams,
    tasks,
    top,
    web,
    workflows,
)
from runner.cli.root import cli

__all__ = ["cli", "main"]

# the command groups register themselves on ``cli`` when imported
_GROUPS = (aspects, avatars, cluster, commands, dev, dlq, node, ontology, schedules, store,
           streams, tasks, top, web, workflows)


def main() -> None:
    """The ``latchwork`` command. Every failure is one line and an exit code (docs/cli.md): a
    usage error or refused input 2, anything else 1. An error no command expected (a bug) is
    one line too, naming its type; ``LATCHWORK_DEBUG=1`` shows its traceback."""
    try:
        cli(prog_name="latchwork", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except (click.Abort, EOFError, KeyboardInterrupt):  # as click's standalone mode says it
        click.echo("Aborted!", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (RecursionError, MemoryError) as exc:  # input too deep or too large to take
        click.echo(f"Error: the input is too large or too deeply nested ({exc!r:.200})",
                   err=True)
        sys.exit(2)
    except Exception as exc:
        if os.environ.get("LATCHWORK_DEBUG"):
            traceback.print_exc()
        click.echo(f"Error: internal error: {type(exc).__name__}: {str(exc)[:300]} "
                   "(LATCHWORK_DEBUG=1 shows where)", err=True)
        sys.exit(1)
