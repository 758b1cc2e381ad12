"""The pinned PySpark runs on this machine's JDK (Debian 12: OpenJDK 17)."""

from __future__ import annotations

import shutil


def test_pyspark_runs_a_job_on_the_installed_jdk() -> None:
    assert shutil.which("java") is not None, "no java (apt-get install default-jre-headless)"
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (SparkSession.builder.master("local[1]").appName("latchwork-smoke")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.driver.host", "127.0.0.1")
             .getOrCreate())
    try:
        df = spark.range(1000).withColumn("even", (F.col("id") % 2) == 0)
        assert df.filter("even").count() == 500
        assert spark.version.startswith("4.0")
    finally:
        spark.stop()

