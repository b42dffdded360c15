"""Table contracts as StructTypes: used to create the tables, to write them and in tests."""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

KAFKA_HEADERS = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)

# Every Kafka record as received (DESIGN.md §3): one row per (topic, partition, offset).
BRONZE = StructType(
    [
        StructField("key", StringType()),
        StructField("value", StringType()),
        StructField("kafka_topic", StringType(), nullable=False),
        StructField("kafka_partition", IntegerType(), nullable=False),
        StructField("kafka_offset", LongType(), nullable=False),
        StructField("kafka_timestamp", TimestampType()),
        StructField("headers", KAFKA_HEADERS),
        StructField("ingested_at", TimestampType(), nullable=False),
    ]
)
