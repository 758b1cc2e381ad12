"""The master's workflow round: what a submit left half-done is finished or removed.

* a workflow committed whose roots were not all made claimable (the submitting node killed
  between the commit and its last root): its roots are activated here, a page at a time, as
  the submit would have;
* a workflow whose deadline passed: every member that has not started is stopped ("its
  workflow's deadline passed"), running ones finish, and its ``on_failure`` step starts;
* a running workflow every member of which finished is marked ``succeeded`` (up to 100 a
  round: what consoles and metrics count as running);
* a workflow left ``open`` (its submit cut off before its last page, and never sent again) for
  :data:`OPEN_FOR` seconds: its members (never claimable) and its vertex are removed. A resend
  with the same key after that begins it again; one that comes while it is being removed is
  refused and may be sent again.

One round is two index lookups when there is nothing to do. Failure behaviour: a store error
ends the round (logged by the duties' runner); the next round takes it up again (every step is
idempotent).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from runner.store import Store, codec

log = logging.getLogger("latchwork.master")

#: seconds a workflow may stay open (submitted in part, never committed) before the master
#: removes its members
OPEN_FOR = 600.0


class WorkflowRound:
    """See the module; ``tick`` is one round."""

    def __init__(self, store: Store, member_id: str, open_for: float = OPEN_FOR) -> None:
        self.store = store
        self.member_id = member_id
        self.open_for = open_for

    def tick(self) -> tuple[int, int]:
        """(members removed, roots activated) this round."""
        left, committed = self.store.workflows.stale(
            codec.now() - timedelta(seconds=self.open_for))
        removed = activated = 0
        for wf in left:
            gone = self.store.workflows.remove(wf.id)
            removed += gone
            log.warning("member %s (master): workflow %s (key %r) was left open since %s: "
                        "%d members removed", self.member_id, wf.id, wf.key,
                        wf.created_at.isoformat(), gone)
        for wf in committed:
            while (done := self.store.workflows.activate(wf.id)) > 0:
                activated += done
            log.info("member %s (master): workflow %s: its last roots activated",
                     self.member_id, wf.id)
        for wf in self.store.workflows.due(codec.now()):
            self.enforce(wf.id, wf.deadline.isoformat() if wf.deadline else "")
        for wf_id in self.store.workflows.settle():
            log.info("member %s (master): workflow %s succeeded", self.member_id, wf_id)
        return removed, activated

    def enforce(self, workflow_id: str, deadline: str) -> int:
        """Stop what of the workflow has not started (its deadline passed), then start its
        ``on_failure`` step; how many members were stopped."""
        stopped = 0
        for task in self.store.workflows.members(workflow_id):
            if task.on_failure or not task.open or task.attempts:
                continue
            if self.store.tasks.stop_unstarted(
                    task.id, f"its workflow's deadline passed ({deadline})") is not None:
                stopped += 1
        started = self.store.workflows.start_on_failure(workflow_id)
        self.store.workflows.enforced(workflow_id)
        log.warning("member %s (master): workflow %s: its deadline %s passed: %d members "
                    "that had not started stopped%s", self.member_id, workflow_id, deadline,
                    stopped, ", its on_failure step started" if started else "")
        return stopped
