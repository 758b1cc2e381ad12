"""Group commit of attempt ends: the ends of several attempts written in one store write, their
locks released in one ZooKeeper transaction, then the loop told.

A worker whose handler returned hands its :class:`~runner.tasks.worker.running.Ending` to
:meth:`GroupCommit.submit` and is free at once (or, for a task whose next step needs the end
written first, an ordering key's chain, waits: :meth:`GroupCommit.conclude`). The commit
thread writes whatever is queued, up to ``max_items`` at a time, as one write
(:meth:`~runner.store.Store.conclude_many`: one transaction on the embedded graph, one
traversal on a Gremlin Server); an idle node writes a single end at once, a busy one writes a
group of every end that arrived during the last write (the classic group commit: no timer, the
write itself is the flush period). Then it releases the group's task locks in one ZooKeeper
transaction (:meth:`~coord.TaskLock.release_all`) and calls ``on_ended`` for each (the slot is
done). The attempt's observers (its log line, metrics, traces) hear each end as soon as it is
written or given up, before the release: a release waits for ZooKeeper, which a cut-off link
can hold back for as long as the cut lasts, and the log would then show the handler running
long after it stopped. So nothing reports an end the store does not have, no end is reported
late, and no other node can claim a task before its end is written.

Each end is guarded on its own: one that is refused (its attempt closed by the master or an
operator, a stale token, a resource taken) is settled alone, the rest of its group is written.

Failure behaviour:

* the graph unreachable (or any other error of the write): the group is written again with
  backoff (one write for it and what queued meanwhile) for ``store_retry_for`` seconds from
  each end's arrival and while its lock is still held; past that the end is given up: its
  attempt stays RUNNING (the master closes it as superseded), its lock is released, the task
  runs again;
* a success refused because another attempt took one of its resources meanwhile (its hold was
  lost with its session): written CANCELLED_BY_SYSTEM instead, the task runs again;
* a node killed -9 with ends queued: their attempts are still RUNNING, closed
  CANCELLED_BY_SYSTEM by the master's reaper, and the tasks run again, as for any node killed
  while running a task (docs/reliability.md: the window this queue adds).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from coord import CoordError, TaskLock
from runner.errors import (
    AttemptAlreadyFinished,
    CommitConflict,
    ResourceTaken,
    StaleFencingToken,
    StoreError,
    StoreUnavailable,
)
from runner.store import AttemptStatus, Conclusion, Store, Task
from runner.tasks.outcomes import Outcome, task_changes
from runner.tasks.worker.running import Ending

log = logging.getLogger("latchwork.tasks")

#: told for each end once written and its lock released: the ending, the outcome written, the
#: task as written (None when unknown), and the status and error the attempt shows
OnEnded = Callable[[Ending, Outcome, Task | None, tuple[AttemptStatus, str | None]], None]
LOST = AttemptStatus.CANCELLED_BY_SYSTEM


@dataclass(eq=False)
class _Queued:
    ending: Ending
    since: float
    done: threading.Event = field(default_factory=threading.Event)
    outcome: Outcome = Outcome.CANCELLED
    observed: bool = False  # its attempt's observers heard its end


class GroupCommit:
    """The ends of one node's attempts, written in groups (see the module). ``stats``:
    ``groups`` written, ``concluded`` ends in them, the ``largest`` group."""

    def __init__(self, store: Store, member_id: str, on_ended: OnEnded, *,
                 max_items: int = 64, store_retry_for: float = 60.0) -> None:
        self.store = store
        self.member_id = member_id
        self.on_ended = on_ended
        self.max_items = max_items
        self.store_retry_for = store_retry_for
        self.stats = {"groups": 0, "concluded": 0, "largest": 0}
        self._queue: list[_Queued] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"ends-{member_id}",
                                        daemon=True)
        self._thread.start()

    def submit(self, ending: Ending) -> None:
        """Queue ``ending`` for the next group; returns at once."""
        self._put(_Queued(ending, time.monotonic()))

    def conclude(self, ending: Ending) -> Outcome:
        """Queue ``ending`` and wait until it is written and told; the outcome written."""
        item = _Queued(ending, time.monotonic())
        self._put(item)
        item.done.wait()
        return item.outcome

    def pending(self) -> int:
        with self._cond:
            return len(self._queue)

    def _put(self, item: _Queued) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("the group commit is closed")
            self._queue.append(item)
            self._cond.notify()

    def close(self, timeout: float = 20.0) -> None:
        """Write what is queued (within ``timeout``), then stop."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("member %s: %d attempt ends not written within %gs", self.member_id,
                      self.pending(), timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                group = self._queue[:self.max_items]
                del self._queue[:len(group)]
            try:
                self._settle(group)
            except Exception:
                log.exception("member %s: writing a group of %d attempt ends failed",
                              self.member_id, len(group))
                self._release([q for q in group if not q.done.is_set()])
                for item in group:
                    if not item.done.is_set():
                        self._told(item, Outcome.CANCELLED, None,
                                   (LOST, "its end could not be written"))

    def _settle(self, group: list[_Queued]) -> None:
        """Write the group's ends, release their locks in one transaction, tell each."""
        results = self._write([q for q in group if q.ending.conclusion is not None])
        self.stats["groups"] += 1
        self.stats["concluded"] += len(group)
        self.stats["largest"] = max(self.stats["largest"], len(group))
        settled = [(q, *self._settled(q, results.get(id(q)))) for q in group]
        for q, _, _, ended in settled:  # written (or given up): logged and observed now,
            self._observed(q, ended)    # not when a lock's release gets through to ZooKeeper
        self._release(group)
        for q, outcome, task, ended in settled:
            self._told(q, outcome, task, ended)

    def _observed(self, q: _Queued, ended: tuple[AttemptStatus, str | None]) -> None:
        """The observers of ``q``'s attempt hear its end (what the store holds, or that it
        was given up), once."""
        if q.observed:
            return
        q.observed = True
        try:
            q.ending.tell(*ended)
        except Exception:
            log.exception("member %s: telling the end of task %s failed", self.member_id,
                          q.ending.claim.task.id)

    def _release(self, group: list[_Queued]) -> None:
        """The group's task locks, in one transaction; one that cannot be released now goes
        with its session (logged, not raised)."""
        try:
            TaskLock.release_all([q.ending.slot.lock for q in group])
        except CoordError as exc:
            log.info("member %s: releasing %d task locks: %s", self.member_id, len(group), exc)

    def _write(self, items: list[_Queued]) -> dict[int, Task | StoreError]:
        """``conclude_many`` of the items; the graph out of reach (or any other error of the
        write): again with backoff, each item for ``store_retry_for`` from its arrival and
        while its lock is held."""
        delay = 0.1
        found: dict[int, Task | StoreError] = {}
        while items:
            try:
                answers = self.store.conclude_many([q.ending.conclusion  # type: ignore[misc]
                                                    for q in items])
            except Exception as error:
                exc = error if isinstance(error, StoreUnavailable) else None
                if exc is None:  # a fault of the write itself: tried again like the graph out
                    # of reach (given up at once, the locks went and the tasks ran again)
                    log.exception("member %s: writing %d attempt ends failed", self.member_id,
                                  len(items))
                    exc = StoreUnavailable(f"the write of the ends failed: {error!r}")
                now = time.monotonic()
                for q in [q for q in items if now + delay > q.since + self.store_retry_for
                          or not q.ending.slot.lock.is_held]:
                    found[id(q)] = exc
                    items.remove(q)
                if items:
                    log.warning("member %s: cannot write %d attempt ends (%s); trying again "
                                "in %.1fs", self.member_id, len(items), exc, delay)
                    time.sleep(delay)
                    delay = min(2.0, delay * 2)
                continue
            found.update((id(q), answer) for q, answer in zip(items, answers, strict=True))
            break
        return found

    def _settled(self, q: _Queued, answer: Task | StoreError | None
                 ) -> tuple[Outcome, Task | None, tuple[AttemptStatus, str | None]]:
        """What a written (or refused) end leaves: the outcome, the task, what the attempt
        shows."""
        ending = q.ending
        if ending.conclusion is None:  # nothing to write
            return ending.outcome, None, ending.ended
        if isinstance(answer, Task):
            return ending.outcome, answer, (ending.conclusion.status, ending.result.error)
        task = ending.claim.task
        if isinstance(answer, StoreUnavailable):
            log.error("member %s: task %s (%s): the end of its attempt could not be written "
                      "for %gs (%s); the task stays open and is run again (its attempt is "
                      "closed as superseded)", self.member_id, task.id, task.type,
                      self.store_retry_for, answer)
            return Outcome.CANCELLED, None, (LOST, f"its end could not be written: {answer}")
        if isinstance(answer, ResourceTaken):
            log.warning("member %s: task %s (%s) attempt %d: its success is not recorded: %s",
                        self.member_id, task.id, task.type, ending.claim.attempt.seq, answer)
            return self._written_lost(ending, f"cancelled by system: {answer}")
        if isinstance(answer, StaleFencingToken):
            log.warning("member %s: task %s was taken over by another owner; leaving it",
                        self.member_id, task.id)
            return Outcome.CANCELLED, None, (LOST, f"cancelled by system: superseded ({answer})")
        if isinstance(answer, AttemptAlreadyFinished):
            log.warning("member %s: the attempt of task %s was closed by the master meanwhile "
                        "(or by an operator); leaving the task to them", self.member_id,
                        task.id)
            try:  # what that close wrote (an operator's CANCELLED, the reaper's reason)
                current = self.store.attempts.get(ending.claim.attempt.id)
                return Outcome.CANCELLED, None, (current.status, current.error)
            except StoreError:
                return Outcome.CANCELLED, None, (
                    LOST, "closed by someone else before its end was written")
        log.error("member %s: could not record the end of task %s: %s", self.member_id,
                  task.id, answer)
        why = "commit conflicts" if isinstance(answer, CommitConflict) else str(answer)
        return Outcome.CANCELLED, None, (LOST, f"its end could not be written: {why}")

    def _written_lost(self, ending: Ending, error: str
                      ) -> tuple[Outcome, Task | None, tuple[AttemptStatus, str | None]]:
        """A success that may not be recorded, written CANCELLED_BY_SYSTEM instead (the task
        goes back as it stands)."""
        claim = ending.claim
        lost = Conclusion.of(claim.attempt, LOST, claim.task,
                             task_changes(Outcome.CANCELLED), error=error)
        try:
            task = self.store.conclude(lost)
        except StoreError as exc:
            return Outcome.CANCELLED, None, (LOST, f"{error}; and {exc}")
        return Outcome.CANCELLED, task, (LOST, error)

    def _told(self, q: _Queued, outcome: Outcome, task: Task | None,
              ended: tuple[AttemptStatus, str | None]) -> None:
        q.outcome = outcome
        self._observed(q, ended)
        try:
            self.on_ended(q.ending, outcome, task, ended)
        except Exception:
            log.exception("member %s: settling the end of task %s failed", self.member_id,
                          q.ending.claim.task.id)
        finally:
            q.done.set()
