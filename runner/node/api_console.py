"""The API's requests behind the web console's lists (``latchwork web``): a filtered page of
tasks newest first (``task.search``), their counts per state (``task.counts``) and the
streams with their state (``stream.list``). Each reads a page or a count, never a whole table:
:mod:`runner.store.gremlin.search` says how.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from coord import Session, VersionedRegister
from messaging import HandlerContext
from runner.node.api_outside import api
from runner.replies import SearchPage, StreamInfo, TaskView
from runner.requests import StreamList, TaskCounts, TaskSearch
from runner.store import Store, TaskFilter
from runner.tasks.features import streams
from runner.tasks.features.streams import StreamRegistry


class ConsoleHost(Protocol):
    session: Session
    streams: StreamRegistry

    @property
    def store(self) -> Store: ...


def _filter(req: TaskSearch | TaskCounts,
            state: str | Sequence[str] | None = None) -> TaskFilter:
    return TaskFilter(type=_any(req.type), state=_any(state), owner=_any(req.owner),
                      ordering_key=_any(req.ordering_key), resource=req.resource)


def _any(value: str | Sequence[str] | None) -> str | tuple[str, ...] | None:
    return value if value is None or isinstance(value, str) else tuple(value)


class ConsoleApi:
    """The handlers of the module's requests (mixed into the node's API)."""

    node: ConsoleHost

    @api(TaskSearch)
    def task_search(self, ctx: HandlerContext, req: TaskSearch) -> SearchPage:
        page = self.node.store.search.page(_filter(req, req.state), req.before, req.limit)
        running = {t.id for t in page.tasks if t.owner and t.status.value == "RUNNING"}
        progress = ({a.task_id: a.progress for a in self.node.store.attempts.running()
                     if a.task_id in running} if running else {})
        return SearchPage(tasks=[TaskView.of(t, progress.get(t.id)) for t in page.tasks],
                        next=page.next)

    @api(TaskCounts)
    def task_counts(self, ctx: HandlerContext, req: TaskCounts) -> dict[str, int]:
        return self.node.store.search.counts(_filter(req))

    @api(StreamList)
    def stream_list(self, ctx: HandlerContext, req: StreamList) -> list[StreamInfo]:
        found = []
        for name in self.node.streams.names():
            definition = self.node.streams.get(name)
            state, version = VersionedRegister(self.node.session,
                                               f"handlers/{name}/state").get()
            found.append(StreamInfo(stream=name, inputs=list(definition.inputs),
                                    output=definition.output,
                                    description=definition.description, version=version,
                                    state=state, copies=streams.copies(self.node.session, name)))
        return found
