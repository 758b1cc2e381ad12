"""Where a series' data lives and how it is committed: the snapshot of eligible avatars, each
batch's output directory, and the Hadoop FileSystem rename that publishes a batch atomically.

Paths are under ``<data_dir>/series/<series id>/`` on any Hadoop-readable file system
(``file://`` locally, a shared one on a cluster). A rename that finds its target already
committed keeps the first (a retried batch is never published twice); a snapshot that cannot be
written raises :class:`PipelineError`.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from runner.errors import PipelineError

log = logging.getLogger("latchwork.pipeline")

APPLY_CHUNK = 500


def data_uri(data_dir: str) -> str:
    """``data_dir`` as a Hadoop URI: local paths become absolute ``file://`` URIs."""
    if urlparse(data_dir).scheme:
        return data_dir.rstrip("/")
    return Path(data_dir).resolve().as_uri()


@dataclass(frozen=True)
class SeriesPaths:
    root: str

    @classmethod
    def of(cls, data_dir: str, series_id: str) -> SeriesPaths:
        return cls(f"{data_uri(data_dir)}/series/{series_id}")

    @property
    def snapshot(self) -> str:
        return f"{self.root}/snapshot"

    @property
    def batches(self) -> str:
        return f"{self.root}/batches"

    def batch(self, no: int) -> str:
        return f"{self.batches}/{no:06d}"

    def tmp(self, name: str) -> str:
        return f"{self.root}/_tmp-{name}-{uuid.uuid4().hex[:12]}"


class HadoopFS:
    """The Hadoop FileSystem API of the session's JVM (local files, HDFS, S3A alike)."""

    def __init__(self, spark: Any) -> None:
        self._jvm = spark.sparkContext._jvm
        self._conf = spark.sparkContext._jsc.hadoopConfiguration()

    def _path(self, uri: str) -> tuple[Any, Any]:
        path = self._jvm.org.apache.hadoop.fs.Path(uri)
        return path, path.getFileSystem(self._conf)

    def exists(self, uri: str) -> bool:
        path, fs = self._path(uri)
        return bool(fs.exists(path))

    def delete(self, uri: str) -> None:
        path, fs = self._path(uri)
        fs.delete(path, True)

    def commit(self, tmp: str, final: str) -> bool:
        """Publish ``tmp`` as ``final`` with one rename; False if ``final`` existed already.

        Hadoop's rename into an existing directory would nest ``tmp`` inside it; ``tmp`` names
        start with ``_`` so such a nested leftover is invisible to Spark readers.
        """
        src, fs = self._path(tmp)
        dst, _ = self._path(final)
        if fs.exists(dst):
            fs.delete(src, True)
            return False
        fs.mkdirs(dst.getParent())
        if not fs.rename(src, dst):
            fs.delete(src, True)
            if not fs.exists(dst):
                raise PipelineError(f"rename {tmp} -> {final} failed")
            return False
        return True
