"""``latchwork web``: the web console (:mod:`runner.web`), served until Ctrl-C or SIGTERM.

It reads the same settings as every client command and talks to the cluster through
:class:`runner.client.Client`, so it needs a node running and nothing else. Read-only unless
``--allow-actions``; that, or an address beyond loopback, needs credentials in the settings
(``web_username`` + ``web_password``, or ``web_token``): without them it exits 2 at once.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from runner.cli.client import config_option
from runner.cli.root import cli, fail
from runner.config import Settings
from runner.errors import ConfigError


@cli.command("web")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="address to listen on (beyond loopback only with credentials configured)")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="port to listen on")
@click.option("--allow-actions", is_flag=True,
              help="show and serve cancel, deactivate, reactivate, skip, dead-letter replay "
                   "and schedule pause/resume (needs credentials; CSRF-protected)")
@click.option("--timeout", type=click.FloatRange(0.1, 600), default=10.0, show_default=True,
              help="seconds to wait for a node's answer per request")
@config_option
def web(host: str, port: int, allow_actions: bool, timeout: float,
        config: Path | None) -> None:
    """Serve the web console: the cluster, its tasks and every attempt, live in a browser.

    Pages: /cluster, /tasks (query box: type:X state:Y owner:M key:K resource:R), /tasks/ID
    (the attempts on a timeline), /schedules, /streams, /dead-letters, /types. Running tasks
    and the cluster view refresh every 2 seconds without a reload.
    """
    try:
        import uvicorn

        from runner.client import Client
        from runner.web.app import create_app
        from runner.web.security import Credentials, check_bind, is_loopback
    except ImportError as exc:
        raise fail(f"the web console needs its extra: pip install 'latchwork[web]' ({exc})",
                   2) from exc
    try:
        settings = Settings.load(config)
        credentials = Credentials.of(settings)
        check_bind(host, credentials, allow_actions)
    except ConfigError as exc:
        raise fail(str(exc), 2) from exc

    def connect() -> Client:
        return Client.from_settings(settings, timeout=timeout, name="latchwork web")

    app = create_app(connect, credentials, allow_actions=allow_actions,
                     pages_need_auth=credentials.configured and not is_loopback(host))
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    mode = "actions allowed" if allow_actions else "read-only"
    click.echo(f"latchwork web on http://{host}:{port}/ ({mode}, cluster {settings.cluster})")
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
