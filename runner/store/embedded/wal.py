"""The embedded graph's WAL checkpoints, run beside the writers instead of inside one of them.

SQLite in WAL mode copies the log back into the database file (a checkpoint) when a commit
leaves the log past ``wal_autocheckpoint`` pages (1,000 by default), and it does so inside that
commit, while the writer still holds the file's write lock. A task's write touches about 50
pages (gremlite's quads, their indexes, the strings), so every 17th to 20th write paid the copy
and its fsync, 15-20 ms more, and every other node's writer waited behind it.

:class:`WalCheckpointer` takes them out: each :class:`~runner.store.embedded.graph.EmbeddedGraph`
that writes runs one thread which, at most every :data:`CHECKPOINT_EVERY` seconds after this process
committed, runs ``PRAGMA wal_checkpoint(PASSIVE)`` on a connection of its own. A passive
checkpoint copies what no reader still needs, without the write lock, so writers go on
meanwhile. SQLite starts the log again from its beginning only for a writer that begins once
the log is all copied, which writers that keep coming rarely do: past :data:`RESTART_AT` bytes
of log the checkpoint is a RESTART one, which holds new writers back for the moment it takes
(the copying was done by the passive one) and makes the next writer start the log again. So
the log file stays near that size while writers leave a few ms between commits (a test wrote
three times as much); writes of large values back to back grew it to about 28 MB. The writers'
own threshold is raised to :data:`WAL_AUTOCHECKPOINT` pages (about 40 MB), a safety net for a
checkpointer that falls behind (a process frozen), not the usual path.

Measured paced (a claimed submit's write, one process, 600 writes 10 ms apart): p99 20.9 ms
with SQLite's own checkpoints, 6.0 ms with these. On 3 nodes, 900 paced submits a run, two
runs each, interleaved: submit -> start p50 10.7 / 10.7 ms against 11.6 / 11.1, p99 17.9 / 16.0
against 20.3 / 18.2. The drain of 5,000 tasks did not move (249-251 against 237-259 tasks/s).

Failure behaviour: a checkpoint that fails (the disk full, the file gone) is logged once per
kind of error and tried again at the next commit; the writes themselves report such errors
(:mod:`runner.store.embedded.alarm`). A process killed -9 loses no data: the log holds every commit
until a checkpoint copies it, whichever process runs it.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

log = logging.getLogger("latchwork.store")

#: seconds between two checkpoints while this process keeps committing
CHECKPOINT_EVERY = 0.05
#: the writers' own checkpoint threshold in pages: the safety net (see the module)
WAL_AUTOCHECKPOINT = 10_000
#: bytes of log file past which the checkpoint is a RESTART one (see the module)
RESTART_AT = 8 << 20
#: seconds a RESTART checkpoint waits for the writer and the readers of the moment
RESTART_WAIT = 0.5


class WalCheckpointer:
    """One thread per graph file and process that checkpoints the WAL after commits (see the
    module); :meth:`committed` after each write's commit, :meth:`close` once."""

    def __init__(self, path: Path, busy_timeout: float) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self.checkpoints = 0  # passive checkpoints run
        self.restarts = 0  # RESTART checkpoints run
        self._wrote = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._failed: set[str] = set()

    def committed(self) -> None:
        """A write of this process committed: a checkpoint follows soon (the thread starts at
        the first one)."""
        self._wrote.set()
        if self._thread is None:
            with self._lock:
                if self._thread is None and not self._stop.is_set():
                    self._thread = threading.Thread(target=self._run, daemon=True,
                                                    name=f"wal-checkpoint {self.path.name}")
                    self._thread.start()

    def close(self) -> None:
        """Stop the thread (its last checkpoint, if one is running, finishes first)."""
        with self._lock:
            self._stop.set()
            thread = self._thread
        self._wrote.set()
        if thread is not None:
            thread.join(timeout=self.busy_timeout)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        con: sqlite3.Connection | None = None
        page = 4096
        try:
            while not self._stop.is_set():
                self._wrote.wait()
                if self._stop.is_set():
                    return
                self._wrote.clear()
                try:
                    if con is None:
                        con = sqlite3.connect(self.path, timeout=RESTART_WAIT,
                                              isolation_level=None)
                        page = con.execute("PRAGMA page_size").fetchone()[0]
                    ((_, frames, _),) = con.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self.checkpoints += 1
                    if frames * page > RESTART_AT:
                        con.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
                        self.restarts += 1
                except sqlite3.Error as exc:
                    kind = type(exc).__name__ + str(exc)
                    if kind not in self._failed:
                        self._failed.add(kind)
                        log.warning("graph file %s: a WAL checkpoint failed (%s); tried again "
                                    "after the next write", self.path, exc)
                self._stop.wait(CHECKPOINT_EVERY)
        finally:
            if con is not None:
                con.close()
