"""The coordinated pipeline on a real Spark standalone cluster vs one plain job on it; one run.

A Master and two Workers (one core and 1 GiB each: the box has two cores) are started from the
pyspark distribution (``runner.testing.sparkcluster``), and one driver connects with the
UI off. Then, as in bench_pipeline.py but on the cluster: N generated avatars (default 10M,
LATCHWORK_BENCH_ROWS to change) in a Parquet snapshot; the ``geo`` aspect computed in batches
handed out by the batch coordinator on a private ZooKeeper (two batch loops, as an aspect.create
task and its helper, each batch written and committed by rename) ÷ one plain Spark job doing the
same computation and write over the whole snapshot, on the same executors. Target <= 1.15.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._servers import zookeeper
from bench.bench_pipeline import BATCHES, ROWS, coordinated, generate, plain
from runner.config import Settings
from runner.pipeline.aspects import AspectRegistry
from runner.pipeline.spark import spark_session, stop_spark
from runner.testing.sparkcluster import SparkStandalone


def main() -> None:
    definition = AspectRegistry().get("geo")
    tmp = Path(tempfile.mkdtemp(prefix="latchwork-bench-spark-cluster-"))
    cluster = SparkStandalone(tmp / "spark", workers=2, cores=1, memory="1500m")
    cluster.start()
    try:
        spark = spark_session(Settings(
            spark_master=cluster.url, spark_driver_memory="2g",
            spark_driver_host="127.0.0.1", spark_driver_bind_address="127.0.0.1",
            spark_conf={"spark.ui.enabled": "false", "spark.executor.memory": "1g",
                        "spark.executor.cores": "1", "spark.cores.max": "2"}),
            "latchwork-bench-cluster")
        apps = cluster.status().get("activeapps", [])
        print(f"Spark standalone at {cluster.url}: {cluster.alive_workers()} workers, "
              f"{apps[0].get('cores') if apps else 0} cores for this driver")
        snapshot = tmp / "series" / "snapshot"
        generate(spark, snapshot.as_uri())
        print(f"{ROWS:,} avatars generated in {snapshot}")
        plain(spark, snapshot.as_uri(), (tmp / "warm").as_uri(), definition)  # warm-up
        t_plain = plain(spark, snapshot.as_uri(), (tmp / "plain").as_uri(), definition)
        print(f"plain Spark job on the cluster: {t_plain:.1f} s ({ROWS / t_plain:,.0f} rows/s)")
        with zookeeper() as zk:
            started = time.perf_counter()
            t_coord = coordinated(spark, zk.hosts, (tmp / "series").as_uri(), definition)
        print(f"coordinated, {BATCHES} batches on the cluster: {t_coord:.1f} s "
              f"({ROWS / t_coord:,.0f} rows/s; {time.perf_counter() - started:.1f} s with "
              "ZooKeeper's start)")
        print(f"ratio coordinated/plain-spark wall time on the cluster: {t_coord / t_plain:.2f} "
              "(target <= 1.15)")
    finally:
        stop_spark()
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
