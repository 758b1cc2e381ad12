"""The eligible-avatars snapshot, exported from the graph in pages straight to Parquet.

An aspect's series works over a snapshot of the avatars of its eligible classes, frozen when
the series is created: ``<series>/snapshot/`` holds ``page-<k>.parquet`` files with the columns
``pos`` (the stream position the batch coordinator cuts batches from), ``id``, ``class_iri`` and
``props`` (the stored JSON). :class:`SnapshotExport` builds it without holding the graph in
memory:

* it reads the avatars a page at a time (``AvatarStore.export_page``: at most twice
  ``page_rows`` avatars, whatever the graph's size), writes each page with pyarrow as one
  Parquet file (one row group, so its ``pos`` range is in the file's statistics and a batch's
  ``pos`` filter reads only the files it needs), first to a ``_partial-`` name, then renamed;
  a page is written by a thread while the next one is read;
* after every page it records ``{pages, rows, cursor}`` in a versioned ZooKeeper register
  (``snapshots/<series id>``): a creating task that dies (kill -9, a lost session) leaves
  the pages it wrote and that record, and the next one resumes at the first unrecorded page
  (a page written but not recorded is written again, over it);
* when the graph has no more pages it renames the pages' directory to ``snapshot/`` (one
  rename on a local or HDFS file system) and records ``done``. Rows are numbered in page order,
  so positions are ``[0, rows)`` without a gap.

Memory: two pages of rows and one Arrow table (about ``page_rows`` times the average
properties' size each, a few tens of MB for the default 50,000), not the graph; nothing goes
through Spark.

Failure behaviour: store errors propagate (the task's attempt fails and a new one resumes);
``check`` (the task's ``ctx.check``) runs before every page and before the rename, so an owner
that lost its task stops writing; a data_dir pyarrow cannot reach raises
:class:`~runner.pipeline.storage.PipelineError`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from coord import Session, VersionConflict, VersionedRegister
from runner.errors import PipelineError
from runner.pipeline.storage import SeriesPaths
from runner.store import Store

log = logging.getLogger("latchwork.pipeline")

PAGE_ROWS = 50_000


@dataclass
class ExportProgress:
    """Where an export stands: pages and rows written, the store's cursor after them."""

    pages: int = 0
    rows: int = 0
    cursor: str | None = None
    done: bool = False


class MemoryProgress:
    """Export progress kept in memory only (tests, tools): an interrupted export starts again."""

    def __init__(self) -> None:
        self.value = ExportProgress()

    def load(self) -> ExportProgress:
        return self.value

    def save(self, progress: ExportProgress) -> None:
        self.value = progress


class ZkProgress:
    """Export progress in a versioned ZooKeeper register: a later export resumes from it."""

    def __init__(self, session: Session, series_id: str) -> None:
        self.register = VersionedRegister(session, f"snapshots/{series_id}")
        self._version = -1

    def load(self) -> ExportProgress:
        value, self._version = self.register.get()
        return ExportProgress(**value) if isinstance(value, dict) else ExportProgress()

    def save(self, progress: ExportProgress) -> None:
        try:
            self._version = self.register.compare_and_set(self._version, {
                "pages": progress.pages, "rows": progress.rows, "cursor": progress.cursor,
                "done": progress.done})
        except VersionConflict as exc:  # another export of the same series: one writer only
            raise PipelineError(f"snapshot progress of {self.register.path} moved under this "
                                "export: another creator is writing it") from exc


