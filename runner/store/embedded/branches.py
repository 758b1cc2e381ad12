"""A ``union`` step's branches compiled before the write lock, on the embedded graph.

gremlite compiles each branch of ``union(...)`` into its chain of producers when the step
first runs, that is inside the write's transaction: the store's batches (a claim or an end of
ten tasks is a ``union`` of ten branches) compiled 0.19-0.26 ms per task there, 11-13% of the
time the write lock was held. Here a ``union`` compiles its branches when the traversal is
compiled, which is before its first statement and so before ``BEGIN IMMEDIATE``
(:class:`runner.store.embedded.graph._LazyBegin`); each branch waits, seeded later, for the
traverser
that comes in. What runs is the same chain gremlite would have compiled: the seed hands it the
incoming traverser as gremlite's own seed does. A second traverser coming into the same step
(not the store's case: a batch stands on one vertex) compiles its own branches, gremlite's way.

Installed once per process by :func:`early_branches` when the embedded graph opens a
connection; a gremlite whose internals differ (another minor version) keeps its own way, and
says so in the log. The step's subclasses (``flatMap``...) keep theirs.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("latchwork.store")

_LOCK = threading.Lock()


def early_branches() -> None:
    """Compile ``union``'s branches with the traversal (see the module), once per process."""
    from gremlite import base, steps

    with _LOCK:
        if getattr(steps.Union, "_latchwork_early", False):
            return
        steps.Union._latchwork_early = True
        needed = (getattr(steps, "bytecode_to_producer_chain", None),
                  getattr(base, "SingletonProducer", None), getattr(base, "ProducerCursor", None),
                  getattr(base, "StepStream", None),
                  getattr(steps.Union, "follow_all_traversals", None))
        if not all(needed):
            log.warning("gremlite's internals are not the ones the early union branches were "
                        "written for: they are compiled gremlite's own way")
            return
        _install(steps, base)


def _install(steps: Any, base: Any) -> None:
    from gremlin_python.process.traversal import Bytecode

    union = steps.Union
    own_build, own_follow = union.build, union.follow_all_traversals

    class Seed(base.SingletonProducer):  # type: ignore[misc]
        """gremlite's seed of a branch, given its traverser when the branch starts."""

        def __init__(self, con: sqlite3.Connection, outer: Any) -> None:
            bc = Bytecode()
            bc.add_step("_singleton_producer_dummy_step_")
            base.Producer.__init__(self, con, base.StepStream(outer.config, bc,
                                                              existing_stream=outer))
            self.singleton_result = None

    def build(self: Any, ss: Any) -> None:
        own_build(self, ss)
        self._latchwork_ready = None
        if type(self) is union:
            ready = []
            for bc in self.bytecodes:
                seed = Seed(self.con, ss)
                ready.append((seed, steps.bytecode_to_producer_chain(
                    ss.config, self.con, bc, seed_producer=seed)))
            self._latchwork_ready = ready

    def follow_all_traversals(self: Any) -> Iterator[Any]:
        ready, self._latchwork_ready = getattr(self, "_latchwork_ready", None), None
        if ready is None:  # a second traverser, or a subclass: gremlite's way
            yield from own_follow(self)
            return
        for seed, chain in ready:  # as gremlite's carry_on does, with the chain compiled
            seed.singleton_result = self.incoming_result_or_new()
            cur = base.ProducerCursor(chain)
            while cur.has_next():
                yield cur.fetchone()
            if not cur.stopped_iteration:
                chain.abort()

    union.build, union.follow_all_traversals = build, follow_all_traversals
    union._latchwork_own = (own_build, own_follow)  # gremlite's, for the test that compares
