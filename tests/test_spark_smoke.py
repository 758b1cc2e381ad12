"""The pinned PySpark runs on this machine's JDK (Debian 12: OpenJDK 17)."""

from __future__ import annotations

import shutil
from typing import Any


def test_pyspark_runs_a_job_on_the_installed_jdk(spark: Any) -> None:
    assert shutil.which("java") is not None, "no java (apt-get install default-jre-headless)"
    from pyspark.sql import functions as F

    df = spark.range(1000).withColumn("even", (F.col("id") % 2) == 0)
    assert df.filter("even").count() == 500
    assert spark.version.startswith("4.0")
    assert spark.conf.get("spark.ui.enabled") == "false"
    assert spark.sparkContext.master == "local[2]"
