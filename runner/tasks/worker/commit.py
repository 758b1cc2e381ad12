"""Group commit of attempt ends, the one writer of what attempts come to: the ends of several
attempts written in one store write, their locks released in one ZooKeeper transaction, then
the loop told.

A worker whose handler returned hands its :class:`~runner.tasks.worker.running.Ending` to
:meth:`GroupCommit.submit` and is free at once (or, for a task whose next step needs the end
written first, an ordering key's chain, waits: :meth:`GroupCommit.conclude`). The commit
thread writes whatever is queued, up to ``max_items`` and about ``max_bytes`` at a time
(ends with results are large: :data:`MAX_BYTES`), through the store's one entry
point for ends (:meth:`~runner.store.Store.write_ends`: the conclusions in one transaction or
one traversal, the other kinds each alone); an idle node writes a single end at once, a busy
one a group of every end that arrived during the last write (no timer: the write itself is the
flush period). Each end's answer, a :class:`~runner.tasks.worker.ends.Written`, goes to the
reporter's :meth:`~EndReporter.written` (the attempt's observers: log, metrics, traces) as soon
as it is written or given up, before the release: a release waits for ZooKeeper, which a cut
link can hold back, and the log would show the handler running long after it stopped. Then
the group's task locks are released in one transaction (:meth:`~coord.LockBatch.release`) and
the reporter's :meth:`~EndReporter.ended` settles each slot. So nothing reports an end the store
does not have, and no other node can claim a task before its end is written.

A write a worker must see done first (a commit conflict's attempt before the next claim,
``ctx.complete()``, the limit watch fencing off a handler) goes the same way (:meth:`write_now`).

Each end is guarded on its own: a refused one (its attempt closed by the master or an operator,
a stale token, a resource taken) is settled alone, the rest of its group is written.

Failure behaviour:

* the graph unreachable (or any other error of the write): the group is written again with
  backoff (one write for it and what queued meanwhile) for ``store_retry_for`` seconds from
  each end's arrival and while its lock is still held; past that the end is given up: its
  attempt stays RUNNING (the master closes it as superseded), its lock is released, the task
  runs again;
* a success refused because another attempt took one of its resources meanwhile (its hold was
  lost with its session): written CANCELLED_BY_SYSTEM instead, the task runs again;
* a node killed -9 with ends queued: their attempts are still RUNNING, closed by the master's
  reaper, and the tasks run again (docs/reliability.md: the window this queue adds).

Why one module: the queue, the group's write, its failure table and the release are one
pipeline over one thread; split, each part would reach into the others' queue items.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

from coord import CoordError, LockBatch
from runner.errors import (
    AttemptAlreadyFinished,
    CommitConflict,
    ResourceTaken,
    StaleFencingToken,
    StoreError,
    StoreUnavailable,
)
from runner.store import AttemptStatus, Conclusion, EndWrite, EndWritten, Store, write_size
from runner.tasks.outcomes import Outcome, task_changes
from runner.tasks.worker.ends import Written, shown
from runner.tasks.worker.running import Ending

log = logging.getLogger("latchwork.tasks")

LOST = AttemptStatus.CANCELLED_BY_SYSTEM
#: the most a group's writes take (about: :func:`~runner.store.write_size`): half the 1 MiB
#: request limit the dev Gremlin Server and the compose file set, so a group of ends with
#: results (64 KiB each at most) stays well under it
MAX_BYTES = 512 * 1024


class EndReporter(Protocol):
    """Who hears what the group commit wrote (the task loop; the task stub)."""

    def written(self, ending: Ending, written: Written) -> None:
        """``ending`` is written (or given up), its lock not yet released: its observers."""
        ...

    def ended(self, ending: Ending, written: Written) -> None:
        """``ending``'s lock is released: the loop settles its slot."""
        ...


@dataclass(eq=False)
class _Queued:
    """An end to write (``ending``), or a write a worker waits for (``write`` alone)."""
    ending: Ending | None
    write: EndWrite | None
    since: float
    done: threading.Event = field(default_factory=threading.Event)
    written: Written | None = None
    answer: EndWritten | StoreError | None = None
    observed: bool = False  # its attempt's observers heard its end


