"""The enrichment job: a Spark driver that works the batches of one series.

Per series (``<data_dir>/series/<series id>/``):

* ``snapshot/``: the eligible avatars (``pos``, ``id``, ``class_iri``, ``props``), written once
  by the creating task and committed by rename; positions ``[0, n)`` are the stream the batch
  coordinator cuts into batches;
* ``batches/<no>/``: one batch's output (``id``, ``value``), computed with Spark built-in
  expressions, written to ``batches/_tmp-<no>-<uuid>/`` and published with one Hadoop
  FileSystem rename. A committed batch is never recomputed: a retry only re-applies it;
* the graph apply: the batch's rows are upserted as ``aspect.<name>`` keyed by avatar id, which
  is idempotent, so a batch applied twice (a worker died between apply and finish) leaves the
  same graph.

One driver per task loops over batches (:func:`work_series`); a lease thread renews the batch
while it runs. Cancelling the task cancels its Spark job group. The module also runs under
``spark-submit`` (see :func:`main`) to work a series from a real Spark cluster's driver.

Failure behaviour: a driver killed -9 stops renewing; the batch times out and another worker
retries it; a half-written ``_tmp`` directory is ignored (Spark skips ``_``-prefixed paths) and
left for cleanup. A batch whose job fails is aborted with the error and retried elsewhere, up to
the series' attempt limit.

Why one module: the batch loop, its lease and the ``spark-submit`` entry are one job: the entry
runs the very loop a task runs, on a cluster's driver.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from coord import ConnectionLost, Session
from coord.batches import (
    Batch,
    BatchCoordinator,
    BatchLost,
    SeriesFailed,
    SeriesState,
    SeriesStatus,
)
from runner.pipeline.aspects import AspectDefinition, compute
from runner.pipeline.storage import (
    APPLY_CHUNK,
    HadoopFS,
    SeriesPaths,
)
from runner.store import Fence, Store
from runner.tasks import CancelToken, TaskCancelled

log = logging.getLogger("latchwork.pipeline")


class Lease:
    """Renews a batch every ``timeout / 3`` seconds until closed; reports a lost batch."""

    def __init__(self, coordinator: BatchCoordinator, batch: Batch,
                 on_lost: Callable[[str], None]) -> None:
        self.coordinator = coordinator
        self.batch = batch
        self.lost: str | None = None
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"lease-{batch.series}-{batch.no}")

    def __enter__(self) -> Lease:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.coordinator.timeout / 3):
            try:
                self.batch = self.coordinator.renew(self.batch)
            except BatchLost as exc:
                self.lost = str(exc)
                self._on_lost(self.lost)
                return
            except (ConnectionLost, SeriesFailed) as exc:
                log.warning("batch %d of %s: renewal failed: %s", self.batch.no,
                            self.batch.series, exc)


class GroupCancel:
    """Cancels a Spark job group at once and then again every ``every`` seconds until closed.

    ``cancelJobGroup`` cancels only the group's jobs running at that moment. A batch is several
    jobs (the snapshot's read, then the batch's write), and the driver thread starts the next
    one without asking the token first: a cancel that fell between two jobs left the next one
    to run to its end, the whole computation. Asked again until the worker is out of its Spark
    calls, a job started after the cancel is cancelled within ``every`` seconds."""

    def __init__(self, sc: Any, group: str, every: float = 0.25) -> None:
        self.sc = sc
        self.group = group
        self.every = every
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def __call__(self, reason: str) -> None:
        self._cancel()
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._repeat, daemon=True,
                                                name=f"cancel-{self.group}")
                self._thread.start()

    def _cancel(self) -> bool:
        try:
            self.sc.cancelJobGroup(self.group)
            return True
        except Exception as exc:  # the context stopped meanwhile: nothing left to cancel
            log.warning("job group %s: cancel failed: %s", self.group, exc)
            return False

    def _repeat(self) -> None:
        while not self._stop.wait(self.every) and self._cancel():
            pass

    def close(self) -> None:
        with self._lock:
            self._stop.set()
            thread = self._thread
        if thread is not None:
            thread.join()

    def __enter__(self) -> GroupCancel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class BatchWorker:
    """One driver working one series for one task (or one spark-submit)."""

    spark: Any
    store: Store
    coordinator: BatchCoordinator
    definition: AspectDefinition
    paths: SeriesPaths
    member: str
    cancel: CancelToken
    group: str  # the Spark job group: cancelling the task cancels it
    batch_rows: int
    pause: float = 0.0  # seconds to wait before each commit (throttling)
    #: a test's gate (LATCHWORK_TEST_BATCH_GATE): while this file exists, a batch computed
    #: waits before its commit, after writing ``<gate>.<pid>.<batch>``: a kill "during" a
    #: batch lands there by construction, whatever the box's speed
    gate: Path | None = None
    poll: float = 0.5
    apply_to_graph: bool = True  # False: compute and commit only (benchmarks, dry runs)
    # as a task's owner: the graph writes carry its fence (refused once stale), and ownership
    # is checked right before each batch is committed
    fence: Fence | None = None
    check: Callable[[], None] | None = None
    # the task's ctx.progress: rows done of the series' rows, after every batch it finishes
    report: Callable[[int, int | None, str], None] | None = None
    # the task's ctx.checkpoint: its last finished batch, after each (the resume itself is the
    # series', in ZooKeeper, which every worker of the series shares)
    checkpoint: Callable[[Any], None] | None = None

    def run(self) -> SeriesStatus:
        """Work batches until the series is COMPLETED; raises SeriesFailed or TaskCancelled."""
        cancel_group = GroupCancel(self.spark.sparkContext, self.group)
        unhook = self.cancel.on_cancel(cancel_group)
        try:
            while True:
                self.cancel.raise_if_cancelled()
                status = self.coordinator.status()
                if status.state is SeriesState.COMPLETED:
                    return status
                if status.state is SeriesState.FAILED:
                    raise SeriesFailed(status.id, list(status.failure))
                batch = self.coordinator.start_batch(self.member, self.batch_rows)
                if batch is None:
                    self.cancel.wait(self.poll)  # others hold the remaining batches
                    continue
                self._attempt(batch)
        finally:
            unhook()
            cancel_group.close()

    def _attempt(self, batch: Batch) -> None:
        started = time.monotonic()
        sc = self.spark.sparkContext
        with GroupCancel(sc, self.group) as lost_group, \
                Lease(self.coordinator, batch, on_lost=lost_group) as lease:
            try:
                rows = self.process(batch)
            except Exception as exc:
                if lease.lost is not None:
                    log.warning("member %s: batch %d of %s lost: %s", self.member, batch.no,
                                batch.series, lease.lost)
                    return
                if self.cancel.cancelled:
                    self._release(lease.batch, f"cancelled: {self.cancel.reason}")
                    raise TaskCancelled(self.cancel.reason) from exc
                log.exception("member %s: batch %d of %s failed", self.member, batch.no,
                              batch.series)
                self._release(lease.batch, f"{type(exc).__name__}: {exc}", count=True)
                return
        try:
            self.coordinator.finish(lease.batch, rows=rows)
        except BatchLost as exc:
            log.warning("member %s: batch %d of %s: %s", self.member, batch.no, batch.series,
                        exc)
            return
        log.info("member %s: batch %d of %s [%d, %s) done: %d rows in %.1f s", self.member,
                 batch.no, batch.series, batch.start, batch.end, rows,
                 time.monotonic() - started)
        if self.report is None and self.checkpoint is None:
            return
        status = self.coordinator.status()
        done = sum(b.end - b.start for b in status.finished if b.end is not None)
        if self.report is not None:  # snapshot rows in finished batches, of all its rows
            self.report(done, status.end, f"{len(status.finished)} batches done, "
                                          f"{status.rows_done} values written")
        if self.checkpoint is not None:
            self.checkpoint({"series": batch.series, "batch": batch.no,
                             "rows": [batch.start, batch.end], "batches_done":
                             len(status.finished), "rows_done": done})

    def _release(self, batch: Batch, reason: str, count: bool = False) -> None:
        try:
            self.coordinator.abort(batch, reason, count=count)
        except (BatchLost, SeriesFailed, ConnectionLost) as exc:
            log.warning("batch %d of %s: abort not recorded (%s); it will time out",
                        batch.no, batch.series, exc)

    def process(self, batch: Batch) -> int:
        """Compute and commit the batch's output (unless committed already), then apply it."""
        fs = HadoopFS(self.spark)
        final = self.paths.batch(batch.no)
        sc = self.spark.sparkContext
        sc.setJobGroup(self.group, f"{self.definition.name} batch {batch.no}", True)
        if batch.end is None:
            raise ValueError(f"batch {batch.no} of {batch.series} is open-ended")
        if not fs.exists(final):
            from pyspark.sql import functions as F
            snapshot = self.spark.read.parquet(self.paths.snapshot)
            part = snapshot.where((F.col("pos") >= batch.start) & (F.col("pos") < batch.end))
            tmp = self.paths.tmp(f"batch-{batch.no:06d}")
            compute(part, self.definition).write.parquet(tmp)
            if self.gate is not None:
                self._hold(batch)
            if self.pause and self.cancel.wait(self.pause):
                fs.delete(tmp)
                raise TaskCancelled(self.cancel.reason)
            try:
                self.cancel.raise_if_cancelled()
                if self.check is not None:
                    self.check()
            except TaskCancelled:
                fs.delete(tmp)
                raise
            fs.commit(tmp, final)
        return self.apply(final) if self.apply_to_graph else 0

    def _hold(self, batch: Batch) -> None:
        """Wait before the commit while the test's gate exists (see ``gate``); cancelled, the
        wait ends (the caller's cancellation check follows)."""
        assert self.gate is not None
        Path(f"{self.gate}.{os.getpid()}.{batch.no}").write_text(self.member)
        while self.gate.exists() and not self.cancel.wait(0.05):
            pass

    def apply(self, uri: str) -> int:
        """Upsert the committed batch into the graph (idempotent; keyed by avatar id).

        The batch comes to the driver as one Arrow table (a batch is sized to fit): read by
        pyarrow straight from local files, through Spark from any other file system; the JSON
        text Spark produced is stored as is."""
        if uri.startswith("file:"):
            import pyarrow.parquet as pq
            table = pq.read_table(urlparse(uri).path, columns=["id", "value"])
        else:
            table = self.spark.read.parquet(uri).select("id", "value").toArrow()
        ids = table.column("id").to_pylist()
        values = table.column("value").to_pylist()
        applied = 0
        for start in range(0, len(ids), APPLY_CHUNK):
            self.cancel.raise_if_cancelled()
            applied += self.store.avatars.upsert_aspect(
                self.definition.name,
                dict(zip(ids[start:start + APPLY_CHUNK], values[start:start + APPLY_CHUNK],
                         strict=True)), encoded=True, fence=self.fence)
        return applied


