"""Connections built from :class:`~runner.config.Settings`, credentials and TLS applied.

Every part of latchwork that reaches a server goes through here, so secrets leave their
``SecretStr`` in one place only, at the moment a client needs them:

* :func:`zk_session`: ZooKeeper, digest credentials (``zk_auth``: every znode gets an ACL
  for that user alone) and TLS (``zk_tls_ca``, ``zk_tls_cert``, ``zk_tls_key``);
* :func:`amqp_connector`: RabbitMQ, ``amqp://`` or ``amqps://`` with a CA and a client
  certificate (``amqp_tls_*``);
* :func:`graph_store`: the graph, embedded or a Gremlin Server (``graph_username``,
  ``graph_password``, ``graph_tls_ca``), checking that a remote graph has transactions.

Failure behaviour: a remote graph without transactions raises
:class:`~runner.errors.GraphNotTransactional` unless ``allow_untransactional_graph`` is
set, in which case every start logs a WARNING saying what is given up. Errors name hosts and
users, never passwords (the tests grep for them).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from runner.config import Settings

if TYPE_CHECKING:
    from coord import Session
    from messaging import Connector
    from runner.store import GraphStore

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


def graph_store(settings: Settings) -> GraphStore:
    """The graph store of ``settings``; a remote one is checked for transactions."""
    from runner.errors import GraphNotTransactional
    from runner.store import GraphStore, open_graph
    from runner.store.graph import RemoteGraph
    graph = open_graph(settings.graph, username=settings.graph_username,
                       password=(settings.graph_password.get_secret_value()
                                 if settings.graph_password else None),
                       ca_file=settings.graph_tls_ca) \
        if settings.graph.startswith(("ws://", "wss://")) else open_graph(settings.graph)
    if isinstance(graph, RemoteGraph) and not graph.supports_transactions():
        if not settings.allow_untransactional_graph:
            graph.close()
            raise GraphNotTransactional(
                f"the Gremlin Server at {settings.graph} has no transactions: version-guarded "
                "claims and unique creates would be check-then-act there; use a transactional "
                "graph (JanusGraph, Neo4j: docs/graph.md) or set "
                "allow_untransactional_graph to accept the risk")
        graph.transactional = False
        log.warning("the Gremlin Server at %s has no transactions and "
                    "allow_untransactional_graph is set: guarded writes are check-then-act "
                    "there, two owners can both win a claim (docs/graph.md)", settings.graph)
    return GraphStore(graph)
