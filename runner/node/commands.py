"""The node's built-in commands and broadcasts, declared like a user's (``@command``,
``@broadcast``) and loaded first, so a user's module that takes one of their names fails the
start:

* ``SYNCHRONIZE_MODEL`` and ``ONTOLOGY_CHANGED`` (MASTER): load new or changed ontologies;
* ``TRIGGER_SCAN`` (MODEL): scan for tasks now (a task was submitted, or locks were freed),
  from ``behind`` on when it says (a write that may have landed late); on a reconnect, scan;
* ``UPDATE_CACHE`` (MODEL): reload the ontology cache; on a reconnect, reload it.
"""

from __future__ import annotations

import logging
from datetime import datetime

from messaging import HandlerContext
from runner.ontology import OntologyCache, OntologySync
from runner.tasks import Services, broadcast, command
from runner.tasks.worker.loop import TaskLoop
from runner.templates import JsonObject

log = logging.getLogger("latchwork.node")


@command("SYNCHRONIZE_MODEL", description="load new or changed ontologies (the master)")
def synchronize(ctx: HandlerContext, payload: JsonObject) -> None:
    ctx.services.get(OntologySync).synchronize(message_id=str(ctx.message_id))


@command("ONTOLOGY_CHANGED", description="an ontology source changed: load it (the master)")
def ontology_changed(ctx: HandlerContext, payload: JsonObject) -> None:
    ctx.services.get(OntologySync).synchronize(message_id=str(ctx.message_id))


def _scan(services: Services, behind: datetime | None = None) -> None:
    services.get(TaskLoop).trigger(behind)


@broadcast("TRIGGER_SCAN", description="scan for tasks now", on_reconnect=_scan)
def trigger_scan(ctx: HandlerContext, payload: JsonObject) -> None:
    """``behind`` (ISO time, optional): the tasks written were ready from then on, maybe behind
    the scans' cursors (a write that landed late)."""
    behind = None
    text = payload.get("behind")
    if isinstance(text, str):
        try:
            behind = datetime.fromisoformat(text)
        except ValueError:
            log.warning("TRIGGER_SCAN: behind %r is not an ISO time; ignored", text)
    _scan(ctx.services, behind if behind is not None and behind.tzinfo is not None else None)


def _reload(services: Services, why: str = "") -> None:
    cache = services.get(OntologyCache)
    cache.reload(services.get(TaskLoop).store)
    log.info("member %s: ontology cache reloaded (%d classes)%s",
             services.get(TaskLoop).member_id, cache.size, why)


def _reload_after_reconnect(services: Services) -> None:
    _reload(services, " after the MODEL connection came back")


@broadcast("UPDATE_CACHE", description="reload the ontology cache",
           on_reconnect=_reload_after_reconnect)
def update_cache(ctx: HandlerContext, payload: JsonObject) -> None:
    _reload(ctx.services)
