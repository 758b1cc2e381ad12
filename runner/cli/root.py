"""The ``latchwork`` root command; every command group registers itself on it.

Exit codes: 0 ok, 1 failure (the reason on stderr, one line where it can be), 2 usage error
(also for a request a node refused as invalid: see :mod:`runner.cli.client`).
"""

from __future__ import annotations

from pathlib import Path

import click

from runner import __version__

DEFAULT_DEV_DIR = Path(".latchwork/dev")


def fail(message: str, exit_code: int = 1) -> click.ClickException:
    """One line on stderr (``Error: message``) and ``exit_code``: 1 for a failure, 2 for input
    the user must change (a bad setting, a task module that does not load)."""
    return click.ClickException(message) if exit_code == 1 else InputError(message)


class InputError(click.ClickException):
    """Input the user must change; exits 2 with one line (no usage text)."""

    exit_code = 2


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="latchwork")
def cli() -> None:
    """latchwork: ZooKeeper-centred cluster coordination and a master/lock task runner.

    Settings come from a TOML file (--config where a command takes it) and LATCHWORK_*
    environment variables, e.g. LATCHWORK_ZK_HOSTS and LATCHWORK_AMQP_URL.
    """

