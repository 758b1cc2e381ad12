"""A node without the ``pipeline`` extra (issue 70, item 11): ``pip install latchwork`` pulled
pyspark (about 450 MB), pandas and pyarrow into every install. Now they are the extra
``latchwork[pipeline]``; a node without it starts and runs tasks, and what needs it is refused
in one line naming the extra. The extra's absence is made by an import blocker installed
through ``sitecustomize`` in the processes the test starts (the suite's venv has the extra),
not a second venv."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from runner.testing.cluster import Cluster

BLOCKER = '''
import sys


class _WithoutThePipelineExtra:
    """pyspark, pyarrow and pandas as if not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("pyspark", "pyarrow", "pandas", "py4j"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None


sys.meta_path.insert(0, _WithoutThePipelineExtra())
'''


def without_extra(cluster: Cluster, tmp_path: Path) -> None:
    site = tmp_path / "no-pipeline"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    cluster.env["PYTHONPATH"] = str(site)


def test_a_node_without_the_pipeline_extra_runs_tasks_and_refuses_what_needs_it(
        cluster: Cluster, tmp_path: Path) -> None:
    without_extra(cluster, tmp_path)
    proof = subprocess.run([sys.executable, "-c", "import pyspark"], env=cluster.env,
                           capture_output=True, text=True, timeout=60, check=False)
    assert proof.returncode == 1 and "No module named 'pyspark'" in proof.stderr  # blocked
    member = cluster.start_node()
    with cluster.client(timeout=30) as client:
        task = client.submit("diag.sleep", {"seconds": 0})
        assert client.wait(task.id, 30).succeeded
    names = "pipeline extra (Spark, pyarrow, pandas), which is not installed"
    submitted = cluster.cli("task", "submit", "aspect.create",
                            "--payload", '{"aspect": "geo", "generation": 1}')
    assert submitted.exit_code == 2 and names in submitted.output, submitted.output
    assert "pip install 'latchwork[pipeline]'" in submitted.output
    created = cluster.cli("aspect", "create", "geo")
    assert created.exit_code == 2 and names in created.output, created.output
    (tmp_path / "avatars.parquet").write_bytes(b"PAR1")  # not read: refused before
    imported = cluster.cli("avatars", "import", str(tmp_path / "avatars.parquet"))
    assert imported.exit_code == 2 and names in imported.output, imported.output
    dev = cluster.cli("dev", "up", "--spark-workers", "1", "--dir", str(tmp_path / "dev"))
    assert dev.exit_code == 2 and names in dev.output, dev.output
    for result in (submitted, created, imported, dev):
        assert len(result.output.strip().splitlines()) <= 3 and "Traceback" not in \
            result.output
    log = cluster.nodes[member].log_path.read_text()
    assert "Traceback" not in log


def test_archive_retention_without_the_extra_stops_the_start_in_one_line(
        cluster: Cluster, tmp_path: Path) -> None:
    without_extra(cluster, tmp_path)
    cluster.env.update(LATCHWORK_RETENTION_DAYS="30", LATCHWORK_RETENTION_MODE="archive")
    started = cluster.start_without_tasks_setting()
    assert started.returncode == 2, started.stderr
    lines = [line for line in started.stderr.strip().splitlines() if line.startswith("Error")]
    assert len(lines) == 1 and 'retention_mode = "archive"' in lines[0] and \
        "latchwork[pipeline]" in lines[0], started.stderr
