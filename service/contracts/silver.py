"""A contract's silver tables: its payload's columns and those the lake adds beside them.

The lake adds to every silver row its Kafka lineage and arrival time, and ``_rescued`` (and
``_schema_id`` where a contract's values are framed by a schema registry serializer); to
an entity's row its deletion (``is_deleted``, ``deleted_at``); to an events table the
``partition_by`` column. The loader builds these schemas to refuse a contract whose own
columns would meet one of them (`service.contracts.loading`); `service.lake.schemas`
declares every other table.
"""

from __future__ import annotations

from pyspark.sql.types import (
    BooleanType,
    DateType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from service.contracts.model import Contract, Mode

# A row's Kafka coordinates and arrival time: where it came from (every silver table).
LINEAGE = (
    StructField("kafka_topic", StringType(), nullable=False),
    StructField("kafka_partition", IntegerType(), nullable=False),
    StructField("kafka_offset", LongType(), nullable=False),
    StructField("kafka_timestamp", TimestampType()),
)
# The columns that name one Kafka record: unique in every table that keeps one row per record.
COORDINATES = tuple(f.name for f in LINEAGE[:3])
INGESTED_AT = StructField("ingested_at", TimestampType(), nullable=False)
RESCUED = StructField("_rescued", StringType())
# The schema id of a record framed by a schema registry serializer (a framed contract's).
SCHEMA_ID = StructField("_schema_id", IntegerType())
# An entity's deletion: a tombstone marks it deleted at its arrival.
DELETION = (
    StructField("is_deleted", BooleanType(), nullable=False),
    StructField("deleted_at", TimestampType()),
)


def lake_columns(mode: Mode, framed: bool = True) -> tuple[StructField, ...]:
    """The columns the lake adds to a silver table of ``mode`` after the payload's (and the
    derived ones), ``_schema_id`` only where values are ``framed``: no column of a contract
    may have one of their names (``_schema_id`` in no contract, framed or not)."""
    own = (*([SCHEMA_ID] if framed else []), RESCUED, *LINEAGE, INGESTED_AT)
    return (*DELETION, *own) if mode == "entities" else own


def silver_schema(contract: Contract) -> StructType:
    """A contract's silver table: for events, the typed payload, its derived columns,
    ``_rescued``, lineage, ``ingested_at`` and the partition column; for entities, the key,
    the rest of the payload (nullable: a deleted entity may have none), ``is_deleted``,
    ``deleted_at``, ``_rescued``, the lineage of the change applied last and
    ``ingested_at``."""
    payload = contract.payload_columns()
    if contract.mode == "entities":
        key = next(c for c in payload if c.name == contract.key)
        profile = [StructField(c.name, c.dataType) for c in payload if c.name != contract.key]
        return StructType([key, *profile, *lake_columns("entities", contract.framed)])
    partition = (
        [StructField(contract.partition[0], DateType(), nullable=False)]
        if contract.partition is not None
        else []
    )
    return StructType(
        [
            *payload,
            *(StructField(d.column, d.data_type) for d in contract.derived),
            *lake_columns("events", contract.framed),
            *partition,
        ]
    )


def duplicates_schema(contract: Contract) -> StructType:
    """An events contract's duplicates table: the repeated id, the coordinates of the repeat
    and of the record it repeats (an audit that lets silver reconcile with bronze)."""
    assert contract.id_field is not None
    return StructType(
        [
            StructField(contract.id_field, StringType(), nullable=False),
            *LINEAGE,
            StructField("ingested_at", TimestampType()),
            StructField("original_kafka_partition", IntegerType()),
            StructField("original_kafka_offset", LongType()),
        ]
    )