def coordinator_for(session: Session, series_id: str,
                    meta: dict[str, Any] | None = None) -> BatchCoordinator:
    """The coordinator with the series' own settings (stored in its meta at creation)."""
    if meta is None:
        meta = BatchCoordinator(session, series_id).status().meta
    return BatchCoordinator(session, series_id, timeout=float(meta["timeout"]),
                            max_in_progress=int(meta.get("max_in_progress", 8)),
                            max_attempts=int(meta.get("max_attempts", 3)))


def progress(status: SeriesStatus) -> dict[str, Any]:
    """Batches done/total and rows/s of a series, for reports."""
    size = int(status.meta.get("batch_rows", 1))
    done = status.finished
    first = min((b.started_at for b in status.batches), default=status.created_at)
    last = max((b.finished_at or 0.0 for b in done), default=0.0)
    elapsed = max(last - first, 1e-9) if done else 0.0
    return {
        "series": status.id,
        "state": status.state.value,
        "batches_done": len(done),
        "batches_total": status.expected_batches(size),
        "rows_total": status.end,
        "rows_done": status.rows_done,
        "rows_per_s": round(status.rows_done / elapsed, 1) if elapsed else 0.0,
        "retries": sum(max(b.attempt - 1, 0) for b in status.batches),
        "failure": list(status.failure),
    }


