"""StructType contracts: the JSON payloads (docs/promises.md) and the table schemas from them.

Each payload contract is declared once. The typed columns a valid payload yields
(`payload_columns`: nested objects flattened, e.g. ``geolocation.city`` →
``geo_city``), the silver table schemas and the validation field lists
(`service.ingest.validation.payload_fields`) are all derived from it.
"""

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

# A contract's silver tables and the columns they share with the lake's other tables are
# defined with the contracts, whose loader builds them; the lake imports them from here.
from service.contracts.silver import COORDINATES as COORDINATES
from service.contracts.silver import INGESTED_AT as INGESTED_AT
from service.contracts.silver import LINEAGE as LINEAGE
from service.contracts.silver import RESCUED as RESCUED
from service.contracts.silver import duplicates_schema as duplicates_schema
from service.contracts.silver import silver_schema as silver_schema

# StructField metadata key: the column-name prefix of a nested object's flattened fields.
FLATTEN_PREFIX = "flatten_prefix"

KAFKA_HEADERS = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)


# A record's exact bytes, and their text where they are valid UTF-8 (null otherwise):
# no STRING column ever holds invalid UTF-8, so every Delta reader can read the tables.
RAW_RECORD = (
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("key_text", StringType()),
    StructField("value_text", StringType()),
)

# Every Kafka record as received (docs/promises.md): one row per (topic, partition, offset).
# `KAFKA_RECORD` is the same without the write's ``ingested_at`` stamp.
KAFKA_RECORD = StructType([*RAW_RECORD, *LINEAGE, StructField("headers", KAFKA_HEADERS)])
BRONZE = StructType([*KAFKA_RECORD.fields, INGESTED_AT])

# JSON payload contracts (docs/promises.md), in schema order: the order fields are checked
# in, and the known top-level names (everything else is rescued). Types are the typed
# columns a valid payload yields, not the JSON types (timestamps arrive as ISO-8601
# strings or epoch milliseconds, dates as strings).
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
        StructField(
            "geolocation",
            StructType([StructField("city", StringType()), StructField("country", StringType())]),
            metadata={FLATTEN_PREFIX: "geo_"},
        ),
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


def payload_columns(payload: StructType) -> list[tuple[str, StructField]]:
    """The typed columns of a payload as (JSON path, column), nested objects flattened."""
    columns: list[tuple[str, StructField]] = []
    for field in payload.fields:
        if isinstance(field.dataType, StructType):
            prefix = field.metadata.get(FLATTEN_PREFIX, f"{field.name}_")
            columns += [
                (f"{field.name}.{child.name}", StructField(prefix + child.name, child.dataType))
                for child in field.dataType.fields
            ]
        else:
            columns.append((field.name, field))
    return columns


# sqrt(x² + y² + z²) for accelerometer readings, null otherwise.
MAGNITUDE = StructField("magnitude", DoubleType())
# The typed reading: the payload's columns and the derived magnitude.
SENSOR_READING = StructType([*(c for _, c in payload_columns(SENSOR_READING_PAYLOAD)), MAGNITUDE])

# Valid readings, typed (docs/promises.md); partitioned by event_date (UTC day of event_time).
SILVER_SENSOR_READINGS = StructType(
    [
        *SENSOR_READING.fields,
        RESCUED,
        *LINEAGE,
        INGESTED_AT,
        StructField("event_date", DateType(), nullable=False),
    ]
)

USER_ID = USER_PAYLOAD["user_id"]
# A user's profile: every payload column but the id, nullable (a deleted user has none).
USER_PROFILE = StructType(
    [StructField(c.name, c.dataType) for _, c in payload_columns(USER_PAYLOAD) if c != USER_ID]
)

# Current profile per user (docs/promises.md); lineage is that of the change applied last.
SILVER_USERS = StructType(
    [
        USER_ID,
        *USER_PROFILE.fields,
        StructField("is_deleted", BooleanType(), nullable=False),
        StructField("deleted_at", TimestampType()),
        RESCUED,
        *LINEAGE,
        INGESTED_AT,
    ]
)

