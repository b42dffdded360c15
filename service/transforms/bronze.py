"""Kafka source rows → bronze rows (DESIGN.md §3), unchanged but for names and types."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from service.schemas import BRONZE


def to_bronze(kafka_rows: DataFrame, ingested_at: Column | None = None) -> DataFrame:
    """Map Spark Kafka source columns to the bronze schema.

    ``value`` keeps the record's bytes as a string (a tombstone stays null);
    ``ingested_at`` defaults to the micro-batch's ``current_timestamp()``.
    """
    return kafka_rows.select(
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").alias("value"),
        F.col("topic").alias("kafka_topic"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        F.col("headers").alias("headers"),
        (ingested_at if ingested_at is not None else F.current_timestamp()).alias("ingested_at"),
    ).select([F.col(f.name).cast(f.dataType) for f in BRONZE.fields])
