"""The paged snapshot export against raw gremlite reads, and its peak memory; one run.

1. N avatars (default 10M, LATCHWORK_BENCH_ROWS to change) are bulk-loaded into a gremlite file
   through SQL in gremlite's own layout (vertex + three properties each; the store's own upsert
   runs at ~5k/s, which would take hours), half of them of the eligible class. The file is
   checked through the store before anything is measured.
2. Rows/s over the first SAMPLE avatars' id range (1M at most), best of two alternated rounds:
   the export (``SnapshotExport``: pages read through ``AvatarStore.export_page`` and written
   as Parquet) ÷ raw gremlite reads of the same vertices and properties (the same window
   traversal, nothing kept). Target >= 0.8.
3. Peak RSS (VmHWM) of a process that exports the whole snapshot of N avatars, against the
   same process before it starts; and, for contrast, the former way (every eligible avatar read
   and held at once, sorted, turned into one table) at SAMPLE avatars, which grows with the
   graph. Bound: the export stays within 1 GiB whatever N is (the JVM is not involved).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROWS = int(os.environ.get("LATCHWORK_BENCH_ROWS", 10_000_000))
SAMPLE = min(ROWS, 1_000_000)
CLASS = "https://brickschema.org/schema/Brick#AHU"
OTHER = "https://brickschema.org/schema/Brick#Room"
CHUNK = 200_000


def bulk_load(path: Path, rows: int) -> None:
    """``rows`` avatars in gremlite's layout: a label quad and three property quads each."""
    from gremlite.querytools import Constants

    from runner.store import open_store
    open_store(str(path)).close()  # gremlite's tables, indexes and the store's format
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=OFF")
    indexes = [r[0] for r in con.execute(
        "SELECT name FROM sqlite_master WHERE type='index' AND tbl_name='quads'")]
    for name in indexes:  # rebuilt once at the end: far faster than row by row
        con.execute(f"DROP INDEX {name}")

    def string_id(value: str) -> int:
        con.execute("INSERT OR IGNORE INTO strings (v) VALUES (?)", (value,))
        return int(con.execute("SELECT id FROM strings WHERE v = ?", (value,)).fetchone()[0])

    label, k_id, k_class, k_props = (string_id(s) for s in (
        "avatar", "avatar_id", "avatar_class", "avatar_props"))
    classes = (string_id(CLASS), string_id(OTHER))
    next_string = int(con.execute("SELECT max(id) FROM strings").fetchone()[0]) + 1
    next_elt = int(con.execute("SELECT coalesce(max(id), 0) FROM graphelts").fetchone()[0]) + 1
    for start in range(0, rows, CHUNK):
        con.execute("BEGIN")
        strings, elts, quads = [], [], []
        for i in range(start, min(rows, start + CHUNK)):
            v = next_elt + 4 * i
            sid, sprops = next_string + 2 * i, next_string + 2 * i + 1
            strings.append((sid, f"av-{i:010d}"))
            strings.append((sprops, json.dumps(  # distinct per avatar, as real ones are
                {"lat": (i % 180_000) / 1000 - 90, "lon": (i % 360_000) / 1000 - 180, "n": i},
                separators=(",", ":"), sort_keys=True)))
            elts.extend((v + k,) for k in range(4))
            quads.append((v, Constants.HAS_LABEL_PREDICATE, label, Constants.NON_ID_G_VALUE))
            quads.append((v, k_id, sid, v + 1))
            quads.append((v, k_class, classes[i % 2], v + 2))
            quads.append((v, k_props, sprops, v + 3))
        con.executemany("INSERT INTO strings (id, v) VALUES (?, ?)", strings)
        con.executemany("INSERT INTO graphelts (id) VALUES (?)", elts)
        con.executemany("INSERT INTO quads VALUES (?, ?, ?, ?)", quads)
        con.execute("COMMIT")
    from gremlite.connection import quad_index_names
    for name in quad_index_names:
        con.execute(f"CREATE INDEX {name} ON quads ({', '.join(list(name))})")
    con.close()


