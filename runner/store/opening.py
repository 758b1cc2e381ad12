"""Opening a store: the driver picked from the location, the way SQLAlchemy's ``create_engine``
picks a dialect from its URL. A Gremlin Server's URL (``ws://``, ``wss://``) opens the server
driver (:mod:`runner.store.server`), anything else a gremlite file with the embedded driver
(:mod:`runner.store.embedded`, which checks what it relies on in gremlite before anything is
written). The drivers are imported when a store is opened, not when :mod:`runner.store` is
(the CLI's ``--help`` and the reply models need only the port)."""

from __future__ import annotations

import dataclasses

from runner.store.api import Graph, Store, location
from runner.store.model import ServerOptions


def is_server(where: str) -> bool:
    """Whether ``where`` names a Gremlin Server (``ws://``, ``wss://``) or a gremlite file."""
    return where.startswith(("ws://", "wss://"))


def open_graph(where: str, server: ServerOptions | None = None) -> Graph:
    """The graph at ``where``: a Gremlin Server's URL (the server driver, ``server`` its
    options) or a gremlite file path (the embedded driver, which checks what it relies on in
    gremlite before anything is written: :mod:`runner.store.embedded.schema`)."""
    if is_server(where):
        from runner.store.server.probe import open_server
        return open_server(where, server or ServerOptions())
    from runner.store.embedded.graph import EmbeddedGraph
    return EmbeddedGraph(where)


def open_store(where: str, *, check_format: bool = True, atomicity: str | None = None,
               server: ServerOptions | None = None) -> Store:
    """The store at ``where`` (see :func:`open_graph`), its store format checked
    (``check_format=False``: the migration's own way in); ``atomicity`` overrides
    ``server.atomicity``. The graph is closed again when the store cannot be opened."""
    if atomicity is not None:
        server = dataclasses.replace(server or ServerOptions(), atomicity=atomicity)
    return store_on(open_graph(where, server), check_format=check_format)


def store_on(graph: Graph, *, check_format: bool = True) -> Store:
    """The store over an open ``graph`` (closed again when its format is refused)."""
    from runner.store import migrations
    from runner.store.gremlin.store import GraphStore
    try:
        if check_format:
            migrations.open_format(graph, location(graph))
        return GraphStore(graph, format_version=migrations.CURRENT)
    except BaseException:
        graph.close()
        raise
