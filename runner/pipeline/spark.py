"""The Spark session factory: one session per process, built from :class:`Settings`.

``local[*]`` by default; any master URL, driver memory and extra settings come from the
configuration (``spark_master``, ``spark_driver_memory``, ``spark_conf``). The driver binds to
loopback unless ``spark_conf`` says otherwise (a real cluster needs a reachable driver host).
Tests use ``local[2]``, the UI off and 2 shuffle partitions (:data:`TEST_CONF`).

Failure behaviour: when the Python process dies (even kill -9) the driver JVM sees its stdin
close and exits with it (PySpark's gateway does that), taking its running jobs along.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from runner.config import Settings

log = logging.getLogger("latchwork.spark")

TEST_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}
DEFAULT_CONF = {
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
}

_lock = threading.Lock()
_session: Any = None


def spark_session(settings: Settings, app_name: str = "latchwork") -> Any:
    """The process's SparkSession, created on first use (thread-safe)."""
    global _session
    with _lock:
        if _session is None:
            # loopback unless told otherwise (Spark would pick the first interface)
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            from pyspark.sql import SparkSession
            builder = (SparkSession.builder.master(settings.spark_master).appName(app_name)
                       .config("spark.driver.memory", settings.spark_driver_memory))
            for key, value in {**DEFAULT_CONF, **settings.spark_conf}.items():
                builder = builder.config(key, value)
            _session = builder.getOrCreate()
            _session.sparkContext.setLogLevel("WARN")
            log.info("Spark %s session started (master %s)", _session.version,
                     settings.spark_master)
        return _session


def stop_spark() -> None:
    global _session
    with _lock:
        if _session is not None:
            _session.stop()
            _session = None
