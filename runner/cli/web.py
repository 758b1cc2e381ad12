"""``latchwork web``: the web console (:mod:`runner.web`), served until Ctrl-C or SIGTERM.

It reads the same settings as every client command and talks to the cluster through
:class:`runner.client.Client`, so it needs a node running and nothing else. Read-only unless
``--allow-actions``; that, or an address beyond loopback, needs credentials in the settings
(``web_username`` + ``web_password``, or ``web_token``), and an address beyond loopback needs
TLS (``--tls-cert``/``--tls-key``) or ``--behind-proxy``: without them it exits 2 at once.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from types import FrameType
from typing import Any

import click

from runner import logs
from runner.cli.client import config_option
from runner.cli.root import cli, fail
from runner.config import Settings
from runner.errors import ConfigError

#: the options that override a setting of the console's (the rest are the command's own)
WEB_SETTINGS = {"tls_cert": "web_tls_cert", "tls_key": "web_tls_key",
                "behind_proxy": "web_behind_proxy", "proxies": "web_proxies"}


@cli.command("web")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="address to listen on (beyond loopback only with credentials, and TLS or "
                   "--behind-proxy)")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="port to listen on")
@click.option("--allow-actions", is_flag=True,
              help="show and serve cancel, deactivate, reactivate, skip, dead-letter replay "
                   "and schedule pause/resume (needs credentials; CSRF-protected)")
@click.option("--timeout", type=click.FloatRange(0.1, 600), default=10.0, show_default=True,
              help="seconds to wait for a node's answer per request")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]),
              default="INFO", show_default=True,
              help="INFO: one access line per request (the 2-second live refreshes that "
                   "succeed only at DEBUG) and errors; DEBUG adds pika's connection lines")
@click.option("--tls-cert", type=click.Path(path_type=Path), default=None,
              help="serve HTTPS with this PEM certificate (chain); with --tls-key "
                   "(web_tls_cert); adds HSTS and a Secure CSRF cookie")
@click.option("--tls-key", type=click.Path(path_type=Path), default=None,
              help="the certificate's PEM private key (web_tls_key)")
@click.option("--behind-proxy", is_flag=True, default=None,
              help="a TLS-terminating proxy fronts the console: plain HTTP beyond loopback is "
                   "allowed, and X-Forwarded-Proto/-For are honoured from --proxy addresses "
                   "only (web_behind_proxy)")
@click.option("--proxy", "proxies", multiple=True, metavar="ADDRESS",
              help="a proxy's address or network whose forwarded headers count (repeatable; "
                   "web_proxies, default 127.0.0.1)")
@config_option
def web(host: str, port: int, allow_actions: bool, timeout: float, log_level: str,
        config: Path | None, **overrides: Any) -> None:
    """Serve the web console: the cluster, its tasks and every attempt, live in a browser.

    Pages: /cluster, /tasks (query box: type:X state:Y owner:M key:K resource:R; a key given
    twice means any of its values), /tasks/ID (the attempts on a timeline), /schedules,
    /streams, /dead-letters, /types. Running tasks and the cluster view refresh every 2
    seconds without a reload. SIGTERM or Ctrl-C: finishes the requests in flight and exits 0.
    """
    try:
        import uvicorn

        from runner.client import Client
        from runner.web.app import QuietRefreshes, create_app
        from runner.web.security import Credentials, Transport, check_bind, is_loopback
    except ImportError as exc:
        raise fail(f"the web console needs its extra: pip install 'latchwork[web]' ({exc})",
                   2) from exc
    try:
        settings = Settings.load(config)
        credentials = Credentials.of(settings)
        given = {setting: list(value) if isinstance(value, tuple) else value
                 for option, setting in WEB_SETTINGS.items()
                 if (value := overrides.get(option)) not in (None, ())}
        settings = settings.model_copy(update=given)
        transport = Transport.of(settings)
        check_bind(host, credentials, allow_actions, transport)
    except ConfigError as exc:
        raise fail(str(exc), 2) from exc

    def connect() -> Client:
        return Client.from_settings(settings, timeout=timeout, name="latchwork web")

    app = create_app(connect, credentials, allow_actions=allow_actions,
                     pages_need_auth=credentials.configured and not is_loopback(host))
    logs.configure(log_level)
    if (expiring := transport.expiry_warning()) is not None:
        logging.getLogger("latchwork.web").warning("%s", expiring)
    if log_level != "DEBUG":
        logging.getLogger("pika").setLevel(logging.WARNING)
        logging.getLogger("uvicorn.access").addFilter(QuietRefreshes())
    # uvicorn re-raises a SIGTERM after its graceful shutdown (exit 143, which a supervisor
    # reads as a crash): this handler turns it, and one before uvicorn started, into exit 0
    signal.signal(signal.SIGTERM, _stopped)
    mode = "actions allowed" if allow_actions else "read-only"
    click.echo(f"latchwork web on {transport.scheme}://{host}:{port}/ ({mode}, cluster "
               f"{settings.cluster})")
    tls = {"ssl_certfile": str(transport.cert), "ssl_keyfile": str(transport.key)} \
        if transport.tls else {}
    try:
        # forwarded headers only behind a proxy, and only from its addresses (uvicorn trusts
        # 127.0.0.1's by default: a local client could claim HTTPS or another address)
        uvicorn.run(app, host=host, port=port, log_config=None, access_log=True,
                    log_level=log_level.lower(), proxy_headers=transport.behind_proxy,
                    forwarded_allow_ips=list(transport.proxies), **tls)  # type: ignore[arg-type]
    finally:
        logging.getLogger("latchwork.web").info("latchwork web stopped")


def _stopped(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)
