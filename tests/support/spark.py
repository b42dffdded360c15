"""The tests' side of Spark: what a piece of code made Spark do."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import SparkSession


def jobs_of(spark: SparkSession, group: str, write: Callable[[], object]) -> int:
    """How many Spark jobs ``write`` started (run in the job group ``group``)."""
    context = spark.sparkContext
    context.setJobGroup(group, group)
    try:
        write()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    return len(context.statusTracker().getJobIdsForGroup(group))
