"""Rows for unit tests: Kafka records as the bronze table holds them, silver readings."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
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

from service.ingest.bronze import to_records
from service.ingest.modes.dedup import id_hash
from service.lake.schemas import KAFKA_HEADERS, SILVER_SENSOR_READINGS

ARRIVAL = datetime.datetime(2024, 5, 1, 12, 0, 0, tzinfo=datetime.UTC)
# Prefix of a value given as hex bytes (to carry invalid UTF-8 through createDataFrame).
HEX = "hex:"
# The columns of Spark's Kafka source (but ``timestampType``).
KAFKA_SOURCE = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("headers", KAFKA_HEADERS),
    ]
)


def bronze_frame(
    spark: SparkSession,
    records: Sequence[tuple[str | None, str | None]],
    topic: str,
    arrival: datetime.datetime = ARRIVAL,
    partition: int = 0,
    first_offset: int = 0,
) -> DataFrame:
    """Bronze rows of (key, value) records at consecutive offsets, all arriving at ``arrival``.

    A value starting with `HEX` is given as hex bytes (to carry invalid UTF-8).
    """
    rows = [
        (_bytes(key), _bytes(value), topic, partition, first_offset + i, arrival, None)
        for i, (key, value) in enumerate(records)
    ]
    source = spark.createDataFrame(rows, KAFKA_SOURCE)
    return to_records(source).withColumn("ingested_at", F.lit(arrival))


def _bytes(text: str | None) -> bytes | None:
    if text is None:
        return None
    return bytes.fromhex(text[len(HEX) :]) if text.startswith(HEX) else text.encode()


def readings(
    spark: SparkSession, rows: Sequence[tuple[str, int, int, datetime.datetime]]
) -> DataFrame:
    """silver/sensor_readings rows (event_id, partition, offset, arrival), the rest filled in."""
    names = SILVER_SENSOR_READINGS.fieldNames()
    full = []
    for event_id, partition, offset, arrival in rows:
        values: dict[str, Any] = {
            "event_id": event_id, "device_id": "d", "sensor_type": "heart_rate",
            "event_time": arrival, "value": 70.0, "kafka_topic": "sensors",
            "kafka_partition": partition, "kafka_offset": offset, "kafka_timestamp": arrival,
            "ingested_at": arrival, "event_date": arrival.date(),
        }  # fmt: skip
        full.append(tuple(values.get(n) for n in names))
    return spark.createDataFrame(full, SILVER_SENSOR_READINGS)


def id_hashes(spark: SparkSession, *ids: str) -> frozenset[int]:
    """The dedup `id_hash`es of ``ids``: what a sighting names as candidates."""
    named = spark.createDataFrame([(i,) for i in ids], "event_id string")
    return frozenset(r.h for r in named.select(id_hash("event_id").alias("h")).collect())
