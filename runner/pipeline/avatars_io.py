"""Avatars between the graph and Parquet files (``latchwork avatars import|export``).

File schema: ``id`` (string), ``class_iri`` (string), ``properties`` (JSON object as a string,
optional), and on export ``aspects`` (JSON object as a string). Import validates the whole file
first and writes nothing if any row is malformed (:class:`InvalidAvatars` names the row and the
problem); then it upserts in chunks, so a rerun after a crash completes it (upserts are keyed
by avatar id).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runner.errors import InvalidAvatars
from runner.store import Avatar, Store

READ_ROWS = 10_000
WRITE_CHUNK = 500


def _rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    import pyarrow.parquet as pq
    try:
        reader = pq.ParquetFile(path)
    except (OSError, ValueError) as exc:
        raise InvalidAvatars(f"{path} is not a readable Parquet file: {exc}") from exc
    names = set(reader.schema_arrow.names)
    missing = {"id", "class_iri"} - names
    if missing:
        raise InvalidAvatars(f"{path}: missing column(s) {', '.join(sorted(missing))} "
                             f"(has {', '.join(sorted(names))})")
    columns = [c for c in ("id", "class_iri", "properties") if c in names]
    index = 0
    for batch in reader.iter_batches(batch_size=READ_ROWS, columns=columns):
        for row in batch.to_pylist():
            yield index, row
            index += 1


def _avatar(index: int, row: dict[str, Any]) -> Avatar:
    avatar_id, class_iri = row.get("id"), row.get("class_iri")
    if not isinstance(avatar_id, str) or not avatar_id:
        raise InvalidAvatars(f"row {index}: id must be a non-empty string, not {avatar_id!r}")
    if not isinstance(class_iri, str) or not class_iri:
        raise InvalidAvatars(f"row {index} ({avatar_id}): class_iri must be a non-empty "
                             f"string, not {class_iri!r}")
    raw = row.get("properties")
    properties: Any = {}
    if raw is not None:
        try:
            properties = json.loads(raw)
        except (TypeError, ValueError) as exc:
            raise InvalidAvatars(f"row {index} ({avatar_id}): properties is not JSON: "
                                 f"{exc}") from exc
        if not isinstance(properties, dict):
            raise InvalidAvatars(f"row {index} ({avatar_id}): properties must be a JSON object")
    return Avatar(id=avatar_id, class_iri=class_iri, properties=properties)


def import_avatars(store: Store, path: Path) -> int:
    """Validate ``path`` entirely, then upsert its avatars; returns how many."""
    seen: set[str] = set()
    for index, row in _rows(path):
        avatar = _avatar(index, row)
        if avatar.id in seen:
            raise InvalidAvatars(f"row {index}: avatar {avatar.id} appears twice")
        seen.add(avatar.id)
    written = 0
    chunk: list[Avatar] = []
    for index, row in _rows(path):
        chunk.append(_avatar(index, row))
        if len(chunk) >= WRITE_CHUNK:
            written += store.avatars.upsert(chunk)
            chunk = []
    if chunk:
        written += store.avatars.upsert(chunk)
    return written


def export_avatars(store: Store, path: Path, class_iris: list[str] | None = None) -> int:
    """Write the avatars (of ``class_iris``, all when None) to one Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    schema = pa.schema([("id", pa.string()), ("class_iri", pa.string()),
                        ("properties", pa.string()), ("aspects", pa.string())])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    count = 0
    with pq.ParquetWriter(tmp, schema) as writer:
        for page in store.avatars.scan(class_iris):
            page = sorted(page, key=lambda a: a.id)
            writer.write_table(pa.table({
                "id": [a.id for a in page], "class_iri": [a.class_iri for a in page],
                "properties": [json.dumps(a.properties, sort_keys=True) for a in page],
                "aspects": [json.dumps(a.aspects, sort_keys=True) for a in page]},
                schema=schema))
            count += len(page)
    tmp.replace(path)  # readers never see a half-written file
    return count
