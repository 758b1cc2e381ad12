"""The Spark session factory: one session per process, built from :class:`Settings`.

``local[*]`` by default; any master URL, driver memory and extra settings come from the
configuration (``spark_master``, ``spark_driver_memory``, ``spark_conf``). Where the driver
listens and the address executors reach it at (:func:`driver_addresses`): with a local master,
127.0.0.1 for both; with a cluster master (``spark://``, ``yarn``, ``k8s://``), this host's name
as it resolves and 0.0.0.0, which works on a cluster whose hosts resolve each other's names;
``spark_driver_host`` and ``spark_driver_bind_address`` set them (a host with several
interfaces, NAT, containers). Tests use ``local[2]`` or a standalone cluster on loopback, the
UI off and 2 shuffle partitions (:data:`TEST_CONF`).

Failure behaviour: when the Python process dies (even kill -9) the driver JVM sees its stdin
close and exits with it (PySpark's gateway does that), taking its running jobs along.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

from runner.config import Settings

log = logging.getLogger("latchwork.spark")

TEST_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}
DEFAULT_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
}


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def driver_addresses(settings: Settings) -> tuple[str, str]:
    """(host executors reach the driver at, address the driver binds to); see the module."""
    if is_local(settings.spark_master):
        host, bind = "127.0.0.1", "127.0.0.1"
    else:
        try:
            host = socket.gethostbyname(socket.getfqdn())
        except OSError:
            host = socket.gethostname()
        bind = "0.0.0.0"
    return (settings.spark_driver_host or host, settings.spark_driver_bind_address or bind)

_lock = threading.Lock()
_session: Any = None


def spark_session(settings: Settings, app_name: str = "latchwork") -> Any:
    """The process's SparkSession, created on first use (thread-safe)."""
    global _session
    with _lock:
        if _session is None:
            host, bind = driver_addresses(settings)
            # the address Spark's JVM picks for itself when nothing else says (it would take
            # the first interface)
            os.environ.setdefault("SPARK_LOCAL_IP", bind if bind != "0.0.0.0" else host)
            from pyspark.sql import SparkSession
            builder = (SparkSession.builder.master(settings.spark_master).appName(app_name)
                       .config("spark.driver.memory", settings.spark_driver_memory))
            conf = {**DEFAULT_CONF, "spark.driver.host": host, "spark.driver.bindAddress": bind,
                    **settings.spark_conf}
            for key, value in conf.items():
                builder = builder.config(key, value)
            _session = builder.getOrCreate()
            _session.sparkContext.setLogLevel("WARN")
            log.info("Spark %s session started (master %s, driver at %s, bound to %s)",
                     _session.version, settings.spark_master, host, bind)
        return _session


def stop_spark() -> None:
    global _session
    with _lock:
        if _session is not None:
            _session.stop()
            _session = None
