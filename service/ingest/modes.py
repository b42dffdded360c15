"""The two write modes of a contract, as pure transforms: what a record is, how it is checked,
and the rows its silver table receives.

- ``events`` (`Events`): every valid record is a row of silver, appended; a repeat of an
  id within the dedup horizon is a duplicate (`service.ingest.dedup`). Silver adds the
  contract's derived columns and, with ``partition_by``, the UTC day of its event time.
- ``entities`` (`Entities`): a record changes the entity its key names; the newest change
  by the contract's ``order_by`` wins (`latest_changes`, then the MERGE of
  `service.ingest.entities_merge`). A record with a key and a null value is a tombstone: the
  entity is marked deleted.

`parse_records` is the one validation of a topic's records, the same for the driver and
for ``replay-quarantine``; `mode_of` is the one place a contract's mode is looked at.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from service.contracts.model import Contract
from service.ingest.entities_merge import merge_clauses
from service.ingest.rules import (
    contract_violations,
    json_fields,
    member_fields,
    typed_record,
    with_member_checks,
    with_other_members,
)
from service.ingest.validation import (
    SCHEMA_ID_COLUMN,
    Violation,
    payload_violations,
    rescued_fields,
    shown,
    stage_fields,
    with_error,
    with_parsed_payload,
)
from service.lake.schemas import INGESTED_AT, LINEAGE, RESCUED, silver_schema

_LINEAGE = tuple(c.name for c in LINEAGE)
_MICROS_PER_DAY = 86_400_000_000
_INTEGER_KEY = r"^-?[0-9]+\z"


@dataclass(frozen=True)
class Events:
    """A contract whose records are events, appended to silver."""

    contract: Contract

    def tombstone(self) -> Column:
        """Never: a null value is an ``empty_payload``."""
        return F.lit(False)

    def key_violations(self) -> list[Violation]:
        """None: an event's key is not checked."""
        return []

    def record(self) -> Column:
        """The typed payload, the schema id of a framed contract and ``_rescued``."""
        return F.struct(
            *typed_record(self.contract).values(), *_schema_id(self.contract), self._rescued()
        )

    def _rescued(self) -> Column:
        return rescued_fields(F.col("_json"), self.contract.top_level).alias(RESCUED.name)

    def to_silver(self, valid: DataFrame) -> DataFrame:
        """Valid records in the silver schema: typed, derived columns, lineage, partition
        (the UTC day of the event time, whatever the session time zone)."""
        lineage = [c for c in valid.columns if c.startswith("kafka_")]
        flat = valid.select("record.*", *lineage, INGESTED_AT.name)
        derived = {d.column: F.expr(d.sql).cast(d.data_type) for d in self.contract.derived}
        if self.contract.partition is not None:
            column, day_of = self.contract.partition
            day = F.floor(F.unix_micros(day_of) / _MICROS_PER_DAY).cast("int")
            derived[column] = F.date_from_unix_date(day)
        schema = silver_schema(self.contract)
        return flat.withColumns(derived).select(
            [F.col(f.name).cast(f.dataType).alias(f.name) for f in schema.fields]
        )


