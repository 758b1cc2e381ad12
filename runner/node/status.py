"""What ``cluster status`` answers: members, master, held task locks, the configured
concurrency levels' use, the resources and ordering keys held now, the MASTER commands being
handled (``commands``: id, command, member, age), and the open incidents."""

from __future__ import annotations

import time
from urllib.parse import unquote

from coord import Session, exclusive_holders, held_locks, holders, read_leader, read_members
from messaging import ZkProcessedLog
from runner.config import Settings
from runner.replies import (
    ClusterStatus,
    CommandInFlight,
    IncidentView,
    LevelView,
    LockView,
    MemberView,
)
from runner.store import Store
from runner.tasks.worker.claim import slot_name


def cluster_status(session: Session, settings: Settings, member_id: str,
                   store: Store) -> ClusterStatus:
    now = time.time()
    groups = holders(session, "group")
    return ClusterStatus(
        cluster=settings.cluster,
        answered_by=member_id,
        master=read_leader(session),
        members=[MemberView(id=m.member_id, host=m.host, pid=m.pid, version=m.version)
                 for m in read_members(session).values()],
        locks=[LockView(task=h.task_id, owner=h.owner, token=h.token,
                        age_s=round(now - h.since, 1)) for h in held_locks(session)],
        # the slot levels a claim books (runner.tasks.claim.levels)
        concurrency=[LevelView(group=group, limit=limit,
                               used=len(groups.get(slot_name(group), [])))
                     for group, limit in sorted(settings.concurrency.items())],
        resources={unquote(k): [v] for k, v in exclusive_holders(session, "resource").items()},
        ordering_keys={unquote(k): [v] for k, v in exclusive_holders(session, "key").items()},
        commands=[CommandInFlight.model_validate({**c, "age_s": round(now - c.pop("since"), 1)})
                  for c in ZkProcessedLog(session).handling()],
        incidents=[IncidentView.model_validate(i.view()) for i in store.incidents.open()],
        workflows=store.workflows.counts(),
    )
