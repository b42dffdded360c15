"""`local_frame`: the driver's few rows reach Spark as a local relation, values intact."""

from __future__ import annotations

from datetime import UTC, datetime

from pyspark.sql import SparkSession
from pyspark.sql.types import (
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from service.lake.local_rows import local_frame

SCHEMA = StructType(
    [
        StructField("id", StringType(), nullable=False),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("flag", BooleanType()),
        StructField("at", TimestampType()),
    ]
)


def test_rows_are_a_local_relation_with_the_values_python_rows_give(spark: SparkSession) -> None:
    rows = [
        ("é-1", 0, 2**40, True, datetime(2026, 3, 1, 12, 30, 0, 123456, tzinfo=UTC)),
        ("2", None, None, None, None),
        ("", -1, -(2**63), False, datetime(1900, 1, 1, tzinfo=UTC)),
    ]
    frame = local_frame(spark, rows, SCHEMA)

    assert frame.schema == SCHEMA
    plan = frame._jdf.queryExecution().optimizedPlan().toString()
    assert plan.startswith("LocalRelation"), plan  # no Python RDD, no Python worker
    # Spark reads the same rows as from Python rows, instants included.
    assert frame.collect() == spark.createDataFrame(rows, SCHEMA).collect()
    assert [r.at for r in frame.orderBy("id").collect()][:2] == [datetime(1900, 1, 1), None]


def test_no_rows_make_an_empty_frame_of_the_schema(spark: SparkSession) -> None:
    frame = local_frame(spark, [], SCHEMA)
    assert frame.schema == SCHEMA
    assert frame.collect() == []
