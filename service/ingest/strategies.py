"""The silver writes of a batch, one strategy per write mode: the same for an ingest query's
micro-batch and for ``replay-quarantine``.

- `EventsSilver`: dedup (the search of silver's horizon; in the driver, first the ids
  silver received lately, `RecentIds`), then the duplicates and the fresh events
  appended, each only when there are some;
- `EntitiesSilver`: the newest change per entity, MERGEd.

Every write goes through a `Writes`: the transaction (app id, version) it commits
under, the lease fence before it, the phases of the batch's profile, and whether
independent writes run at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from service.config import Settings
from service.contracts.model import Contract
from service.ingest.dedup import find_duplicates, without_duplicates
from service.ingest.entities_merge import merge_entities_once
from service.ingest.modes import Entities, Events
from service.ingest.offset_gaps import PartitionRead
from service.ingest.recent_ids import RecentIds, Sighting, utc_from_micros
from service.lake.delta import Commit
from service.lake.live_files import LiveFiles, Window
from service.lake.schemas import duplicates_schema
from service.lake.tables import Table, contract_tables


@dataclass(frozen=True)
class BatchSummary:
    """Counts, arrival-time bounds (UTC) and offsets read per partition of a parsed batch,
    from one aggregation job."""

    rows_in: int
    quarantined: dict[str, int]
    first_arrival: datetime | None
    last_arrival: datetime | None
    partitions: dict[int, PartitionRead] = field(default_factory=dict)

    @property
    def valid(self) -> int:
        """Rows that passed validation."""
        return self.rows_in - sum(self.quarantined.values())


def summarize(parsed: DataFrame) -> BatchSummary:
    """Rows in, rejected rows per error code, the arrival bounds and the offsets read per
    partition, in one pass (it caches)."""
    groups = (
        parsed.groupBy("kafka_partition", "error_code")
        .agg(
            F.count(F.lit(1)).alias("rows"),
            F.unix_micros(F.min("kafka_timestamp")).alias("first"),
            F.unix_micros(F.max("kafka_timestamp")).alias("last"),
            F.min("kafka_offset").alias("first_offset"),
            F.max("kafka_offset").alias("last_offset"),
        )
        .collect()
    )
    firsts = [g["first"] for g in groups if g["first"] is not None]
    lasts = [g["last"] for g in groups if g["last"] is not None]
    quarantined: dict[str, int] = {}
    partitions: dict[int, PartitionRead] = {}
    for g in groups:
        if g["error_code"]:
            quarantined[g["error_code"]] = quarantined.get(g["error_code"], 0) + int(g["rows"])
        seen = partitions.get(g["kafka_partition"])
        partitions[g["kafka_partition"]] = PartitionRead(
            rows=int(g["rows"]) + (seen.rows if seen else 0),
            first=min(g["first_offset"], seen.first) if seen else g["first_offset"],
            last=max(g["last_offset"], seen.last) if seen else g["last_offset"],
        )
    return BatchSummary(
        rows_in=sum(int(g["rows"]) for g in groups),
        quarantined=quarantined,
        first_arrival=utc_from_micros(min(firsts)) if firsts else None,
        last_arrival=utc_from_micros(max(lasts)) if lasts else None,
        partitions=partitions,
    )


class Writes(Protocol):
    """How a batch writes its tables (`service.ingest.writer.Written` in the driver)."""

    @property
    def app_id(self) -> str: ...
    @property
    def version(self) -> int: ...
    def append(self, rows: DataFrame, table: Table) -> Commit | None: ...
    def together(self, writes: Sequence[Callable[[], object]]) -> None: ...
    def phase(self, name: str) -> AbstractContextManager[None]: ...
    def fence(self) -> None: ...


@dataclass
class SilverOutcome:
    """What the silver writes of a batch did: rows per table, and the duplicates found
    (cached: the caller unpersists them)."""

    rows: dict[str, int] = field(default_factory=dict)
    duplicates: DataFrame | None = None
    duplicate_rows: int = 0


class EventsSilver:
    """An events contract's silver writes. ``live``: the driver's own writer, which keeps
    silver's live files and recent ids (`RecentIds`) between its batches."""

    def __init__(self, contract: Contract, settings: Settings, live: bool) -> None:
        self.mode = Events(contract)
        tables = contract_tables(contract)
        assert tables.duplicates is not None and contract.id_field is not None
        self.silver, self.duplicates = tables.silver, tables.duplicates
        self._id = contract.id_field
        self._schema = duplicates_schema(contract)
        self._horizon = (
            contract.dedup_horizon_seconds
            if contract.dedup_horizon_seconds is not None
            else settings.dedup_horizon_seconds
        )
        self.files = LiveFiles(self.silver.uri(settings.storage_uri), "kafka_timestamp")
        self._recent = RecentIds(self.files, self._horizon, self._id) if live else None

    @property
    def tables(self) -> tuple[Table, ...]:
        """The tables it writes."""
        return (self.silver, self.duplicates)

    def write(
        self, valid: DataFrame, summary: BatchSummary, writes: Writes, dry_run: bool = False
    ) -> SilverOutcome:
        """Dedup ``valid`` against silver and the batch; append the duplicates and the fresh
        events (with ``dry_run``, only find the duplicates)."""
        events = self.mode.to_silver(valid)
        spark = valid.sparkSession
        outcome = SilverOutcome()
        sighting = Sighting(clear=False)
        if self._recent is not None:
            with writes.phase("recent_ids"):
                sighting = self._recent.sighting(
                    spark, events, summary.valid, summary.first_arrival, summary.last_arrival
                )
        if not sighting.clear:
            with writes.phase("dedup"):
                recent = self.recent_events(spark, summary, sighting.windows)
                found = find_duplicates(
                    events, recent, self._horizon, summary.valid, self._id, self._schema
                )
                if found is not None:
                    # Cached: the search runs once, for the count, the write and the filter.
                    outcome.duplicates = found.persist()
                    outcome.duplicate_rows = found.count()
        found, fresh = outcome.duplicates, events
        pending: list[Callable[[], object]] = []
        if found is not None and outcome.duplicate_rows:
            pending.append(lambda: writes.append(found, self.duplicates))
            fresh = without_duplicates(events, found)
        if summary.valid > outcome.duplicate_rows:
            pending.append(lambda: self._committed(writes.append(fresh, self.silver)))
        if not dry_run:
            writes.together(pending)
        outcome.rows = {
            self.silver.name: summary.valid - outcome.duplicate_rows,
            self.duplicates.name: outcome.duplicate_rows,
        }
        return outcome

    def _committed(self, commit: Commit | None) -> None:
        self.files.committed(commit)
        if self._recent is not None:
            self._recent.committed(commit)

    def recent_events(
        self,
        spark: SparkSession,
        summary: BatchSummary,
        windows: Sequence[Window] | None = None,
    ) -> DataFrame:
        """Silver pruned to the arrivals that can be originals of this batch, read from the
        files that meet ``windows`` (`Sighting.windows`) when given."""
        if summary.first_arrival is None or summary.last_arrival is None:
            return spark.read.format("delta").load(self.files.uri).limit(0)
        earliest = summary.first_arrival - timedelta(seconds=self._horizon)
        return self.files.read(spark, earliest, summary.last_arrival, windows)


