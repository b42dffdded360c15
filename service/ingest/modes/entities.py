"""The ``entities`` write mode: a record changes the entity its key names; the newest change
by the contract's ``order_by`` wins (`Entities.latest_changes`, then an idempotent MERGE
with `merge_clauses`). A record with a key and a null value is a tombstone: the entity is
marked deleted.

The row's state is a function of the set of changes ever seen, not of their order or of
how they fell into micro-batches: the entity's fields (and the order field, ``_rescued``,
lineage) are those of the newest upsert by (order field, partition, offset), so an older
change never overwrites a newer one; the entity is deleted (``is_deleted``, ``deleted_at``
= the newest tombstone's arrival) while no upsert is newer than that tombstone, so a newer
upsert resurrects. A tombstone for an unknown entity inserts a deleted row without fields.
The MERGE commits with ``txnAppId``/``txnVersion`` (`service.lake.merge`), so that Delta
skips a replayed micro-batch as a whole (and replaying a change is a no-op anyway).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from service.config import Settings
from service.contracts.model import Contract
from service.ingest.batch import BatchSummary, SilverOutcome, Writes
from service.ingest.modes.dedup import IN_SET, id_hash_in, valid_hash
from service.ingest.rules import FastValues, schema_id, typed_record
from service.ingest.validation import SCHEMA_ID_COLUMN, Violation, rescued_fields, shown
from service.lake.merge import MergeClauses, PlannedMerge, plan_merge
from service.lake.schemas import INGESTED_AT, LINEAGE, RESCUED
from service.lake.tables import Table, contract_tables

_INTEGER_KEY = r"^-?[0-9]+\z"
# A row's Kafka coordinates and arrival: the lineage a change carries into silver.
_LINEAGE = (*(c.name for c in LINEAGE), INGESTED_AT.name)
_BEGINNING = "TIMESTAMP'0001-01-01 00:00:00'"


@dataclass(frozen=True)
class Entities:
    """A contract whose records change entities, upserted into silver by key."""

    contract: Contract

    @property
    def identity(self) -> tuple[str, ...]:
        """The columns naming a silver row: its entity's key."""
        return (self.key,)

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

    def record(self, fast: FastValues | None = None) -> Column:
        """``is_tombstone``, the key, the rest of the typed payload, ``change_time`` (the
        order field of an upsert, the arrival of a tombstone) and ``_rescued``; with
        ``fast``, the record of a row of the typed fast path (its values; no unknown
        field)."""
        tombstone = self.tombstone()
        columns = typed_record(self.contract, fast)
        key_value = (
            F.col("key_text").try_cast("bigint")
            if self._key_is_integer()
            else F.col("key_text").cast(StringType())
        )
        assert self.contract.order_by is not None
        order = columns[self.contract.order_by]
        rescued = (
            F.lit(None).cast("string")
            if fast is not None
            else rescued_fields(F.col("_json"), self.contract.top_level)
        )
        return F.struct(
            tombstone.alias("is_tombstone"),
            F.when(tombstone, key_value).otherwise(columns[self.key]).alias(self.key),
            *[c for name, c in columns.items() if name != self.key],
            *schema_id(self.contract),
            F.when(tombstone, F.col("kafka_timestamp")).otherwise(order).alias("change_time"),
            rescued.alias(RESCUED.name),
        )

    def profile(self) -> tuple[str, ...]:
        """The columns an upsert sets: every payload column but the key (and the schema id of
        a framed contract)."""
        payload = tuple(c.name for c in self.contract.payload_columns() if c.name != self.key)
        return (*payload, *([SCHEMA_ID_COLUMN] if self.contract.framed else []))

    def merge_clauses(self) -> MergeClauses:
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
        upsert_columns = (*self.profile(), RESCUED.name, *_LINEAGE)
        flat = valid.select("record.*", *_LINEAGE)
        upsert = F.max_by(
            F.when(~F.col("is_tombstone"), F.struct(*upsert_columns)),
            F.when(
                ~F.col("is_tombstone"),
                F.struct(self.contract.order_by, "kafka_partition", "kafka_offset"),
            ),
        )
        tombstone_at = F.max(F.when(F.col("is_tombstone"), F.col("change_time")))
        tombstone = F.max_by(
            F.when(F.col("is_tombstone"), F.struct(*_LINEAGE)),
            F.when(
                F.col("is_tombstone"), F.struct("change_time", "kafka_partition", "kafka_offset")
            ),
        )
        return flat.groupBy(self.key).agg(
            upsert.alias("upsert"), tombstone_at.alias("tombstone_at"), tombstone.alias("tombstone")
        )

    def silver_writes(self, settings: Settings, keep_recent_ids: bool) -> EntitiesSilver:
        """Its silver writes (the same for the driver and a replay: no recent ids)."""
        return EntitiesSilver(self, settings)


