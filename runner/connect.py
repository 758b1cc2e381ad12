"""Connections built from :class:`~runner.config.Settings`, credentials and TLS applied.

Every part of latchwork that reaches a server goes through here, so secrets leave their
``SecretStr`` in one place only, at the moment a client needs them:

* :func:`zk_session`: ZooKeeper, digest credentials (``zk_auth``: every znode gets an ACL
  for that user alone) and TLS (``zk_tls_ca``, ``zk_tls_cert``, ``zk_tls_key``);
* :func:`amqp_connector`: RabbitMQ, ``amqp://`` or ``amqps://`` with a CA and a client
  certificate (``amqp_tls_*``);
* :func:`graph_store`: the graph, embedded or a Gremlin Server (``graph_username``,
  ``graph_password``, ``graph_tls_ca``, ``graph_timeout``), checking that a remote graph has
  transactions unless ``graph_serial_server`` says it runs one traversal at a time.

Failure behaviour: a remote graph without transactions raises
:class:`~runner.errors.GraphNotTransactional` unless ``graph_serial_server`` or
``allow_untransactional_graph`` is set; the latter logs a WARNING at every start saying what
is given up. Errors name hosts and users, never passwords (the tests grep for them).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from runner.config import Settings

if TYPE_CHECKING:
    from coord import Session
    from messaging import Connector
    from runner.store import Store

log = logging.getLogger("latchwork.connect")


def zk_session(settings: Settings, *, timeout: float | None = None) -> Session:
    from coord import Session
    return Session(settings.zk_hosts, settings.cluster,
                   timeout=settings.session_timeout if timeout is None else timeout,
                   auth=settings.zk_auth.get_secret_value() if settings.zk_auth else None,
                   tls_ca=settings.zk_tls_ca, tls_cert=settings.zk_tls_cert,
                   tls_key=settings.zk_tls_key)


def amqp_url(settings: Settings) -> str:
    """The broker URL with its password, for the connection only."""
    return settings.amqp_url.get_secret_value()


def amqp_connector(settings: Settings, name: str = "latchwork",
                   connect_deadline: float = 30.0) -> Connector:
    from messaging import Connector
    return Connector(amqp_url(settings), name=name, connect_deadline=connect_deadline,
                     tls_ca=settings.amqp_tls_ca, tls_cert=settings.amqp_tls_cert,
                     tls_key=settings.amqp_tls_key)


def graph_store(settings: Settings, *, check_format: bool = True) -> Store:
    """The graph store of ``settings``; a remote one is checked for transactions, and both for
    their store format (``check_format=False``: the migration's own way in).

    ``graph_serial_server`` declares a server without transactions that runs one traversal at a
    time (each guarded write is one traversal: atomic there): no probe, plain requests.
    Otherwise the server is asked to commit an empty transaction; without transactions it is
    refused (:class:`~runner.errors.GraphNotTransactional`), or accepted with a WARNING when
    ``allow_untransactional_graph`` accepts check-then-act."""
    from runner.store import ServerOptions, open_store
    options = ServerOptions(
        username=settings.graph_username,
        password=settings.graph_password.get_secret_value() if settings.graph_password else None,
        ca_file=settings.graph_tls_ca, timeout=settings.graph_timeout,
        atomicity="serial" if settings.graph_serial_server else "transactions",
        probe_transactions=True, allow_untransactional=settings.allow_untransactional_graph)
    return open_store(settings.graph, check_format=check_format, server=options)