# Rejected records of every topic, with the raw value and the reason (docs/promises.md).
QUARANTINE = StructType(
    [
        *LINEAGE,
        *RAW_RECORD,
        StructField("error_code", StringType(), nullable=False),
        StructField("error_detail", StringType()),
        StructField("quarantined_at", TimestampType(), nullable=False),
    ]
)

# What each `replay-quarantine` did with each quarantined record it took (one row per
# record and replay and state): ``planned`` (the replay's plan, with the code the record
# was quarantined with), then ``silver`` or ``duplicate`` (moved: it is in
# silver/sensor_readings, silver/users or silver/sensor_duplicates now) or ``rejected``
# (with the code it fails with now; a later replay may take it again).
QUARANTINE_REPLAYS = StructType(
    [
        *LINEAGE,
        StructField("replay_id", StringType(), nullable=False),
        StructField("replayed_at", TimestampType(), nullable=False),
        StructField("outcome", StringType(), nullable=False),
        StructField("error_code", StringType()),
        StructField("error_detail", StringType()),
    ]
)

# Kafka offsets the ingest never read because the brokers no longer had them when the
# driver started (retention or DeleteRecords removed them first), skipped on the
# operator's word (INGEST_KAFKA_SKIP_LOST_OFFSETS): ``first_offset``..``last_offset``
# of one topic partition, which reconcile then accepts as a gap in bronze.
SKIPPED_OFFSETS = StructType(
    [
        StructField("kafka_topic", StringType(), nullable=False),
        StructField("kafka_partition", IntegerType(), nullable=False),
        StructField("first_offset", LongType(), nullable=False),
        StructField("last_offset", LongType(), nullable=False),
        StructField("offsets", LongType(), nullable=False),
        StructField("skipped_at", TimestampType(), nullable=False),
        StructField("query", StringType(), nullable=False),
        StructField("reason", StringType(), nullable=False),
    ]
)

# Offsets a batch's Kafka range covered that held no record a read-committed consumer
# can read: transaction markers, aborted transactions' records, records the log cleaner
# compacted away before they were read. ``first_offset``..``last_offset`` of one topic
# partition, recorded by the ingest query whose ``batch_id`` covered them, so reconcile
# tells such a gap in bronze from a lost record.
OFFSET_GAPS = StructType(
    [
        StructField("kafka_topic", StringType(), nullable=False),
        StructField("kafka_partition", IntegerType(), nullable=False),
        StructField("first_offset", LongType(), nullable=False),
        StructField("last_offset", LongType(), nullable=False),
        StructField("offsets", LongType(), nullable=False),
        StructField("query", StringType(), nullable=False),
        StructField("batch_id", LongType(), nullable=False),
        StructField("recorded_at", TimestampType(), nullable=False),
    ]
)

# What each `promote` did: one row when it starts (``started``) and one when its silver
# MERGE has committed (``done``, with the rows whose rescued value became the column and
# those whose value is invalid under the contract, kept in ``_rescued``).
PROMOTIONS = StructType(
    [
        StructField("run_id", StringType(), nullable=False),
        StructField("contract", StringType(), nullable=False),
        StructField("table", StringType(), nullable=False),
        StructField("fields", StringType(), nullable=False),
        StructField("outcome", StringType(), nullable=False),
        StructField("promoted_at", TimestampType(), nullable=False),
        StructField("rows_promoted", LongType()),
        StructField("rows_kept", LongType()),
    ]
)

# Readings dropped as duplicates (an audit of what silver/sensor_readings left out),
# so that silver + quarantine + duplicates reconcile with bronze by Kafka coordinates.
SENSOR_DUPLICATES = StructType(
    [
        StructField("event_id", StringType(), nullable=False),
        *LINEAGE,
        StructField("ingested_at", TimestampType()),
        StructField("original_kafka_partition", IntegerType()),
        StructField("original_kafka_offset", LongType()),
    ]
)
