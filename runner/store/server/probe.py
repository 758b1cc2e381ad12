"""The server driver's open: a Gremlin Server reached with :class:`ServerOptions`, and, when
asked, probed for transactions before anything is written (TinkerPop 3.5 never answers the
commit of an empty transaction on a graph without them: TINKERPOP-2751, so the probe has a
deadline)."""

from __future__ import annotations

import logging

from runner.errors import GraphNotTransactional
from runner.store.model import ServerOptions
from runner.store.server.graph import NONE, SERIAL, TRANSACTIONS, RemoteGraph

log = logging.getLogger("latchwork.store")

#: seconds a remote graph has to answer the commit of an empty transaction
TX_PROBE_DEADLINE = 5.0


def open_server(url: str, options: ServerOptions) -> RemoteGraph:
    """The server at ``url`` reached with ``options``. ``options.probe_transactions``: a
    server said to have transactions is asked to commit an empty one first (an answer
    within ``TX_PROBE_DEADLINE``); without them it is refused
    (:class:`~runner.errors.GraphNotTransactional`, the graph closed), or, when
    ``options.allow_untransactional``, used with check-then-act writes and a WARNING."""
    graph = RemoteGraph(url, username=options.username, password=options.password,
                        ca_file=options.ca_file, atomicity=options.atomicity,
                        timeout=options.timeout)
    if options.atomicity == SERIAL:
        log.info("the Gremlin Server at %s runs one traversal at a time "
                 "(graph_serial_server): every guarded write is one traversal", url)
    elif options.probe_transactions and options.atomicity == TRANSACTIONS and \
            not graph.supports_transactions(min(TX_PROBE_DEADLINE, options.timeout)):
        if not options.allow_untransactional:
            graph.close()
            raise GraphNotTransactional(
                f"the Gremlin Server at {url} has no transactions: guarded claims and "
                "unique creates would be check-then-act there; use a transactional graph "
                "(JanusGraph, Neo4j: docs/graph.md), set graph_serial_server if the server "
                "runs one traversal at a time, or set allow_untransactional_graph to "
                "accept the risk")
        graph.atomicity = NONE
        log.warning("the Gremlin Server at %s has no transactions and "
                    "allow_untransactional_graph is set: guarded writes are check-then-act "
                    "there, two owners can both win a claim (docs/graph.md)", url)
    return graph
