"""Members and tasks of an older store format, made visible and brought to the current one.

After ``latchwork store migrate`` a node of an older release can still join the cluster: the
releases before store formats existed check nothing, and new code cannot stop an old node from
locking, claiming or winning the latch. What new code does (docs/graph.md, "Upgrading"):

* **Members advertise the format they write** (``store_format`` in their membership data). A
  member that advertises another one, or none (a release before formats), is raised as an
  incident ``member_format`` naming it, its version and what to do, by every new node when it
  joins (it may find an old master, which raises nothing) and by a new master every round (for
  members that join later). The incident resolves itself when that member has left or
  advertises the current format.
* **Tasks in an older layout.** A node of a release before format 2 writes an open task with
  ``task_queue = "open"``: in no ready bucket, so no new node's scan finds it (it waited with
  no attempt, silently). The master looks them up every round (one equality lookup on an
  indexed property, nothing found in a cluster without old nodes; at most :data:`PAGE` tasks a
  round) and rewrites each with today's layout, as the migration steps would, guarded by its
  version and its old queue; a task it cannot read is raised as an incident ``old_layout``.
  Each task so moved is logged with its id.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from coord import CoordError, MemberInfo, Session, read_members
from runner.errors import StoreError
from runner.store import Incident, Store, migrations

log = logging.getLogger("latchwork.master")

MEMBER_FORMAT = "member_format"
OLD_LAYOUT = "old_layout"
#: the membership data key a member advertises its store format under
FORMAT_KEY = "store_format"
#: old-layout tasks brought to the current layout per round
PAGE = 200


def foreign(info: MemberInfo) -> bool:
    """Whether a member writes a store format other than this release's (none: older)."""
    return info.details.get(FORMAT_KEY) != migrations.CURRENT


def describe(info: MemberInfo) -> str:
    advertised = info.details.get(FORMAT_KEY)
    writes = f"store format {advertised}" if advertised is not None else \
        "no store format (a release from before store formats)"
    return (f"member {info.member_id} (latchwork {info.version or 'unknown'}) writes {writes}; "
            f"this cluster's graph is at format {migrations.CURRENT}: its tasks may sit where "
            "no node finds them. Stop it and start it with the release the graph was "
            "migrated for")


def raise_foreign_members(store: Store, members: Mapping[str, MemberInfo],
                          by: str) -> list[str]:
    """Raise ``member_format`` for each member of another format (each once: the incident's
    key is the member's); the ids raised."""
    raised = []
    for member_id, info in members.items():
        if foreign(info):
            incident, created = store.incidents.raise_(member_id, MEMBER_FORMAT, member_id,
                                                       describe(info))
            if created:
                log.warning("member %s: incident %s: %s", by, incident.key, incident.detail)
            raised.append(member_id)
    return raised


def check_on_join(session: Session, store: Store, member_id: str) -> None:
    """What a node checks as it joins: a member of another format (an old master among them,
    which raises nothing itself) is raised as an incident and logged. Never fails the
    start: an unreadable membership or graph is logged and left to the master's rounds."""
    try:
        raise_foreign_members(store, read_members(session), member_id)
    except (CoordError, StoreError) as exc:
        log.warning("member %s: could not check the members' store formats: %s", member_id,
                    exc)


class LayoutWatch:
    """The master's round over members and tasks of older formats (see the module)."""

    def __init__(self, session: Session, store: Store, member_id: str,
                 interval: float = 5.0) -> None:
        self.session = session
        self.store = store
        self.member_id = member_id
        self.interval = interval
        self._next = 0.0

    def tick(self) -> None:
        if time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self.interval
        try:
            members = read_members(self.session)
        except CoordError as exc:
            log.warning("member %s (master): membership unreadable: %s", self.member_id, exc)
            return
        raise_foreign_members(self.store, members, self.member_id)
        self._resolve(members)
        self.move_old_tasks()

    def _resolve(self, members: Mapping[str, MemberInfo]) -> None:
        for incident in self.store.incidents.open():
            if incident.kind != MEMBER_FORMAT:
                continue
            info = members.get(incident.task_id)
            if (info is None or not foreign(info)) and self.store.incidents.resolve(incident):
                log.info("member %s (master): incident %s resolved", self.member_id,
                         incident.key)

    def move_old_tasks(self) -> int:
        """Bring up to :data:`PAGE` tasks written with ``task_queue = "open"`` to today's
        layout (:meth:`~runner.store.gremlin.tasks.GremlinTaskStore.move_old_layout`); how
        many. One it cannot read is raised as an incident."""
        moved, unreadable = self.store.tasks.move_old_layout(PAGE)
        for task in moved:
            log.warning("member %s (master): task %s (%s) was written in an older store "
                        "layout (task_queue 'open', in no ready bucket: by a node of an "
                        "older release); brought to format %d", self.member_id, task.id,
                        task.type, migrations.CURRENT)
        for task_id, why in unreadable:
            incident, created = self.store.incidents.raise_(
                task_id, OLD_LAYOUT, "unreadable",
                f"task {task_id} is in an older store layout this release cannot read "
                f"({why}): run `latchwork store migrate --force` or recreate it")
            if created:
                log.warning("member %s (master): incident %s", self.member_id, incident.key)
        return len(moved)


def left_to_layout(incident: Incident) -> bool:
    """Whether ``incident`` is this module's to resolve (not the incident round's)."""
    return incident.kind == MEMBER_FORMAT
