"""The tests' side of Spark: the test process's one session and what code made Spark do."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from pyspark.sql import SparkSession

from service.config import Settings
from service.streaming.session import build_spark
from tests.support.service_process import TEST_JVM_OPTIONS

# Low, so that a test sees auto-compaction after a handful of appends.
COMPACT_MIN_FILES = 6


def local_spark(s3_env: Mapping[str, str] | None = None) -> SparkSession:
    """A local[2] SparkSession configured exactly like the service's, minus the UI, that
    compacts a table's small files after COMPACT_MIN_FILES appends; with ``s3_env`` (the
    standard AWS variables) it also reads and writes that S3 server through s3a.

    Its JVM runs with the test drivers' options (C1 only, the serial collector): the
    suite's plans are many and each runs on little data, so C2's compilations cost more
    than they return (tests/unit/ingest: 161 CPU-s against 201; the differential test
    54 s and 65 CPU-s against 68 s and 105)."""
    if s3_env is not None:
        # The JVM inherits these at launch: s3a reads them, and the settings take the
        # endpoint from AWS_ENDPOINT_URL.
        os.environ.update(s3_env)
    settings = Settings(
        spark_master="local[2]",
        spark_ui_enabled=False,
        spark_shuffle_partitions=2,
        compact_min_files=COMPACT_MIN_FILES,
        spark_extra_conf={"spark.driver.extraJavaOptions": TEST_JVM_OPTIONS},
    )
    session = build_spark(settings)
    session.sparkContext.setLogLevel("ERROR")
    return session


def jobs_of(spark: SparkSession, group: str, write: Callable[[], object]) -> int:
    """How many Spark jobs ``write`` started (run in the job group ``group``)."""
    context = spark.sparkContext
    context.setJobGroup(group, group)
    try:
        write()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    return len(context.statusTracker().getJobIdsForGroup(group))