def main(argv: list[str] | None = None) -> int:
    """``spark-submit --py-files latchwork.zip runner/pipeline/job.py --series ID ...``

    Works the batches of an existing series from this driver, with the node configuration
    (``--config`` TOML and ``LATCHWORK_*`` variables) for ZooKeeper, the graph and data_dir.
    SIGTERM cancels the Spark job group and releases the current batch.
    """
    from runner.config import Settings
    from runner.connect import graph_store, zk_session
    from runner.pipeline.aspects import AspectRegistry

    parser = argparse.ArgumentParser(prog="latchwork-pipeline-job", description=main.__doc__)
    parser.add_argument("--series", required=True, help="the series to work")
    parser.add_argument("--config", type=Path, help="TOML configuration file")
    parser.add_argument("--member", default=f"spark-submit:{uuid.uuid4().hex[:8]}",
                        help="worker id recorded as the owner of its batches")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                                                   "%(message)s")
    from pyspark.sql import SparkSession
    settings = Settings.load(args.config)
    spark = SparkSession.builder.appName(f"latchwork {args.series}").getOrCreate()
    cancel = CancelToken()
    received: list[int] = []  # the handler only records; the main thread acts on it
    signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    with zk_session(settings) as session:
        coordinator = coordinator_for(session, args.series)
        meta = coordinator.status().meta
        store = graph_store(settings)
        outcome: list[SeriesStatus | BaseException] = []
        try:
            worker = BatchWorker(
                spark, store, coordinator, AspectRegistry(settings.aspects).get(meta["aspect"]),
                SeriesPaths(meta["root"]), args.member, cancel,
                group=f"latchwork-{args.series}", batch_rows=int(meta["batch_rows"]))

            def work() -> None:
                try:
                    outcome.append(worker.run())
                except BaseException as exc:
                    outcome.append(exc)

            thread = threading.Thread(target=work, name="batch-worker")
            thread.start()
            while thread.is_alive():
                thread.join(0.2)
                if received:
                    cancel.cancel("SIGTERM")
        finally:
            store.close()
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    status = outcome[0]
    print(json.dumps(progress(status)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