class EntitiesSilver:
    """An entities contract's silver writes: the newest change per entity, MERGEd."""

    def __init__(self, contract: Contract, settings: Settings) -> None:
        self.mode = Entities(contract)
        self.silver = contract_tables(contract).silver
        self._uri = self.silver.uri(settings.storage_uri)

    @property
    def tables(self) -> tuple[Table, ...]:
        """The table it writes."""
        return (self.silver,)

    def write(
        self, valid: DataFrame, summary: BatchSummary, writes: Writes, dry_run: bool = False
    ) -> SilverOutcome:
        """MERGE the batch's newest change per entity (nothing with ``dry_run``)."""
        if summary.valid and not dry_run:
            with writes.phase(self.silver.name):
                writes.fence()
                merge_entities_once(
                    self.mode.latest_changes(valid),
                    self._uri,
                    writes.app_id,
                    writes.version,
                    self.mode.merge_clauses(),
                )
        return SilverOutcome({self.silver.name: summary.valid})


SilverWriter = EventsSilver | EntitiesSilver


def silver_writer(contract: Contract, settings: Settings, live: bool) -> SilverWriter:
    """The silver writes of ``contract``'s write mode."""
    if contract.mode == "events":
        return EventsSilver(contract, settings, live)
    return EntitiesSilver(contract, settings)
