"""Table contracts as StructTypes: used to create the tables, to write them and in tests."""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DateType,
    DoubleType,
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

# JSON payload contracts (DESIGN.md §2), in schema order: the order fields are checked
# in, and the known top-level names (everything else is rescued). Types are the typed
# columns a valid payload yields, not the JSON types (timestamps arrive as ISO-8601
# strings or epoch milliseconds, dates as strings).
GEOLOCATION = StructType([StructField("city", StringType()), StructField("country", StringType())])

SENSOR_READING_PAYLOAD = StructType(
    [
        StructField("event_id", StringType(), nullable=False),
        StructField("device_id", StringType(), nullable=False),
        StructField("user_id", LongType()),
        StructField("sensor_type", StringType(), nullable=False),
        StructField("event_time", TimestampType(), nullable=False),
        StructField("value", DoubleType()),
        StructField("unit", StringType()),
        StructField("danger_level", StringType()),
        StructField("x", DoubleType()),
        StructField("y", DoubleType()),
        StructField("z", DoubleType()),
        StructField("activity", StringType()),
        StructField("model", StringType()),
        StructField("geolocation", GEOLOCATION),
    ]
)

USER_PAYLOAD = StructType(
    [
        StructField("user_id", LongType(), nullable=False),
        StructField("first_name", StringType()),
        StructField("last_name", StringType()),
        StructField("dob", DateType()),
        StructField("gender", StringType()),
        StructField("country", StringType()),
        StructField("updated_at", TimestampType(), nullable=False),
    ]
)

_LINEAGE = [
    StructField("kafka_topic", StringType(), nullable=False),
    StructField("kafka_partition", IntegerType(), nullable=False),
    StructField("kafka_offset", LongType(), nullable=False),
    StructField("kafka_timestamp", TimestampType()),
]

# Valid readings, typed (DESIGN.md §3); partitioned by event_date (UTC day of event_time).
SILVER_SENSOR_READINGS = StructType(
    [
        StructField("event_id", StringType(), nullable=False),
        StructField("device_id", StringType(), nullable=False),
        StructField("user_id", LongType()),
        StructField("sensor_type", StringType(), nullable=False),
        StructField("event_time", TimestampType(), nullable=False),
        StructField("value", DoubleType()),
        StructField("unit", StringType()),
        StructField("danger_level", StringType()),
        StructField("x", DoubleType()),
        StructField("y", DoubleType()),
        StructField("z", DoubleType()),
        # sqrt(x² + y² + z²) for accelerometer readings, null otherwise.
        StructField("magnitude", DoubleType()),
        StructField("activity", StringType()),
        StructField("model", StringType()),
        StructField("geo_city", StringType()),
        StructField("geo_country", StringType()),
        StructField("_rescued", StringType()),
        *_LINEAGE,
        StructField("ingested_at", TimestampType(), nullable=False),
        StructField("event_date", DateType(), nullable=False),
    ]
)

# Current profile per user (DESIGN.md §3); lineage is that of the change applied last.
SILVER_USERS = StructType(
    [
        StructField("user_id", LongType(), nullable=False),
        StructField("first_name", StringType()),
        StructField("last_name", StringType()),
        StructField("dob", DateType()),
        StructField("gender", StringType()),
        StructField("country", StringType()),
        StructField("updated_at", TimestampType()),
        StructField("is_deleted", BooleanType(), nullable=False),
        StructField("deleted_at", TimestampType()),
        StructField("_rescued", StringType()),
        *_LINEAGE,
        StructField("ingested_at", TimestampType(), nullable=False),
    ]
)

# Rejected records of every topic, with the raw value and the reason (DESIGN.md §3).
QUARANTINE = StructType(
    [
        *_LINEAGE,
        StructField("key", StringType()),
        StructField("value", StringType()),
        StructField("error_code", StringType(), nullable=False),
        StructField("error_detail", StringType()),
        StructField("quarantined_at", TimestampType(), nullable=False),
    ]
)

# Readings dropped as duplicates (an audit of what silver/sensor_readings left out),
# so that silver + quarantine + duplicates reconcile with bronze by Kafka coordinates.
SENSOR_DUPLICATES = StructType(
    [
        StructField("event_id", StringType(), nullable=False),
        StructField("kafka_topic", StringType(), nullable=False),
        StructField("kafka_partition", IntegerType(), nullable=False),
        StructField("kafka_offset", LongType(), nullable=False),
        StructField("kafka_timestamp", TimestampType()),
        StructField("ingested_at", TimestampType()),
        StructField("original_kafka_partition", IntegerType()),
        StructField("original_kafka_offset", LongType()),
    ]
)