class GroupCommit:
    """The ends of one node's attempts, written in groups (see the module). ``stats``:
    ``groups`` written, ``concluded`` ends in them, the ``largest`` group."""

    def __init__(self, store: Store, member_id: str, reporter: EndReporter, *,
                 max_items: int = 64, max_bytes: int = MAX_BYTES,
                 store_retry_for: float = 60.0) -> None:
        self.store = store
        self.member_id = member_id
        self.reporter = reporter
        self.max_items = max_items
        self.max_bytes = max_bytes
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
        self._put(_Queued(ending, ending.write, time.monotonic()))

    def conclude(self, ending: Ending) -> Written:
        """Queue ``ending`` and wait until it is written and told; what was written."""
        self._put(item := _Queued(ending, ending.write, time.monotonic()))
        item.done.wait()
        assert item.written is not None
        return item.written

    def write_now(self, write: EndWrite) -> EndWritten | StoreError:
        """Write ``write`` in the next group and wait for it: what it left, or the store's
        refusal (the graph out of reach: :class:`StoreUnavailable`, not tried again: the
        worker that waits decides)."""
        self._put(item := _Queued(None, write, time.monotonic()))
        item.done.wait()
        assert item.answer is not None
        return item.answer

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
                group = self._group()
                del self._queue[:len(group)]
            try:
                self._settle(group)
            except Exception:
                log.exception("member %s: writing a group of %d attempt ends failed",
                              self.member_id, len(group))
                left = [q for q in group if not q.done.is_set()]
                self._release([q.ending for q in left if q.ending is not None])
                for item in left:
                    if item.ending is None:
                        item.answer = StoreUnavailable("the write of the ends failed")
                        item.done.set()
                    else:
                        self._told(item, Written(Outcome.CANCELLED, None, LOST,
                                                 "its end could not be written"))

    def _group(self) -> list[_Queued]:
        """The next group: the queue's first ends, at most ``max_items`` of them and at most
        ``max_bytes`` (:func:`~runner.store.write_size`: a result's text above all), at least
        one whatever its size."""
        group: list[_Queued] = []
        size = 0
        for q in self._queue[:self.max_items]:
            size += write_size(q.write) if q.write is not None else 0
            if group and size > self.max_bytes:
                break
            group.append(q)
        return group

    def _settle(self, group: list[_Queued]) -> None:
        """Write the group's ends, tell each end's observers, release the locks in one
        transaction, tell the loop."""
        answers = self._write([q for q in group if q.write is not None])
        ends = [q for q in group if q.ending is not None]
        self.stats["groups"] += 1
        self.stats["concluded"] += len(ends)
        self.stats["largest"] = max(self.stats["largest"], len(ends))
        for q in group:
            if q.ending is None:  # a write a worker waits for: answered now
                q.answer = answers[id(q)]
                q.done.set()
        settled = [(q, self._settled(q, answers.get(id(q)))) for q in ends]
        for q, written in settled:  # written (or given up): logged and observed now,
            self._observed(q, written)  # not when a lock's release gets through to ZooKeeper
        self._release([q.ending for q in ends if q.ending is not None])
        for q, written in settled:
            self._told(q, written)

    def _observed(self, q: _Queued, written: Written) -> None:
        """The observers of ``q``'s attempt hear its end (what the store holds, or that it
        was given up), once."""
        if q.observed or q.ending is None:
            return
        q.observed = True
        try:
            self.reporter.written(q.ending, written)
        except Exception:
            log.exception("member %s: telling the end of task %s failed", self.member_id,
                          q.ending.claim.task.id)

    def _release(self, endings: list[Ending]) -> None:
        """The endings' task locks, in one transaction; one that cannot be released now goes
        with its session (logged, not raised)."""
        try:
            LockBatch([e.slot.lock for e in endings]).release()
        except CoordError as exc:
            log.info("member %s: releasing %d task locks: %s", self.member_id, len(endings),
                     exc)

    def _write(self, items: list[_Queued]) -> dict[int, EndWritten | StoreError]:
        """``write_ends`` of the items; the graph out of reach (or any other error of the
        write): again with backoff, each end for ``store_retry_for`` from its arrival and
        while its lock is held (a write a worker waits for is answered at once)."""
        delay = 0.1
        found: dict[int, EndWritten | StoreError] = {}
        while items:
            try:
                answers = self.store.write_ends([q.write for q in items if q.write is not None])
            except Exception as error:
                exc = error if isinstance(error, StoreUnavailable) else None
                if exc is None:  # a fault of the write itself: tried again like the graph out
                    # of reach (given up at once, the locks went and the tasks ran again)
                    log.exception("member %s: writing %d attempt ends failed", self.member_id,
                                  len(items))
                    exc = StoreUnavailable(f"the write of the ends failed: {error!r}")
                now = time.monotonic()
                for q in [q for q in items if q.ending is None
                          or now + delay > q.since + self.store_retry_for
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

    def _settled(self, q: _Queued, answer: EndWritten | StoreError | None) -> Written:
        """What a written (or refused) end leaves: the outcome, the task, what the attempt
        shows."""
        ending = q.ending
        assert ending is not None
        status, error = shown(ending.end)
        if ending.write is None:  # nothing to write
            return Written(ending.outcome, None, status, error)
        if isinstance(answer, EndWritten):
            return Written(ending.outcome, answer.task, status, error, answer.released)
        task = ending.claim.task
        if not isinstance(ending.write, Conclusion):  # a task let go, an attempt closed alone
            log.warning("member %s: task %s: its end not written (%s); the master takes it "
                        "back", self.member_id, task.id, answer)
            return Written(Outcome.CANCELLED, None, status, error)
        if isinstance(answer, StoreUnavailable):
            log.error("member %s: task %s (%s): the end of its attempt could not be written "
                      "for %gs (%s); the task stays open and is run again (its attempt is "
                      "closed as superseded)", self.member_id, task.id, task.type,
                      self.store_retry_for, answer)
            return Written(Outcome.CANCELLED, None, LOST,
                           f"its end could not be written: {answer}")
        if isinstance(answer, ResourceTaken):
            log.warning("member %s: task %s (%s) attempt %d: its success is not recorded: %s",
                        self.member_id, task.id, task.type, ending.claim.attempt.seq, answer)
            return self._written_lost(ending, f"cancelled by system: {answer}")
        if isinstance(answer, StaleFencingToken):
            log.warning("member %s: task %s was taken over by another owner; leaving it",
                        self.member_id, task.id)
            return Written(Outcome.CANCELLED, None, LOST,
                           f"cancelled by system: superseded ({answer})")
        if isinstance(answer, AttemptAlreadyFinished):
            log.warning("member %s: the attempt of task %s was closed by the master meanwhile "
                        "(or by an operator); leaving the task to them", self.member_id,
                        task.id)
            try:  # what that close wrote (an operator's CANCELLED, the reaper's reason)
                current = self.store.attempts.get(ending.claim.attempt.id)
                return Written(Outcome.CANCELLED, None, current.status, current.error)
            except StoreError:
                return Written(Outcome.CANCELLED, None, LOST,
                               "closed by someone else before its end was written")
        log.error("member %s: could not record the end of task %s: %s", self.member_id,
                  task.id, answer)
        why = "commit conflicts" if isinstance(answer, CommitConflict) else str(answer)
        return Written(Outcome.CANCELLED, None, LOST, f"its end could not be written: {why}")

    def _written_lost(self, ending: Ending, error: str) -> Written:
        """A success that may not be recorded, written CANCELLED_BY_SYSTEM instead (the task
        goes back as it stands)."""
        claim = ending.claim
        lost = Conclusion.of(claim.attempt, LOST, claim.task, task_changes(Outcome.CANCELLED),
                             error=error)
        try:
            answer = self.store.write_ends([lost])[0]
        except StoreError as exc:
            answer = exc
        if isinstance(answer, StoreError):
            return Written(Outcome.CANCELLED, None, LOST, f"{error}; and {answer}")
        return Written(Outcome.CANCELLED, answer.task, LOST, error)

    def _told(self, q: _Queued, written: Written) -> None:
        q.written = written
        self._observed(q, written)
        assert q.ending is not None
        try:
            self.reporter.ended(q.ending, written)
        except Exception:
            log.exception("member %s: settling the end of task %s failed", self.member_id,
                          q.ending.claim.task.id)
        finally:
            q.done.set()


__all__ = ["EndReporter", "GroupCommit"]
