"""to_bronze: Kafka source rows become bronze rows, bytes and coordinates intact."""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from service.schemas import BRONZE, KAFKA_HEADERS
from service.transforms.bronze import to_bronze

KAFKA_SOURCE = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField("headers", KAFKA_HEADERS),
    ]
)
AT = datetime(2026, 11, 21, 12, 0, 0)


def test_to_bronze_keeps_every_record_with_its_coordinates(spark: SparkSession) -> None:
    source = spark.createDataFrame(
        [
            (b"7", b'{"user_id": 7}', "users", 2, 41, AT, 0, [("trace", b"abc")]),
            (b"7", None, "users", 2, 42, AT, 0, None),
            (None, b"\xff\xfe not utf-8", "users", 0, 5, AT, 0, []),
        ],
        KAFKA_SOURCE,
    )
    rows = to_bronze(source, F.lit(AT)).orderBy("kafka_partition", "kafka_offset").collect()
    assert [
        (None, 0, 5, []),
        ("7", 2, 41, [("trace", bytearray(b"abc"))]),
        ("7", 2, 42, None),
    ] == [(r.key, r.kafka_partition, r.kafka_offset, r.headers) for r in rows]
    assert ['{"user_id": 7}', None] == [rows[1].value, rows[2].value]
    assert {"users"} == {r.kafka_topic for r in rows}
    assert {AT} == {r.ingested_at for r in rows} == {r.kafka_timestamp for r in rows}


def test_to_bronze_has_exactly_the_bronze_schema(spark: SparkSession) -> None:
    source = spark.createDataFrame([], KAFKA_SOURCE)
    assert [(f.name, f.dataType) for f in BRONZE.fields] == [
        (f.name, f.dataType) for f in to_bronze(source).schema.fields
    ]


def test_invalid_utf8_bytes_survive_into_bronze_value(spark: SparkSession) -> None:
    raw = b'{"a": "\xff"}'
    source = spark.createDataFrame([(None, raw, "s", 0, 0, AT, 0, None)], KAFKA_SOURCE)
    bronze = to_bronze(source).select(
        F.expr("is_valid_utf8(value)").alias("valid"), F.octet_length("value").alias("size")
    )
    assert [(False, len(raw))] == [(r.valid, r.size) for r in bronze.collect()]
