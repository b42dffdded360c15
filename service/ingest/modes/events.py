"""The ``events`` write mode: every valid record is a row of silver, appended once; a repeat
of an id within the dedup horizon lands in the duplicates table instead
(`service.ingest.modes.dedup`). Silver adds the contract's derived columns and, with
``partition_by``, the UTC day of its event time.

`Events` is the mode's pure transforms (what a record is, its silver rows, what names a
silver row); `EventsSilver` its silver writes, the same for the driver and
``replay-quarantine``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from service.config import Settings
from service.contracts.model import Contract
from service.ingest.batch import BatchSummary, SilverOutcome, Writes
from service.ingest.modes.dedup import find_duplicates, valid_hash, without_duplicates
from service.ingest.modes.recent_ids import SMALL_BATCH, RecentIds, Sighting
from service.ingest.rules import FastValues, schema_id, typed_record
from service.ingest.validation import Violation, rescued_fields
from service.lake.delta import Commit
from service.lake.live_files import LiveFiles, Window
from service.lake.merge import PlannedMerge
from service.lake.schemas import COORDINATES, INGESTED_AT, RESCUED, duplicates_schema, silver_schema
from service.lake.tables import Table, contract_tables

_MICROS_PER_DAY = 86_400_000_000


@dataclass(frozen=True)
class Events:
    """A contract whose records are events, appended to silver."""

    contract: Contract

    @property
    def identity(self) -> tuple[str, ...]:
        """The columns naming a silver row: its event's Kafka coordinates."""
        return COORDINATES

    def tombstone(self) -> Column:
        """Never: a null value is an ``empty_payload``."""
        return F.lit(False)

    def key_violations(self) -> list[Violation]:
        """None: an event's key is not checked."""
        return []

    def record(self, fast: FastValues | None = None) -> Column:
        """The typed payload, the schema id of a framed contract and ``_rescued``; with
        ``fast``, the record of a row of the typed fast path (its values; no unknown
        field)."""
        rescued = (
            F.lit(None).cast("string")
            if fast is not None
            else rescued_fields(F.col("_json"), self.contract.top_level)
        )
        return F.struct(
            *typed_record(self.contract, fast).values(),
            *schema_id(self.contract),
            rescued.alias(RESCUED.name),
        )

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

    def valid_id_hash(self) -> Column:
        """Over a validated row: the `valid_hash` of its event id."""
        assert self.contract.id_field is not None
        return valid_hash(self.contract, self.contract.id_field)

    def silver_writes(self, settings: Settings, keep_recent_ids: bool) -> EventsSilver:
        """Its silver writes (``keep_recent_ids``: see `EventsSilver`)."""
        return EventsSilver(self, settings, keep_recent_ids)


class EventsSilver:
    """An events contract's silver writes: dedup (the search of silver's horizon; in the
    driver, first the ids silver received lately, `RecentIds`), then the duplicates and the
    fresh events appended, each only when there are some. ``keep_recent_ids``: a
    long-running driver's writer, which keeps silver's recent ids between its batches (not
    `run --available-now`'s: its batches are large but for the last, whose load of the ids
    costs more than its search, 1.7-2.0 s against 1.1-1.2 s for 3 readings after a million).
    """

    def __init__(self, mode: Events, settings: Settings, keep_recent_ids: bool) -> None:
        contract = mode.contract
        self.mode = mode
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
        self._recent = RecentIds(self.files, self._horizon, self._id) if keep_recent_ids else None

    @property
    def tables(self) -> tuple[Table, ...]:
        """The tables it writes."""
        return (self.silver, self.duplicates)

    # An events batch's writes start from its summary (dedup's search needs its ids and
    # arrivals): a writer does not `plan` them ahead.
    plans_ahead = False

    @property
    def batch_ids(self) -> Column | None:
        """`Events.valid_id_hash`, which the recent ids take a small batch's ids by (from its
        summary, `summarize`); None without recent ids."""
        return None if self._recent is None else self.mode.valid_id_hash()

    def plan(self, valid: DataFrame, app_id: str, version: int) -> None:
        """Nothing (`plans_ahead`)."""

    def write(
        self,
        valid: DataFrame,
        summary: BatchSummary,
        writes: Writes,
        dry_run: bool = False,
        planned: PlannedMerge | None = None,
    ) -> SilverOutcome:
        """Dedup ``valid`` against silver and the batch; append the duplicates and the fresh
        events (with ``dry_run``, only find the duplicates). ``planned`` is always None: an
        events batch plans nothing ahead (`plan`)."""
        events = self.mode.to_silver(valid)
        spark = valid.sparkSession
        outcome = SilverOutcome()
        sighting = Sighting(clear=False)
        # The duplicates' Kafka coordinates, when collected (a batch of few readings).
        coordinates: list[tuple[int, int]] | None = None
        if self._recent is not None:
            with writes.phase("recent_ids"):
                sighting = self._recent.sighting(
                    spark, summary.ids, summary.first_arrival, summary.last_arrival
                )
        if not sighting.clear:
            with writes.phase("dedup"):
                recent = self.recent_events(spark, summary, sighting.windows)
                found = find_duplicates(
                    events,
                    recent,
                    self._horizon,
                    summary.valid,
                    self._id,
                    self._schema,
                    sighting.candidates,
                )
                if found is not None:
                    # Cached: the search runs once, for the count, the write and the filter.
                    outcome.duplicates = found.persist()
                    # A small batch's are collected where they are counted: silver's
                    # rows are then filtered without a broadcast of them.
                    if summary.valid <= SMALL_BATCH:
                        coordinates = [
                            (r.kafka_partition, r.kafka_offset)
                            for r in found.select(*COORDINATES).collect()
                        ]
                        outcome.duplicate_rows = len(coordinates)
                    else:
                        outcome.duplicate_rows = found.count()
        found, fresh = outcome.duplicates, events
        pending: list[Callable[[], object]] = []
        if found is not None and outcome.duplicate_rows:
            pending.append(lambda: writes.append(found, self.duplicates))
            fresh = without_duplicates(events, found, coordinates)
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
