"""The table catalogue: every Delta table of the lake, its schema, partitioning and properties.

Sinks, start-up checks, ``status`` and the tests read table names and shapes
from here and nowhere else. An ingest table's schema is declared
(`service.lake.schemas`); a gold table takes the shape of its query's output, so its
schema is None and its first append creates it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from pyspark.sql.types import StructType

from service.contracts.loading import Contracts, load_contracts
from service.contracts.model import Contract
from service.lake.schemas import (
    BRONZE,
    OFFSET_GAPS,
    PROMOTIONS,
    QUARANTINE,
    QUARANTINE_REPLAYS,
    SKIPPED_OFFSETS,
    duplicates_schema,
    silver_schema,
)

STATS_COLUMNS = "delta.dataSkippingStatsColumns"
CHECKPOINT_INTERVAL = "delta.checkpointInterval"
# Delta writes a checkpoint inside the commit whose version is a multiple of
# `CHECKPOINT_INTERVAL`, and the batch making that commit waits for it. The service's
# tables set it beyond any version (Delta accepts a positive 32-bit integer): the driver
# writes their checkpoints after the batches instead (`service.lake.log_checkpoints`),
# every ``INGEST_DELTA_CHECKPOINT_COMMITS`` + `Table.checkpoint_stagger` commits.
IN_COMMIT_CHECKPOINTS_OFF = str(2**31 - 1)
# Tables one batch writes together reach the same versions together: distinct cadences
# spread their checkpoints over batches.
_BRONZE_STAGGER, _SILVER_STAGGER, _QUARANTINE_STAGGER, _DUPLICATES_STAGGER, _GAPS_STAGGER = range(5)


def _properties(*stats_on: str) -> Mapping[str, str]:
    """The Delta properties a table is created with (`migrate` sets them on an existing one).

    ``stats_on``: Delta file statistics (min/max/nulls) on these columns only, the ones
    reads prune on. By default Delta computes them on a table's first 32 columns for
    every row it writes, raw payloads and their text included: about a tenth of a large
    append's CPU, for bounds no read can use. In-commit checkpoints are off (see above).
    """
    properties = {CHECKPOINT_INTERVAL: IN_COMMIT_CHECKPOINTS_OFF}
    if stats_on:
        properties[STATS_COLUMNS] = ",".join(stats_on)
    return MappingProxyType(properties)


# Kafka coordinates and arrival: what replays, reconciliation and dedup select on.
_ARRIVAL = ("kafka_partition", "kafka_offset", "kafka_timestamp")


@dataclass(frozen=True)
class Table:
    """One Delta table: ``name`` is its path under the storage root (``layer/table``)."""

    name: str
    schema: StructType | None = None
    partition_by: tuple[str, ...] = ()
    properties: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({}), hash=False, compare=False
    )
    # Commits added to INGEST_DELTA_CHECKPOINT_COMMITS between two of its Delta
    # checkpoints, which the driver writes (`service.lake.log_checkpoints`).
    checkpoint_stagger: int = 0
    # A table a release added to a query that already ran: created at start when it is
    # missing, even beside a checkpoint with committed batches (none of which wrote it).
    added_later: bool = False

    def uri(self, storage_uri: str) -> str:
        """The table's location under ``storage_uri``."""
        return f"{storage_uri}/{self.name}"

    def layout_differences(self, actual: StructType) -> list[str]:
        """How an existing table's columns differ from the declared ones (types, not order).

        Empty when they agree, or when the table has no declared schema.
        """
        if self.schema is None:
            return []
        found = {f.name: f.dataType.simpleString() for f in actual.fields}
        differences = []
        for column in self.schema.fields:
            expected = column.dataType.simpleString()
            if column.name not in found:
                differences.append(f"{column.name} missing, expected {expected}")
            elif found[column.name] != expected:
                differences.append(f"{column.name} {found.pop(column.name)}, expected {expected}")
            else:
                found.pop(column.name)
        differences += [f"{name} {kind} not declared" for name, kind in found.items()]
        return differences


class QuerySpec(Protocol):
    """A streaming query as the lake sees it: its name and the tables it writes.

    The first table is the query's anchor: it receives a commit every batch.
    """

    @property
    def name(self) -> str: ...
    @property
    def tables(self) -> tuple[Table, ...]: ...


QUARANTINE_TABLE = Table(
    "silver/quarantine",
    QUARANTINE,
    properties=_properties("kafka_topic", *_ARRIVAL, "error_code", "quarantined_at"),
    checkpoint_stagger=_QUARANTINE_STAGGER,
)
QUARANTINE_REPLAYS_TABLE = Table("silver/quarantine_replays", QUARANTINE_REPLAYS)
SKIPPED_OFFSETS_TABLE = Table("bronze/skipped_offsets", SKIPPED_OFFSETS)
PROMOTIONS_TABLE = Table("silver/promotions", PROMOTIONS, added_later=True)
OFFSET_GAPS_TABLE = Table(
    "bronze/offset_gaps",
    OFFSET_GAPS,
    properties=_properties(),
    checkpoint_stagger=_GAPS_STAGGER,
    added_later=True,
)

