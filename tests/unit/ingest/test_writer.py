"""A small batch is read, validated and written in one task; a large or unknown one as read."""

from __future__ import annotations

from pyspark.sql import SparkSession

from service.ingest.writer import ONE_TASK_OFFSETS, in_one_task_if_small


def test_a_batch_of_few_offsets_runs_in_one_task_and_others_as_read(spark: SparkSession) -> None:
    rows = spark.range(0, 30, numPartitions=3)
    start = {0: 100, 1: 0, 2: 7}
    small = {0: 100 + ONE_TASK_OFFSETS - 7, 1: 0, 2: 14}  # exactly the limit
    large = {**small, 1: 1}
    partitions = {
        name: in_one_task_if_small(rows, begin, end).rdd.getNumPartitions()
        for name, (begin, end) in {
            "small": (start, small),
            "large": (start, large),
            "a partition's start unknown": ({0: 100, 1: 0}, small),
            "no offsets": ({}, {}),
        }.items()
    }
    assert {
        "small": 1,
        "large": 3,
        "a partition's start unknown": 3,
        "no offsets": 3,
    } == partitions
    assert sorted(r.id for r in in_one_task_if_small(rows, start, small).collect()) == list(
        range(30)
    )
