"""The API's requests that reach the cluster's own machinery from the outside: the commands and
broadcasts the live nodes declare (``command.list``), and a stream's queues, fed and read by
clients (``stream.push``, ``stream.read``). Also :func:`api`, the mark of an API handler.

A queue element is bytes; on the wire it is JSON: a pushed value is stored as its JSON text
(UTF-8), or as its own text when ``raw``; a read element is given back as ``value`` when its
bytes are JSON, ``text`` when they are other UTF-8, ``base64`` otherwise.

Failure behaviour: a value (or a push's values together) over the element limit is refused
(``stream_element_too_large``); a read from an index the retention pruned fails with
``stream_index_expired``; ZooKeeper out of reach past the calls' retries fails the request
(nothing is pushed: a push is one transaction).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Protocol, TypeVar

from coord import LockFreeQueue, QueueElementTooLarge, QueueIndexExpired, Session, read_members
from messaging import HandlerContext
from runner.errors import StreamElementTooLarge, StreamIndexExpired
from runner.replies import CommandView, Element, Pushed, StreamPage
from runner.requests import CommandList, Request, StreamPush, StreamRead

F = TypeVar("F", bound=Callable[..., object])


def api(model: type[Request[object]]) -> Callable[[F], F]:
    """Mark an API method (:class:`~runner.node.api.NodeApi`) as the handler of
    ``model.command``."""
    def mark(method: F) -> F:
        method.__dict__["api_request"] = model
        return method
    return mark


class OutsideHost(Protocol):
    session: Session


def element_view(index: int, data: bytes) -> Element:
    """One queue element as the API shows it (see the module)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return Element(index=index, base64=base64.b64encode(data).decode())
    try:
        return Element(index=index, value=json.loads(text))
    except ValueError:
        return Element(index=index, text=text)


class OutsideApi:
    """The handlers of the module's requests (mixed into the node's API)."""

    node: OutsideHost

    @api(CommandList)
    def command_list(self, ctx: HandlerContext, req: CommandList) -> list[CommandView]:
        """Every command and broadcast a live node declares (read from their membership
        entries), with the members declaring it."""
        found: dict[str, CommandView] = {}
        members: dict[str, list[str]] = {}
        for member_id, info in sorted(read_members(self.node.session).items()):
            for declared in info.details.get("commands", []):
                command = CommandView.model_validate(declared)
                found.setdefault(command.name, command)
                members.setdefault(command.name, []).append(member_id)
        return [found[name].model_copy(update={"members": members[name]})
                for name in sorted(found)]

    @api(StreamPush)
    def stream_push(self, ctx: HandlerContext, req: StreamPush) -> Pushed:
        """Append the values in one transaction; with a token, once."""
        values = [str(v).encode() if req.raw else json.dumps(v).encode() for v in req.values]
        queue = LockFreeQueue(self.node.session, req.queue)
        token = req.token or ctx.message_id.hex  # a redelivered request pushes once too
        try:
            indexes = queue.push_many(values, token)
        except QueueElementTooLarge as exc:
            raise StreamElementTooLarge(str(exc)) from exc
        return Pushed(queue=req.queue, indexes=indexes)

    @api(StreamRead)
    def stream_read(self, ctx: HandlerContext, req: StreamRead) -> StreamPage:
        """Up to ``limit`` elements from ``start`` (to the first empty slot), and where the
        next read starts."""
        queue = LockFreeQueue(self.node.session, req.queue)
        try:
            elements = [element_view(i, data) for i, data in queue.read(req.start, req.limit)]
        except QueueIndexExpired as exc:
            raise StreamIndexExpired(f"queue {req.queue}: {exc}") from exc
        following = elements[-1].index + 1 if elements else req.start
        return StreamPage(queue=req.queue, elements=elements, next=following)
