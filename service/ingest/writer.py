"""How an ingest query's micro-batch is written (`BatchWriter`, its ``foreachBatch``).

Kafka is read once per topic by an ingest query (`service.ingest.query`). Validation
is part of the streaming query itself (`IngestQuery.validate`): its plan is built and
analysed once at start, not per micro-batch. The ``foreachBatch`` writer caches the
validated rows, which carry the bronze columns (but the text views, recomputed
where written) and the parsed payload, and from those same rows writes
bronze, quarantines, dedups and writes silver: the independent tables at once
(`service.streaming.queries.run_together`), since most of a small Delta append is the
driver's fixed cost, not the rows.
Every table write carries Delta's ``txnAppId``/``txnVersion`` = (query app id,
batch id). If the driver dies anywhere inside a batch, the restart replays the
same offsets under the same batch id: tables that already hold that batch skip
it, the others apply it, so every record lands exactly once in every table.
Bronze receives a commit every batch, which is what lets `service.lake.checkpoints`
prove the tables and the checkpoint agree; the other tables receive one only
when the batch has rows for them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import structlog
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from service.config import Settings
from service.ingest.bronze import TEXT_VIEWS, with_text_views
from service.ingest.dedup import find_duplicates, without_duplicates
from service.ingest.offset_gaps import PartitionRead, edge_gaps, inner_gaps, to_offset_gaps
from service.ingest.query import IngestQuery
from service.ingest.recent_ids import RecentIds, utc_from_micros
from service.ingest.sensors import to_sensor_readings
from service.ingest.users import latest_user_changes
from service.ingest.users_merge import merge_users_once
from service.ingest.validation import split_valid_invalid, to_quarantine
from service.lake.checkpoints import BatchRanges
from service.lake.delta import Commit, append_once
from service.lake.live_files import LiveFiles
from service.lake.maintenance import TableMaintenance
from service.lake.schemas import BRONZE, INGESTED_AT
from service.lake.tables import (
    BRONZE_SENSORS,
    BRONZE_USERS,
    OFFSET_GAPS_TABLE,
    QUARANTINE_TABLE,
    SENSOR_DUPLICATES_TABLE,
    SENSOR_READINGS,
    USERS,
    Table,
)
from service.streaming.profile import BatchProfile
from service.streaming.queries import IngestBatches, QueryWriter, run_together

log = structlog.get_logger(__name__)


@dataclass
class BatchOutcome:
    """What one micro-batch wrote, for the summary log line and the metrics."""

    rows_in: int = 0
    quarantined: dict[str, int] = field(default_factory=dict)
    rows_written: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0
    # Offsets of the batch's range no record was read at (bronze/offset_gaps).
    offsets_without_record: int = 0


class BatchWriter(QueryWriter):
    """The ``foreachBatch`` function of an ingest query."""

    def __init__(
        self,
        query: IngestQuery,
        settings: Settings,
        on_batch: Callable[[str, BatchOutcome], None],
        fence: Callable[[], None],
        ingest: IngestBatches,
        ranges: BatchRanges,
        maintenance: TableMaintenance | None = None,
    ) -> None:
        super().__init__(query.name, fence, maintenance)
        self.query = query
        self.settings = settings
        self.on_batch = on_batch
        self._ingest = ingest
        self._ranges = ranges
        # A batch writes at most three tables at once, one of them from this thread,
        # and the silver writes nest inside one of those.
        self._workers = ThreadPoolExecutor(max_workers=3, thread_name_prefix=query.name)
        # Silver's live files and recent ids, kept by its one writer for dedup.
        self._silver = silver_files(settings)
        self._recent = RecentIds(self._silver, settings.dedup_horizon_seconds)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        app_id = self.app_id(batch_id)
        with self.writing(batch_id), self._ingest.writing():
            profile = BatchProfile(batch.sparkSession.sparkContext)
            # Stamped after validation (see `to_records`); cached without the text
            # views (`with_text_views`): every table is written from the same rows.
            stamp = F.lit(datetime.now(UTC))
            parsed = batch.drop(*TEXT_VIEWS).withColumn(INGESTED_AT.name, stamp).persist()
            try:
                with profile.phase("read_validate"):
                    summary = summarize(parsed)
                    start, end = self._ranges.of(batch_id)
                written = Written(app_id, batch_id, stamp, profile, self.fence, self._workers)
                gaps = _offset_gaps(parsed, summary, start, end, self.query, written)
                if self.query.kind == "users":
                    outcome = _write_users(parsed, summary, self.settings, written, gaps)
                else:
                    outcome = _write_sensors(
                        parsed, summary, self.settings, written, gaps, self._silver, self._recent
                    )
            finally:
                parsed.unpersist()
            self.on_batch(self.query.name, outcome)
            log.info(
                "batch_written",
                query=self.query.name,
                batch_id=batch_id,
                rows_in=outcome.rows_in,
                quarantined=sum(outcome.quarantined.values()),
                duplicates=outcome.duplicates,
                rows_out=outcome.rows_written,
                offsets_without_record=outcome.offsets_without_record,
                **profile.summary(),
            )


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


@dataclass(frozen=True)
class OffsetGaps:
    """The offsets of a batch's range no record was read at: how many, in how many ranges
    (rows of bronze/offset_gaps), and those rows."""

    offsets: int = 0
    ranges: int = 0
    rows: DataFrame | None = None


def _offset_gaps(
    parsed: DataFrame,
    summary: BatchSummary,
    start: Mapping[int, int],
    end: Mapping[int, int],
    query: IngestQuery,
    written: Written,
) -> OffsetGaps:
    """The batch's gaps (`service.ingest.offset_gaps`): none, and no Spark job, when
    every partition read one record per offset of its range."""
    edges, inner = edge_gaps(start, end, summary.partitions)
    if not edges and not inner:
        return OffsetGaps()
    inner_rows = inner_gaps(parsed, inner) if inner else None
    rows = to_offset_gaps(
        parsed.sparkSession, edges, inner_rows, query.topic, query.name, written.batch_id,
        written.stamp,
    ).persist()  # fmt: skip
    counts = rows.agg(F.sum("offsets").alias("offsets"), F.count(F.lit(1)).alias("ranges"))
    total = counts.collect()[0]
    return OffsetGaps(int(total["offsets"] or 0), int(total["ranges"]), rows)


@dataclass(frozen=True)
class Written:
    """Which write this is: the txn (app id, batch id), the batch's stamp, its profile.

    ``fence`` runs before each table write (the driver lease is still ours).
    """

    app_id: str
    batch_id: int
    stamp: Column
    profile: BatchProfile
    fence: Callable[[], None]
    workers: ThreadPoolExecutor

    def together(self, writes: Sequence[Callable[[], object]]) -> None:
        """Run independent ``writes`` of this batch at once (`run_together`)."""
        run_together(SparkSession.active(), self.workers, writes)

    def append(self, rows: DataFrame, table: Table, settings: Settings) -> Commit | None:
        """Append ``rows`` to ``table`` exactly once for this batch (a profile phase)."""
        with self.profile.phase(table.name):
            self.fence()
            files = _per_commit_files(rows, settings)
            uri = table.uri(settings.storage_uri)
            committing = self.profile.phase(f"{table.name}:commit")
            return append_once(files, uri, self.app_id, self.batch_id, committing=committing)


def _write_users(
    parsed: DataFrame,
    summary: BatchSummary,
    settings: Settings,
    written: Written,
    gaps: OffsetGaps,
) -> BatchOutcome:
    valid, invalid = split_valid_invalid(parsed)

    def merge_users() -> None:
        with written.profile.phase(USERS.name):
            written.fence()
            merge_users_once(
                latest_user_changes(valid),
                USERS.uri(settings.storage_uri),
                written.app_id,
                written.batch_id,
            )

    writes = _bronze_and_quarantine(parsed, invalid, summary, BRONZE_USERS, settings, written, gaps)
    if summary.valid:
        writes.append(merge_users)
    written.together(writes)
    return BatchOutcome(
        rows_in=summary.rows_in,
        quarantined=summary.quarantined,
        rows_written={
            BRONZE_USERS.name: summary.rows_in,
            QUARANTINE_TABLE.name: sum(summary.quarantined.values()),
            USERS.name: summary.valid,
            OFFSET_GAPS_TABLE.name: gaps.ranges,
        },
        offsets_without_record=gaps.offsets,
    )


def _write_sensors(
    parsed: DataFrame,
    summary: BatchSummary,
    settings: Settings,
    written: Written,
    gaps: OffsetGaps,
    silver: LiveFiles,
    recent: RecentIds,
) -> BatchOutcome:
    valid, invalid = split_valid_invalid(parsed)
    duplicate_rows = 0

    def dedup_and_write_silver() -> None:
        nonlocal duplicate_rows
        readings = to_sensor_readings(valid)
        spark = valid.sparkSession
        duplicates: DataFrame | None = None
        try:
            with written.profile.phase("recent_ids"):
                unseen = recent.none_seen(
                    spark, readings, summary.valid, summary.first_arrival, summary.last_arrival
                )
            if not unseen:
                with written.profile.phase("dedup"):
                    # Cached: the silver lookup runs once, for the count, the write and the filter.
                    silver_rows = recent_readings(spark, silver, summary, settings)
                    horizon = settings.dedup_horizon_seconds
                    duplicates = find_duplicates(readings, silver_rows, horizon, summary.valid)
                    duplicate_rows = duplicates.persist().count()
            writes = []
            fresh = readings
            if duplicates is not None and duplicate_rows:
                found = duplicates
                writes.append(lambda: written.append(found, SENSOR_DUPLICATES_TABLE, settings))
                fresh = without_duplicates(readings, found)
            if summary.valid > duplicate_rows:
                writes.append(lambda: committed(written.append(fresh, SENSOR_READINGS, settings)))
            written.together(writes)
        finally:
            if duplicates is not None:
                duplicates.unpersist()

    def committed(commit: Commit | None) -> None:
        silver.committed(commit)
        recent.committed(commit)

    writes = _bronze_and_quarantine(
        parsed, invalid, summary, BRONZE_SENSORS, settings, written, gaps
    )
    if summary.valid:
        writes.append(dedup_and_write_silver)
    written.together(writes)
    return BatchOutcome(
        rows_in=summary.rows_in,
        quarantined=summary.quarantined,
        duplicates=duplicate_rows,
        rows_written={
            BRONZE_SENSORS.name: summary.rows_in,
            QUARANTINE_TABLE.name: sum(summary.quarantined.values()),
            SENSOR_READINGS.name: summary.valid - duplicate_rows,
            SENSOR_DUPLICATES_TABLE.name: duplicate_rows,
            OFFSET_GAPS_TABLE.name: gaps.ranges,
        },
        offsets_without_record=gaps.offsets,
    )


def _bronze_and_quarantine(
    parsed: DataFrame,
    invalid: DataFrame,
    summary: BatchSummary,
    bronze_table: Table,
    settings: Settings,
    written: Written,
    gaps: OffsetGaps,
) -> list[Callable[[], object]]:
    """The writes of bronze (every batch), then its offset gaps (when the batch has some),
    and quarantine (when rows were rejected).

    Bronze is the query's anchor table: it commits every batch, so its txn version
    proves which batches the tables hold (`service.lake.checkpoints`). The other tables
    commit only when they receive rows: an empty commit would cost a Delta
    transaction and prove nothing more. The gaps commit after bronze's: a replay of a
    compacted topic may read fewer records than the run that wrote bronze, and its
    larger gaps then only also cover offsets bronze holds.
    """
    bronze = with_text_views(parsed).select(*BRONZE.fieldNames())

    def write_bronze() -> None:
        written.append(bronze, bronze_table, settings)
        if gaps.rows is not None:
            try:
                written.append(gaps.rows, OFFSET_GAPS_TABLE, settings)
            finally:
                gaps.rows.unpersist()

    writes: list[Callable[[], object]] = [write_bronze]
    if summary.quarantined:
        quarantine = to_quarantine(with_text_views(invalid), written.stamp)
        writes.append(lambda: written.append(quarantine, QUARANTINE_TABLE, settings))
    return writes


def _per_commit_files(rows: DataFrame, settings: Settings) -> DataFrame:
    """``rows`` in at most ``spark_shuffle_partitions`` partitions: files per commit.

    A batch's rows keep the partitioning of its Kafka read (split into more tasks
    than cores when large); merging partitions (no shuffle) bounds the files one
    commit adds to a table (and a streaming reader's files per version) by the
    shuffle partitions, as when every silver write followed a shuffle.
    """
    return rows.coalesce(settings.spark_shuffle_partitions)


def silver_files(settings: Settings) -> LiveFiles:
    """silver/sensor_readings' live files, bounded by arrival time (`recent_readings`)."""
    return LiveFiles(SENSOR_READINGS.uri(settings.storage_uri), "kafka_timestamp")


def recent_readings(
    spark: SparkSession, silver: LiveFiles, summary: BatchSummary, settings: Settings
) -> DataFrame:
    """silver/sensor_readings pruned to the arrivals that can be originals of this batch."""
    if summary.first_arrival is None or summary.last_arrival is None:
        return spark.read.format("delta").load(silver.uri).limit(0)
    earliest = summary.first_arrival - timedelta(seconds=settings.dedup_horizon_seconds)
    return silver.read(spark, earliest, summary.last_arrival)
