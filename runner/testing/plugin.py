"""pytest plugin for latchwork's own tests and for users' tests of their task types:
``pytest_plugins = ["runner.testing.plugin"]``.

It loads the ZooKeeper fixtures of :mod:`coord.testing.plugin` and the RabbitMQ fixtures of
:mod:`messaging.testing.plugin`, and adds ``spark``: the run's one SparkSession (local[2], UI
off). :mod:`runner.testing.cluster` builds a cluster of node processes over them. A Docker engine
is never required: the local-process path is the one CI runs (see docs/testing.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest_plugins = ["coord.testing.plugin", "messaging.testing.plugin"]


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The test run's one SparkSession (local[2], UI off, 2 shuffle partitions)."""
    from runner.config import Settings
    from runner.pipeline.spark import TEST_CONF, spark_session, stop_spark
    session = spark_session(Settings.load(spark_master="local[2]", spark_conf=TEST_CONF,
                                          spark_driver_memory="1g"), "latchwork-tests")
    yield session
    stop_spark()
