"""One local SparkSession (with the Delta and Kafka jars) for the whole unit session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from service.config import Settings
from service.streaming.session import build_spark

# Low, so that a test sees auto-compaction after a handful of appends.
COMPACT_MIN_FILES = 6


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A local[2] SparkSession configured exactly like the service's, minus the UI."""
    settings = Settings(
        spark_master="local[2]",
        spark_ui_enabled=False,
        spark_shuffle_partitions=2,
        compact_min_files=COMPACT_MIN_FILES,
    )
    session = build_spark(settings)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
