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
    from runner.store import Graph, GraphStore

log = logging.getLogger("latchwork.connect")

#: seconds a remote graph has to answer the commit of an empty transaction (TinkerPop 3.5
#: never answers one on a graph without transactions: TINKERPOP-2751)
TX_PROBE_DEADLINE = 5.0


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


def graph_store(settings: Settings, *, check_format: bool = True) -> GraphStore:
    """The graph store of ``settings``; a remote one is checked for transactions, and both for
    their store format (:class:`~runner.store.GraphStore`; ``check_format=False``: the
    migration's own way in).

    ``graph_serial_server`` declares a server without transactions that runs one traversal at a
    time (each guarded write is one traversal: atomic there): no probe, plain requests.
    Otherwise the server is asked to commit an empty transaction (an answer within
    ``TX_PROBE_DEADLINE``); without transactions it is refused, or accepted with a WARNING
    when ``allow_untransactional_graph`` accepts check-then-act."""
    from runner.errors import GraphNotTransactional
    from runner.store import open_graph
    from runner.store.remote import NONE, SERIAL, TRANSACTIONS, RemoteGraph
    if not settings.graph.startswith(("ws://", "wss://")):
        return _checked(open_graph(settings.graph), check_format)
    graph = RemoteGraph(settings.graph, username=settings.graph_username,
                       password=(settings.graph_password.get_secret_value()
                                 if settings.graph_password else None),
                       ca_file=settings.graph_tls_ca, timeout=settings.graph_timeout,
                       atomicity=SERIAL if settings.graph_serial_server else TRANSACTIONS)
    if settings.graph_serial_server:
        log.info("the Gremlin Server at %s runs one traversal at a time (graph_serial_server): "
                 "every guarded write is one traversal", settings.graph)
    elif not graph.supports_transactions(min(TX_PROBE_DEADLINE, settings.graph_timeout)):
        if not settings.allow_untransactional_graph:
            graph.close()
            raise GraphNotTransactional(
                f"the Gremlin Server at {settings.graph} has no transactions: guarded claims "
                "and unique creates would be check-then-act there; use a transactional graph "
                "(JanusGraph, Neo4j: docs/graph.md), set graph_serial_server if the server "
                "runs one traversal at a time, or set allow_untransactional_graph to accept "
                "the risk")
        graph.atomicity = NONE
        log.warning("the Gremlin Server at %s has no transactions and "
                    "allow_untransactional_graph is set: guarded writes are check-then-act "
                    "there, two owners can both win a claim (docs/graph.md)", settings.graph)
    return _checked(graph, check_format)


def _checked(graph: Graph, check_format: bool) -> GraphStore:
    from runner.store import GraphStore
    return GraphStore.checked(graph, check_format)
