"""What the store changes of gremlinpython's driver (3.7) for a remote graph
(:class:`~runner.store.server.graph.RemoteGraph`): requests answered in the calling thread
(:func:`lean`), reads answered in GraphSON 3 on the same connections
(:func:`graphson_reads`), and a deadline on every connect (:class:`DeadlineTransport`); the
encodings themselves are in :mod:`runner.store.server.wire`. Each keeps
the driver's requests and answers, and leaves the driver as it is where its internals are not
the ones this was written for. What they saved is in docs/runner.md ("The driver's share").

Failure behaviour: what the driver raises is raised (a cut connection, a deadline passed, a
server's error), and a connection goes back to its pool whatever happened, as the driver's
own reader puts it back.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp
from gremlin_python.driver import request
from gremlin_python.driver.aiohttp.transport import AiohttpTransport
from gremlin_python.driver.client import Client
from gremlin_python.driver.driver_remote_connection import DriverRemoteConnection
from gremlin_python.driver.remote_connection import RemoteTraversal
from gremlin_python.driver.resultset import ResultSet
from gremlin_python.process.traversal import Bytecode

from runner.errors import StoreSchemaUnknown
from runner.store.server.wire import GraphSONReader

#: the gremlinpython minor whose driver internals this module reworks (the pin in
#: pyproject.toml says the same)
GREMLINPYTHON = "3.7."


def check_version() -> None:
    """The installed gremlinpython is the minor this driver was written for: another one's
    driver internals (connections, serializers) may differ, so it is refused in one line."""
    from importlib import metadata

    installed = metadata.version("gremlinpython")
    if not installed.startswith(GREMLINPYTHON):
        raise StoreSchemaUnknown(
            f"gremlinpython {installed} is installed; the Gremlin Server driver was tested "
            f"with gremlinpython {GREMLINPYTHON}x: install that (pip install "
            f"'gremlinpython>={GREMLINPYTHON}0,<3.8')")


class DeadlineTransport(AiohttpTransport):  # type: ignore[misc]  # untyped driver
    """The driver's websocket transport whose connect has the read deadline too, and which
    closes itself when the connect fails.

    The driver's own connect has none: aiohttp's session waits up to 300 s for the handshake,
    so a new connection over a link that went silent (nothing answers, nothing is closed) held
    a read or write that far past its deadline, and every other caller waiting for the
    store's lock with it. A connect that failed left its transport (an event loop and a
    session) open; the garbage collector closed it later, in whatever thread it ran."""

    def connect(self, url: str, headers: Any = None) -> None:
        async def connect() -> None:
            self._client_session = aiohttp.ClientSession()
            async with asyncio.timeout(self._read_timeout):
                self._websocket = await self._client_session.ws_connect(
                    url, **self._aiohttp_kwargs, headers=headers)

        try:
            self._loop.run_until_complete(connect())
        except BaseException as exc:
            self.close()
            if isinstance(exc, aiohttp.ClientResponseError) and exc.status == 403:
                # the driver's own words: the error's text may hold the credentials
                raise Exception("Failed to connect to server: HTTP Error code 403 - "
                                "Forbidden.") from None
            raise


def deadline_transports(options: dict[str, Any]) -> Callable[[], DeadlineTransport]:
    """A ``transport_factory`` for ``DriverRemoteConnection`` that makes what its default one
    makes from the same ``options`` (``read_timeout``, ``write_timeout``, ``ssl_options``),
    as :class:`DeadlineTransport`."""
    kept = {key: options[key] for key in ("read_timeout", "write_timeout", "ssl_options")
            if key in options}
    return functools.partial(DeadlineTransport, max_content_length=10 * 1024 * 1024, **kept)


def lean(remote: DriverRemoteConnection) -> DriverRemoteConnection:
    """``remote`` (a ``DriverRemoteConnection``) whose requests are sent and answered in the
    calling thread, without the driver's three debug lines per request.

    The driver hands every request to its thread pool twice (one task writes it, another
    reads the answer) and back through three futures: 10% of a node's samples under load
    (``ThreadPoolExecutor.submit`` and ``Condition.notify``), a read's client CPU 720 us
    against 430-545 us here; its debug lines, whose text it formats before it asks whether
    debug is on, cost 6%. Here the caller takes a connection from the same pool, writes the
    request and reads its answer with the driver's own protocol and transport (their
    deadlines, ``read_timeout`` and ``write_timeout``, apply as before), and puts the
    connection back. A caller inside a running event loop goes the driver's way (the
    transport runs a loop of its own, which cannot run inside another in one thread). Left as
    it is when debug logging of ``gremlinpython`` is on."""
    client: Client | None = getattr(remote, "_client", None)
    if client is None or logging.getLogger("gremlinpython").isEnabledFor(logging.DEBUG) or \
            not all(hasattr(client, name) for name in ("_pool", "_traversal_source",
                                                       "_session_enabled", "is_closed",
                                                       "submit")):
        return remote
    caller = _InCaller(remote, client)
    client.submit_async = caller.submit_async
    remote.submit = caller.submit
    remote._latchwork_caller = caller
    return remote


def graphson_reads(remote: DriverRemoteConnection) -> DriverRemoteConnection | None:
    """A remote connection for a traversal source of reads (``with_remote``) that sends its
    requests on ``remote``'s connections (a :func:`lean` one; None for any other) in GraphSON 3,
    so that they are answered in GraphSON 3 and decoded by :class:`GraphSONReader`; ``remote``'s
    own requests stay GraphBinary (a write's bytecode costs the client a third less in it).

    One pool serves both: a connection is held by one caller from the pool's get to its put,
    and the serializer of its protocol is chosen for that request and put back after it, so a
    connection the server dropped is found and replaced by whichever request meets it first
    (two pools, one for each, left dead connections in one after a server restart: the first
    write after it failed). Only a server that answers GraphSON 3 may be given these: see
    ``RemoteGraph``, which asks once."""
    caller = getattr(remote, "_latchwork_caller", None)
    return None if caller is None else _GraphSONRemote(caller)


class _GraphSONRemote:
    """The read half of :func:`graphson_reads`: what ``RemoteStrategy`` asks of a remote
    connection, the requests in GraphSON 3."""

    def __init__(self, caller: _InCaller) -> None:
        self.caller = caller
        self.serializer = GraphSONReader()

    def submit(self, bytecode: Bytecode) -> Any:
        if asyncio._get_running_loop() is not None:  # a caller inside an event loop
            return self.caller.submit(bytecode)
        return RemoteTraversal(iter(self.caller.answered(bytecode, self.serializer)))

    def submit_async(self, bytecode: Bytecode) -> Any:
        return self.caller.remote.submit_async(bytecode)

    def is_session_bound(self) -> bool:
        return False


class _InCaller:
    """The requests of one ``DriverRemoteConnection``, sent and answered in the caller's
    thread (:func:`lean`)."""

    def __init__(self, remote: DriverRemoteConnection, client: Client) -> None:
        self.remote = remote
        self.client = client

    def message(self, message: Any, bindings: Any, request_options: Any) -> Any:
        """The request the driver's ``Client.submit_async`` sends for ``message``."""
        client = self.client
        args: dict[str, Any] = {"gremlin": message, "aliases": {"g": client._traversal_source}}
        processor, op = ("traversal", "bytecode") if isinstance(message, Bytecode) \
            else ("", "eval")
        if isinstance(message, str) and bindings:
            args["bindings"] = bindings
        if client._session_enabled:
            args["session"] = str(client._session)
            processor = "session"
        sent = request.RequestMessage(processor=processor, op=op, args=args)
        if request_options:
            sent.args.update(request_options)
        return sent

    def submit_async(self, message: Any, bindings: Any = None,
                     request_options: Any = None) -> Any:
        """The driver's way, less its debug lines (a session's requests, scripts)."""
        if self.client.is_closed():
            raise Exception("Client is closed")
        return self.client._pool.get(True).write(self.message(message, bindings,
                                                              request_options))

    def submit(self, bytecode: Bytecode) -> Any:
        if asyncio._get_running_loop() is not None:  # a caller inside an event loop
            options = self.remote._extract_request_options(bytecode)
            return RemoteTraversal(iter(self.client.submit(bytecode, request_options=options)
                                        .all().result()))
        return RemoteTraversal(iter(self.answered(bytecode)))

    def answered(self, bytecode: Bytecode, serializer: Any = None) -> list[Any]:
        """The results of ``bytecode``, sent and read in this thread (in ``serializer``'s
        format when one is given, the connection's own otherwise)."""
        client = self.client
        if client.is_closed():
            raise Exception("Client is closed")
        sent = self.message(bytecode, None, self.remote._extract_request_options(bytecode))
        connection = client._pool.get(True)
        request_id = str(uuid.uuid4())
        answer = ResultSet(queue.Queue(), request_id)
        protocol = connection._protocol
        own = protocol._message_serializer
        try:
            if not connection._inited:
                connection.connect()
            if serializer is not None:
                protocol._message_serializer = serializer
            connection._results[request_id] = answer
            protocol.write(request_id, sent)
            while protocol.data_received(connection._transport.read(),
                                         connection._results) == 206:
                pass
        finally:
            protocol._message_serializer = own
            connection._results.pop(request_id, None)
            client._pool.put_nowait(connection)
        results: list[Any] = []
        while not answer.stream.empty():
            results += answer.stream.get_nowait()
        return results
