"""The driver JVM's classes, as py4j reaches them from Python."""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession


def java_class(spark: SparkSession, name: str) -> Any:
    """The class ``name`` (fully qualified; ``$`` for a nested class or a Scala object) in
    ``spark``'s driver JVM, resolved in one py4j round trip.

    py4j's attribute path (``jvm.org.apache.hadoop.fs.Path``) resolves each package
    prefix in a round trip of its own, and each is a class lookup that fails across the
    driver's whole classpath; a short name (``jvm.scala``) tries every import first.
    """
    return getattr(spark.sparkContext._jvm, name)


def set_scheduler_pool(spark: SparkSession, pool: str | None) -> None:
    """Put the jobs this thread (and a thread it starts) submits in the FAIR scheduler's
    ``pool``; None puts them back in the default pool."""
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", pool)  # type: ignore[arg-type]