class EntitiesSilver:
    """An entities contract's silver writes: the newest change per entity, MERGEd."""

    def __init__(self, mode: Entities, settings: Settings) -> None:
        self.mode = mode
        self.silver = contract_tables(mode.contract).silver
        self._uri = self.silver.uri(settings.storage_uri)

    @property
    def tables(self) -> tuple[Table, ...]:
        """The table it writes."""
        return (self.silver,)

    # A small batch's MERGE is planned while its summary runs (`plan`).
    plans_ahead = True

    @property
    def batch_ids(self) -> Column:
        """The `valid_hash` of the key of the entity a row changes: a small batch's summary
        collects them (`summarize`), and its MERGE rewrites only the files holding those
        keys' rows (`merge_once`'s ``touching``)."""
        return valid_hash(self.mode.contract, self.mode.key)

    def plan(self, valid: DataFrame, app_id: str, version: int) -> PlannedMerge:
        """The MERGE of a small batch's ``valid`` rows up to its first Spark job
        (`plan_merge`), for `write`: a driver plans it while the batch's summary runs."""
        return self._plan(valid, app_id, version, small=True)

    def _plan(self, valid: DataFrame, app_id: str, version: int, small: bool) -> PlannedMerge:
        changes = self.mode.latest_changes(valid)
        return plan_merge(changes, self._uri, app_id, version, self.mode.merge_clauses(), small)

    def write(
        self,
        valid: DataFrame,
        summary: BatchSummary,
        writes: Writes,
        dry_run: bool = False,
        planned: PlannedMerge | None = None,
    ) -> SilverOutcome:
        """MERGE the batch's newest change per entity (nothing with ``dry_run``), as
        ``planned`` (`plan`, of the same ``valid`` rows) when given."""
        if summary.valid and not dry_run:
            keys = None if summary.ids is None else set(summary.ids)
            touching = id_hash_in(self.mode.key, keys) if keys and len(keys) <= IN_SET else None
            with writes.phase(self.silver.name):
                writes.fence()
                if planned is None:
                    small = summary.ids is not None
                    planned = self._plan(valid, writes.app_id, writes.version, small)
                planned(touching)
        return SilverOutcome({self.silver.name: summary.valid})


def merge_clauses(key: str, order_by: str, fields: tuple[str, ...]) -> MergeClauses:
    """(join condition, update condition, update set, insert values) of the MERGE of an
    entity with ``key``, newest by ``order_by``, whose upserts set ``fields`` (pure)."""
    profile = (*fields, RESCUED.name)
    # The batch's newest upsert beats the row's: (order field, partition, offset) order.
    newer = (
        f"s.upsert IS NOT NULL AND (t.{order_by} IS NULL OR"
        f" struct(s.upsert.{order_by}, s.upsert.kafka_partition, s.upsert.kafka_offset)"
        f" > struct(t.{order_by}, t.kafka_partition, t.kafka_offset))"
    )
    ordered = f"CASE WHEN {newer} THEN s.upsert.{order_by} ELSE t.{order_by} END"
    # A deletion stands while no upsert is newer; a tombstone wins a tie with an upsert.
    deleted_at = (
        f"CASE WHEN greatest(t.deleted_at, s.tombstone_at) >= coalesce({ordered}, {_BEGINNING})"
        " THEN greatest(t.deleted_at, s.tombstone_at) END"
    )
    tombstone_newer = (
        "s.tombstone_at IS NOT NULL AND (t.deleted_at IS NULL OR s.tombstone_at > t.deleted_at)"
        f" AND (t.{order_by} IS NULL OR s.tombstone_at >= t.{order_by})"
    )
    update: dict[str, str | Column] = {
        **{c: f"CASE WHEN {newer} THEN s.upsert.{c} ELSE t.{c} END" for c in profile},
        "deleted_at": deleted_at,
        "is_deleted": f"({deleted_at}) IS NOT NULL",
        # Lineage is the upsert's that set the fields (the tombstone's while there is none).
        **{
            c: f"CASE WHEN {newer} THEN s.upsert.{c} "
            f"WHEN t.{order_by} IS NULL AND {tombstone_newer} THEN s.tombstone.{c} ELSE t.{c} END"
            for c in _LINEAGE
        },
    }
    insert_deleted_at = (
        f"CASE WHEN s.tombstone_at >= coalesce(s.upsert.{order_by}, {_BEGINNING})"
        " THEN s.tombstone_at END"
    )
    insert: dict[str, str | Column] = {
        key: f"s.{key}",
        **{c: f"s.upsert.{c}" for c in profile},
        "deleted_at": insert_deleted_at,
        "is_deleted": f"({insert_deleted_at}) IS NOT NULL",
        **{c: f"coalesce(s.upsert.{c}, s.tombstone.{c})" for c in _LINEAGE},
    }
    return f"t.{key} = s.{key}", f"({newer}) OR ({tombstone_newer})", update, insert