def child(argv: list[str]) -> None:
    """``child export|former GRAPH ROOT ZK``: run one way of exporting, print JSON figures."""
    mode, graph, root, hosts = argv

    def hwm() -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return 0

    from coord import Session
    from runner.pipeline.storage import SeriesPaths, write_snapshot
    from runner.store import open_store
    before = hwm()
    started = time.perf_counter()
    with open_store(graph) as store:
        if mode == "export":
            with Session(hosts, "bench", timeout=10.0) as session:
                rows = write_snapshot(store, [CLASS], SeriesPaths(root), session, "bench-1")
        else:  # the former export: everything at once in this process
            import pyarrow as pa
            import pyarrow.parquet as pq
            found = [(a.id, a.class_iri, json.dumps(a.properties, sort_keys=True))
                     for page in store.avatars.scan([CLASS]) for a in page]
            found.sort()
            table = pa.table({"pos": pa.array(range(len(found)), pa.int64()),
                              "id": [r[0] for r in found], "class_iri": [r[1] for r in found],
                              "props": [r[2] for r in found]})
            pq.write_table(table, f"{root}/former.parquet".removeprefix("file://"))
            rows = len(found)
    print(json.dumps({"rows": rows, "seconds": time.perf_counter() - started,
                      "hwm_before": before, "hwm": hwm()}), flush=True)


def run_child(*argv: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "child", *argv], capture_output=True,
                         text=True, check=True)
    figures: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


def sample_rates(graph: Path, tmp: Path) -> tuple[float, float]:
    """Rows/s of raw window reads and of the export over the first SAMPLE avatars."""
    from gremlin_python.process.traversal import P

    from runner.pipeline.snapshot import MemoryProgress, SnapshotExport
    from runner.pipeline.storage import SeriesPaths
    from runner.store import open_store
    from runner.store.gremlin.avatars import EXPORT_WINDOW
    top = 1 + 4 * SAMPLE  # the element ids the first SAMPLE avatars use
    raws, ours = [], []
    with open_store(str(graph)) as store:
        store.graph.element_id_bound = lambda: top - 1  # type: ignore[attr-defined]
        for round_ in range(2):  # alternated, best of each: the box drifts
            started, raw = time.perf_counter(), 0
            for start in range(1, top, EXPORT_WINDOW):
                ids = range(start, min(start + EXPORT_WINDOW, top))
                raw += len(store.graph.read(
                    lambda g, ids=ids: g.V(*ids).has_label("avatar")
                    .has("avatar_class", P.within([CLASS])).element_map().to_list()))
            raws.append(raw / (time.perf_counter() - started))
            export = SnapshotExport(store, [CLASS],
                                    SeriesPaths((tmp / f"sample{round_}").as_uri()),
                                    MemoryProgress())
            started = time.perf_counter()
            rows = export.run()
            ours.append(rows / (time.perf_counter() - started))
            assert rows == raw, (rows, raw)
    return max(raws), max(ours)


def main() -> None:
    from bench._servers import zookeeper
    from runner.store import open_store
    with tempfile.TemporaryDirectory(prefix="latchwork-bench-snapshot-") as d:
        tmp = Path(d)
        graph = tmp / "graph.db"
        started = time.perf_counter()
        bulk_load(graph, ROWS)
        with open_store(str(graph)) as store:  # the layout is the store's own
            assert store.avatars.count() == ROWS
            probe = store.avatars.get(f"av-{ROWS - 1:010d}")
            assert probe.class_iri in (CLASS, OTHER) and "lat" in probe.properties
        print(f"{ROWS:,} avatars bulk-loaded in {time.perf_counter() - started:.0f} s "
              f"({graph.stat().st_size / 2**30:.1f} GiB)")
        raw, ours = sample_rates(graph, tmp)
        print(f"first {SAMPLE:,} avatars: raw gremlite window reads {raw:,.0f} rows/s, "
              f"paged export to Parquet {ours:,.0f} rows/s")
        former = run_child("former", str(graph), tmp.as_uri(), "-")  \
            if SAMPLE == ROWS else None
        with zookeeper() as zk:
            full = run_child("export", str(graph), (tmp / "series").as_uri(), zk.hosts)
        print(f"paged export of {ROWS:,} avatars ({full['rows']:,} eligible): "
              f"{full['seconds']:.0f} s, peak RSS {full['hwm'] / 2**20:,.0f} MiB "
              f"(the interpreter and imports before it: {full['hwm_before'] / 2**20:,.0f} MiB)")
        if former is not None:
            print(f"former export (all at once) of the same: peak RSS "
                  f"{former['hwm'] / 2**20:,.0f} MiB")
        else:
            print("former export (all at once) skipped: run with LATCHWORK_BENCH_ROWS=1000000 "
                  "to see it beside the paged one")
        print(f"ratio export/raw-read rows/s: {ours / raw:.2f} (target >= 0.8)")
        print(f"peak RSS of the export: {full['hwm'] / 2**30:.2f} GiB (bound 1 GiB, "
              f"whatever the graph's size)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child(sys.argv[2:])
    else:
        main()