# Gold tables are created by their query's first append, which sets their properties.
# The two that get a row per reading or per join pair keep statistics on what their
# readers select on; the others are one row per window or alert. The five queries
# trigger together: each table has its own checkpoint cadence.
SENSOR_STATS_1M = Table("gold/sensor_stats_1m", properties=_properties(), checkpoint_stagger=0)
HEART_RATE_5M = Table("gold/heart_rate_5m", properties=_properties(), checkpoint_stagger=1)
READINGS_ENRICHED = Table(
    "gold/readings_enriched",
    properties=_properties("user_id", "event_time", *_ARRIVAL, "ingested_at"),
    checkpoint_stagger=2,
)
HEART_RATE_ACTIVITY = Table(
    "gold/heart_rate_activity",
    properties=_properties("user_id", "hr_event_time", "acc_event_time"),
    checkpoint_stagger=3,
)
ALERTS = Table("gold/alerts", properties=_properties(), checkpoint_stagger=4)
GOLD_TABLES = (SENSOR_STATS_1M, HEART_RATE_5M, READINGS_ENRICHED, HEART_RATE_ACTIVITY, ALERTS)

# Written on an operator's word (`replay-quarantine`, `promote`; the driver's start with
# INGEST_KAFKA_SKIP_LOST_OFFSETS), not by a streaming query, so no query maintains
# them: each adds a few small commits.
OPERATOR_TABLES = (QUARANTINE_REPLAYS_TABLE, SKIPPED_OFFSETS_TABLE, PROMOTIONS_TABLE)


# The silver table's properties that record the contract which last wrote it
# (`service.lake.evolution`; `status` shows them).
FINGERPRINT_PROPERTY = "lakehouse.contract.fingerprint"
VERSION_PROPERTY = "lakehouse.contract.version"
DOCUMENT_PROPERTY = "lakehouse.contract.document"


@dataclass(frozen=True)
class ContractTables:
    """The tables of one contract's topic: bronze (its anchor), silver, and where silver is
    appended (not keyed) its duplicates."""

    bronze: Table
    silver: Table
    duplicates: Table | None

    @property
    def written(self) -> tuple[Table, ...]:
        """What the contract's ingest query writes, its anchor first (`QuerySpec`)."""
        own = (self.bronze, QUARANTINE_TABLE, self.silver)
        return (*own, *((self.duplicates,) if self.duplicates else ()), OFFSET_GAPS_TABLE)


def contract_tables(contract: Contract) -> ContractTables:
    """The tables of ``contract`` (names from its extension block, schemas from its fields)."""
    stats = contract.stats_columns
    silver = Table(
        contract.tables.silver,
        silver_schema(contract),
        (contract.partition[0],) if contract.partition else (),
        _properties(*((*stats, *_ARRIVAL, "ingested_at") if stats else ())),
        checkpoint_stagger=_SILVER_STAGGER,
    )
    duplicates = (
        Table(
            contract.tables.duplicates,
            duplicates_schema(contract),
            properties=_properties(),
            checkpoint_stagger=_DUPLICATES_STAGGER,
        )
        if contract.tables.duplicates
        else None
    )
    return ContractTables(
        Table(
            contract.tables.bronze,
            BRONZE,
            properties=_properties(*_ARRIVAL, "ingested_at"),
            checkpoint_stagger=_BRONZE_STAGGER,
        ),
        silver,
        duplicates,
    )


@dataclass(frozen=True)
class Catalogue:
    """Every table of a lake: each contract's, the shared ones, gold's."""

    contracts: Contracts

    def of(self, name: str) -> ContractTables:
        """The tables of the contract named ``name``."""
        return contract_tables(self.contracts[name])

    @property
    def tables(self) -> tuple[Table, ...]:
        """Every table, bronze first (a stable order: contracts, shared, gold)."""
        per = [contract_tables(c) for c in self.contracts]
        return (
            *(t.bronze for t in per),
            QUARANTINE_TABLE,
            *(t.silver for t in per),
            *(t.duplicates for t in per if t.duplicates),
            QUARANTINE_REPLAYS_TABLE,
            SKIPPED_OFFSETS_TABLE,
            OFFSET_GAPS_TABLE,
            PROMOTIONS_TABLE,
            *GOLD_TABLES,
        )

    def by_name(self) -> dict[str, Table]:
        """Every table by its name."""
        return {t.name: t for t in self.tables}


# The shipped contracts' tables (users and sensors), the tables gold reads and the tests
# name; at run time, `Catalogue` of the deployment's contracts is the source of truth.
SHIPPED = Catalogue(load_contracts(None, {}))
_USERS, _SENSORS = SHIPPED.of("users"), SHIPPED.of("sensors")
assert _SENSORS.duplicates is not None
BRONZE_USERS, USERS = _USERS.bronze, _USERS.silver
BRONZE_SENSORS, SENSOR_READINGS = _SENSORS.bronze, _SENSORS.silver
SENSOR_DUPLICATES_TABLE: Table = _SENSORS.duplicates


def catalogue_of(contracts: Contracts) -> Catalogue:
    """The catalogue of a deployment's contracts (``settings.contracts``)."""
    return Catalogue(contracts)
