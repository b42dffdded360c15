"""BatchProfile: a batch's phases and the Spark jobs it ran, for the batch_written line."""

from __future__ import annotations

from pyspark.sql import SparkSession

from service.streaming.profile import BatchProfile


def test_phases_add_up_and_only_the_batchs_jobs_are_counted(spark: SparkSession) -> None:
    context = spark.sparkContext
    context.parallelize(range(4), 2).count()  # before the batch: not counted
    profile = BatchProfile(context)
    with profile.phase("read_validate"):
        context.parallelize(range(4), 2).count()
    with profile.phase("bronze/sensors"):
        context.parallelize(range(4), 2).count()
    with profile.phase("read_validate"):
        pass

    summary = profile.summary()

    assert 2 == summary["spark_jobs"]
    phases = summary["phases_ms"]
    assert isinstance(phases, dict)
    assert ["read_validate", "bronze/sensors"] == list(phases)
    assert isinstance(summary["duration_ms"], int)
    # Each figure is rounded to the millisecond on its own.
    assert summary["duration_ms"] + len(phases) >= sum(phases.values())
