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
)
from runner.cli.root import cli

__all__ = ["cli", "main"]

# the command groups register themselves on ``cli`` when imported
_GROUPS = (aspects, avatars, cluster, commands, dev, dlq, node, ontology, schedules, store,
           streams, tasks, top, web)


def main() -> None:
    cli(prog_name="latchwork")