@dataclass(frozen=True)
class Entities:
    """A contract whose records change entities, upserted into silver by key."""

    contract: Contract

    @property
    def key(self) -> str:
        """The key field: the entity a record changes (a tombstone's Kafka key)."""
        assert self.contract.key is not None
        return self.contract.key

    def tombstone(self) -> Column:
        """A record with a key and a null value."""
        return F.col("key").isNotNull() & F.col("value").isNull()

    def _key_is_integer(self) -> bool:
        return "integer" in self.contract.field(self.key).types

    def key_violations(self) -> list[Violation]:
        """A tombstone's key must name an entity: its key field's type (an integer within
        1..2^63-1 for an integer key; non-empty text for a string one)."""
        key, tombstone = F.col("key_text"), self.tombstone()
        what = self.key.replace("_", " ")
        if not self._key_is_integer():
            return [
                Violation(
                    "type_mismatch",
                    tombstone & F.coalesce(key == "", key.isNull()),
                    F.concat(
                        F.lit(f"key: tombstone key is not a {what}: "),
                        F.coalesce(shown(key), F.lit("(not valid UTF-8)")),
                    ),
                )
            ]
        integer_key = F.coalesce(key.rlike(_INTEGER_KEY), F.lit(False))
        number = key.try_cast("bigint")
        return [
            Violation(
                "type_mismatch",
                tombstone & ~integer_key,
                F.concat(
                    F.lit(f"key: tombstone key is not a {what}: "),
                    F.coalesce(shown(key), F.lit("(not valid UTF-8)")),
                ),
            ),
            Violation(
                "out_of_range",
                tombstone & integer_key & (number.isNull() | (number < 1)),
                F.concat(
                    F.lit(f"key: tombstone {what} "), shown(key), F.lit(" is not in 1..2^63-1")
                ),
            ),
        ]

    def record(self) -> Column:
        """``is_tombstone``, the key, the rest of the typed payload, ``change_time`` (the
        order field of an upsert, the arrival of a tombstone) and ``_rescued``."""
        tombstone = self.tombstone()
        columns = typed_record(self.contract)
        key_value = (
            F.col("key_text").try_cast("bigint")
            if self._key_is_integer()
            else F.col("key_text").cast(StringType())
        )
        assert self.contract.order_by is not None
        order = columns[self.contract.order_by]
        return F.struct(
            tombstone.alias("is_tombstone"),
            F.when(tombstone, key_value).otherwise(columns[self.key]).alias(self.key),
            *[c for name, c in columns.items() if name != self.key],
            *_schema_id(self.contract),
            F.when(tombstone, F.col("kafka_timestamp")).otherwise(order).alias("change_time"),
            rescued_fields(F.col("_json"), self.contract.top_level).alias(RESCUED.name),
        )

    def profile(self) -> tuple[str, ...]:
        """The columns an upsert sets: every payload column but the key (and the schema id of
        a framed contract)."""
        payload = tuple(c.name for c in self.contract.payload_columns() if c.name != self.key)
        return (*payload, *([SCHEMA_ID_COLUMN] if self.contract.framed else []))

    def merge_clauses(self) -> tuple[str, str, dict[str, str | Column], dict[str, str | Column]]:
        """The clauses of the MERGE of `latest_changes` into silver (`merge_clauses`)."""
        assert self.contract.order_by is not None
        return merge_clauses(self.key, self.contract.order_by, self.profile())

    def latest_changes(self, valid: DataFrame) -> DataFrame:
        """One row per key: its newest upsert and newest tombstone of the batch.

        The newest upsert is the greatest (order field, partition, offset), its columns
        null when the batch has none for the entity; ``tombstone_at`` is the latest
        tombstone's arrival time, or null. Keeping both (rather than the single newest
        change) makes the merged state independent of how records fall into batches.
        """
        assert self.contract.order_by is not None
        upsert_columns = (*self.profile(), RESCUED.name, *_LINEAGE, INGESTED_AT.name)
        flat = valid.select("record.*", *_LINEAGE, INGESTED_AT.name)
        upsert = F.max_by(
            F.when(~F.col("is_tombstone"), F.struct(*upsert_columns)),
            F.when(
                ~F.col("is_tombstone"),
                F.struct(self.contract.order_by, "kafka_partition", "kafka_offset"),
            ),
        )
        tombstone_at = F.max(F.when(F.col("is_tombstone"), F.col("change_time")))
        tombstone = F.max_by(
            F.when(F.col("is_tombstone"), F.struct(*_LINEAGE, INGESTED_AT.name)),
            F.when(
                F.col("is_tombstone"), F.struct("change_time", "kafka_partition", "kafka_offset")
            ),
        )
        return flat.groupBy(self.key).agg(
            upsert.alias("upsert"), tombstone_at.alias("tombstone_at"), tombstone.alias("tombstone")
        )


WriteMode = Events | Entities


def _schema_id(contract: Contract) -> list[Column]:
    """The record's schema id column where ``contract`` is framed (`with_unframed_payload`)."""
    return [F.col(SCHEMA_ID_COLUMN).alias(SCHEMA_ID_COLUMN)] if contract.framed else []


def mode_of(contract: Contract) -> WriteMode:
    """The write mode of ``contract``."""
    return Events(contract) if contract.mode == "events" else Entities(contract)


def parse_records(
    contract: Contract,
    bronze: DataFrame,
    max_payload_bytes: int,
    max_future_seconds: int | None,
    today: Column | None = None,
) -> DataFrame:
    """Validate bronze rows against ``contract``: add ``error_code``/``error_detail`` and
    ``record``, the typed record (complete on valid rows).

    Every input row comes out once, with the bronze columns. ``today`` (a date column,
    default ``current_date()``) bounds dates the contract bounds by "today";
    ``max_future_seconds`` (the contract's, else the setting) bounds its event time.
    """
    mode = mode_of(contract)
    skew = (
        contract.max_future_seconds
        if contract.max_future_seconds is not None
        else max_future_seconds
    )
    today = today if today is not None else F.current_date()
    staged = stage_fields(
        with_parsed_payload(bronze, max_payload_bytes, contract.framing),
        json_fields(contract).values(),
    )
    staged = with_other_members(staged, contract)
    staged = with_member_checks(staged, member_fields(contract), today)
    tombstone = mode.tombstone()
    checked = with_error(
        staged,
        [
            *payload_violations(max_payload_bytes, tombstone, contract.framing),
            *mode.key_violations(),
            *contract_violations(contract, ~tombstone, today, skew),
        ],
        [*bronze.columns, mode.record().alias("record")],
    )
    return checked.select(*bronze.columns, "error_code", "error_detail", "record")