def filesystem(uri: str) -> tuple[Any, str]:
    """pyarrow's file system for ``uri`` and the path on it."""
    import pyarrow.fs as pafs
    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except (ValueError, OSError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise PipelineError(f"cannot write the snapshot to {uri}: {exc}") from exc
    return fs, path


class SnapshotExport:
    """Export the avatars of ``classes`` to ``paths.snapshot`` (see the module)."""

    def __init__(self, store: Store, classes: Iterable[str], paths: SeriesPaths,
                 progress: MemoryProgress | ZkProgress | None = None,
                 page_rows: int = PAGE_ROWS, check: Callable[[], None] | None = None,
                 report: Callable[[int, int | None, str], None] | None = None) -> None:
        self.store = store
        self.classes = sorted(set(classes))
        self.paths = paths
        self.progress = progress or MemoryProgress()
        self.page_rows = page_rows
        self.check = check
        self.report = report
        self.fs, self.final = filesystem(paths.snapshot)
        _, self.pages_dir = filesystem(f"{paths.root}/_snapshot-pages")

    def exists(self) -> bool:
        import pyarrow.fs as pafs
        return bool(self.fs.get_file_info(self.final).type != pafs.FileType.NotFound)

    def run(self) -> int:
        """Write (or finish writing) the snapshot; its row count."""
        state = self.progress.load()
        if self.exists():
            return state.rows if state.done else self._count()
        if state.pages:
            log.info("snapshot %s: resuming at page %d (%d rows written)", self.paths.snapshot,
                     state.pages, state.rows)
        self.fs.create_dir(self.pages_dir, recursive=True)
        # a page is written (pyarrow, without the GIL) while the next one is read; it is
        # recorded once its file is in place
        with ThreadPoolExecutor(1, thread_name_prefix="snapshot-writer") as writer:
            pending: tuple[Future[None], ExportProgress] | None = None
            while state.pages == 0 or state.cursor is not None:
                if self.check is not None:
                    self.check()
                rows, cursor = self.store.avatars.export_page(self.classes, state.cursor,
                                                              self.page_rows)
                if pending is not None:
                    self._record(*pending)
                    pending = None
                after = ExportProgress(state.pages + 1 if rows else state.pages,
                                 state.rows + len(rows), cursor)
                if rows:
                    pending = (writer.submit(self._write_page, state.pages, state.rows, rows),
                               after)
                else:
                    self.progress.save(after)
                state = after
                if cursor is None:
                    break
            if pending is not None:
                self._record(*pending)
        if self.check is not None:
            self.check()
        self._drop_unrecorded(state.pages)
        self.fs.move(self.pages_dir, self.final)
        self.progress.save(ExportProgress(state.pages, state.rows, None, True))
        log.info("snapshot %s: %d avatars in %d pages", self.paths.snapshot, state.rows,
                 state.pages)
        return state.rows

    def _record(self, written: Future[None], state: ExportProgress) -> None:
        written.result()  # a page that could not be written stops the export here
        self.progress.save(state)
        if self.report is not None:
            self.report(state.rows, None, f"snapshot: {state.rows} avatars in "
                                          f"{state.pages} pages")

    def _write_page(self, page: int, first: int, rows: list[tuple[str, str, str]]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq
        table = pa.table({
            "pos": pa.array(range(first, first + len(rows)), pa.int64()),
            "id": pa.array([r[0] for r in rows], pa.string()),
            "class_iri": pa.array([r[1] for r in rows], pa.string()),
            "props": pa.array([r[2] for r in rows], pa.string()),
        })
        name = self._page_name(page)
        partial = f"{self.pages_dir}/_partial-page-{page:06d}.parquet"  # Spark skips "_" names
        pq.write_table(table, partial, filesystem=self.fs, row_group_size=len(rows))
        self.fs.move(partial, name)

    def _page_name(self, page: int) -> str:
        return f"{self.pages_dir}/page-{page:06d}.parquet"

    def _drop_unrecorded(self, pages: int) -> None:
        """Delete what an earlier, interrupted export left beyond the recorded pages (a page
        written but not recorded, which this one did not write again: the graph shrank)."""
        import pyarrow.fs as pafs
        keep = {self._page_name(k) for k in range(pages)}
        for info in self.fs.get_file_info(pafs.FileSelector(self.pages_dir)):
            if info.path not in keep:
                self.fs.delete_file(info.path)

    def _count(self) -> int:
        import pyarrow.fs as pafs
        import pyarrow.parquet as pq
        infos = self.fs.get_file_info(pafs.FileSelector(self.final))
        return sum(pq.ParquetFile(self.fs.open_input_file(i.path)).metadata.num_rows
                   for i in infos if i.path.endswith(".parquet"))


def write_snapshot(store: Store, classes: Iterable[str], paths: SeriesPaths,
                   session: Session | None = None, series_id: str | None = None,
                   page_rows: int | None = None, check: Callable[[], None] | None = None,
                   report: Callable[[int, int | None, str], None] | None = None) -> int:
    """Export the avatars of ``classes`` once, in pages (:class:`SnapshotExport`);
    returns the committed snapshot's row count. With ``session`` and ``series_id`` the export's
    progress is kept in ZooKeeper, so a later call resumes an interrupted one."""
    progress = ZkProgress(session, series_id) if session is not None and series_id else None
    return SnapshotExport(store, classes, paths, progress, page_rows or PAGE_ROWS, check,
                          report).run()
