"""How an ingest query's micro-batch is written (`BatchWriter`, its ``foreachBatch``).

Kafka is read once per topic by an ingest query (`service.ingest.query`). The typed
fast path is part of the streaming query itself (`Validation.mark`): the rows it decides
arrive with their outcome, the others pending. The ``foreachBatch`` writer caches the
marked rows, which carry the bronze columns (but the text views, recomputed where
written) and the parsed payload, and from those same rows writes bronze, and beside it
runs the exact checks on the pending rows alone (the recipe recorded at start,
`IngestStream.exact`), then quarantines, dedups and writes silver: the independent
tables at once (`service.streaming.runner.run_together`), since most of a small Delta
append is the driver's fixed cost, not the rows.
Every table write carries Delta's ``txnAppId``/``txnVersion`` = (query app id,
batch id). If the driver dies anywhere inside a batch, the restart replays the
same offsets under the same batch id: tables that already hold that batch skip
it, the others apply it, so every record lands exactly once in every table.
Bronze receives a commit every batch, which is what lets `service.lake.checkpoints`
prove the tables and the checkpoint agree; the other tables receive one only
when the batch has rows for them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

import structlog
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from service.config import Settings
from service.ingest.batch import BatchSummary, SilverOutcome, summarize
from service.ingest.bronze import cached_views, restored_views
from service.ingest.modes import DECIDED, OUTCOME, PENDING, mode_of
from service.ingest.offset_gaps import edge_gaps, inner_gaps, to_offset_gaps
from service.ingest.query import IngestQuery, IngestStream
from service.ingest.validation import split_valid_invalid, to_quarantine
from service.lake.checkpoints import BatchRanges
from service.lake.delta import Commit, append_once
from service.lake.maintenance import TableMaintenance
from service.lake.merge import PlannedMerge
from service.lake.schemas import BRONZE, INGESTED_AT
from service.lake.tables import OFFSET_GAPS_TABLE, QUARANTINE_TABLE, Table, contract_tables
from service.streaming.profile import BatchProfile
from service.streaming.runner import IngestBatches, QueryWriter, run_together

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
    """The ``foreachBatch`` function of an ingest query (``keep_recent_ids``: an events
    contract's silver writer keeps its recent ids, `EventsSilver`)."""

    def __init__(
        self,
        query: IngestQuery,
        stream: IngestStream,
        settings: Settings,
        on_batch: Callable[[str, BatchOutcome], None],
        fence: Callable[[], None],
        ingest: IngestBatches,
        ranges: BatchRanges,
        maintenance: TableMaintenance | None = None,
        after_batch: Callable[[], None] | None = None,
        keep_recent_ids: bool = True,
    ) -> None:
        super().__init__(query.name, fence, maintenance, after_batch)
        self.query = query
        self.stream = stream
        self.settings = settings
        self.on_batch = on_batch
        self._ingest = ingest
        self._ranges = ranges
        self._bronze = contract_tables(query.contract).bronze
        # A batch writes bronze beside the rest (this thread): the quarantine (this
        # thread) beside silver, whose own writes nest inside it.
        self._workers = ThreadPoolExecutor(max_workers=3, thread_name_prefix=query.name)
        self._silver = mode_of(query.contract).silver_writes(settings, keep_recent_ids)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        app_id = self.app_id(batch_id)
        # The query's own session: adaptive execution runs each shuffle stage of a plan as
        # a Spark job of its own, most of a small batch's jobs (sensors 21-24, users 16).
        batch.sparkSession.conf.set("spark.sql.adaptive.enabled", "false")
        with self.writing(batch_id), self._ingest.writing():
            profile = BatchProfile(batch.sparkSession.sparkContext)
            # Stamped after validation (see `to_records`); cached with a flag in place of
            # each text view (`cached_views`): every table is written from the same rows.
            stamp = F.lit(datetime.now(UTC))
            start, end = self._ranges.of(batch_id)
            rows = cached_views(batch).withColumn(INGESTED_AT.name, stamp)
            marked = in_one_task_if_small(rows, start, end).persist()
            # A small batch's summary collects its valid rows' ids (hashed) for silver's
            # writes: an events contract's recent ids, an entities contract's MERGE.
            ids = self._silver.batch_ids if is_small(start, end) else None
            try:
                # The exact checks' plan for the batch's pending rows, built (py4j calls,
                # no job) while the summary's job finds whether there are any.
                exact = self._workers.submit(self._exact_checks, marked)
                # A small batch's silver writes planned meanwhile (an entities contract's
                # MERGE up to its job), for the rows the fast path decided.
                planned = (
                    self._workers.submit(self._plan_silver, marked, app_id, batch_id)
                    if ids is not None and self._silver.plans_ahead
                    else None
                )
                with profile.phase("read_validate"):
                    summary = summarize(marked, ids)
                batch_writes = BatchWrites(
                    app_id, batch_id, stamp, profile, self.fence, self._workers, self.settings
                )
                gaps = _offset_gaps(marked, summary, start, end, self.query, batch_writes)
                outcome = self._write(
                    marked, summary, batch_writes, gaps, (start, end), exact, planned
                )
            finally:
                marked.unpersist()
            self.on_batch(self.query.name, outcome)
            profiled = profile.summary()
        # Logged once the batch is no longer in flight (its tables' due maintenance ran in
        # `writing`): a graceful stop's "stopping" line, which names the batch in flight,
        # always comes before that batch's "batch_written".
        log.info(
            "batch_written",
            query=self.query.name,
            batch_id=batch_id,
            rows_in=outcome.rows_in,
            quarantined=sum(outcome.quarantined.values()),
            duplicates=outcome.duplicates,
            rows_out=outcome.rows_written,
            offsets_without_record=outcome.offsets_without_record,
            **profiled,
        )

    def _write(
        self,
        marked: DataFrame,
        summary: BatchSummary,
        batch_writes: BatchWrites,
        gaps: OffsetGaps,
        ranges: tuple[Mapping[int, int], Mapping[int, int]],
        exact: Future[DataFrame | None],
        planned: Future[PlannedMerge | None] | None,
    ) -> BatchOutcome:
        """Bronze (then its gaps) beside the rest: the exact checks of the rows the fast path
        left pending, if any, then the quarantine and silver at once (silver as ``planned``
        when no row was pending: the plan's rows are the batch's valid ones)."""
        silver = SilverOutcome()
        checked: DataFrame | None = None

        def checked_writes() -> None:
            nonlocal summary, silver, checked
            parsed = marked.drop(DECIDED)
            pending = PENDING in summary.quarantined
            plan = planned.result() if planned is not None and not pending else None
            if pending:
                with batch_writes.phase("exact_checks"):
                    parsed, checked, summary = self._check_exactly(marked, summary, exact)
                parsed = in_one_task_if_small(parsed, *ranges)
            valid, invalid = split_valid_invalid(parsed)

            def write_silver() -> None:
                nonlocal silver
                silver = self._silver.write(valid, summary, batch_writes, planned=plan)

            writes: list[Callable[[], object]] = []
            if summary.quarantined:
                quarantine = to_quarantine(restored_views(invalid), batch_writes.stamp)
                writes.append(lambda: batch_writes.append(quarantine, QUARANTINE_TABLE))
            if summary.valid:
                writes.append(write_silver)
            batch_writes.together(writes)

        write_bronze = _bronze(marked, self._bronze, batch_writes, gaps)
        try:
            batch_writes.together([checked_writes, write_bronze])
        finally:
            if silver.duplicates is not None:
                silver.duplicates.unpersist()
            if checked is not None:
                checked.unpersist()
        return BatchOutcome(
            rows_in=summary.rows_in,
            quarantined=summary.quarantined,
            duplicates=silver.duplicate_rows,
            rows_written={
                self._bronze.name: summary.rows_in,
                QUARANTINE_TABLE.name: sum(summary.quarantined.values()),
                **(silver.rows or {t.name: 0 for t in self._silver.tables}),
                OFFSET_GAPS_TABLE.name: gaps.ranges,
            },
            offsets_without_record=gaps.offsets,
        )

    def _plan_silver(self, marked: DataFrame, app_id: str, version: int) -> PlannedMerge | None:
        """The silver writes' `plan` for ``marked``'s valid rows, as if none were pending."""
        valid, _ = split_valid_invalid(marked.drop(DECIDED))
        return self._silver.plan(valid, app_id, version)

    def _exact_checks(self, marked: DataFrame) -> DataFrame | None:
        """The exact checks of ``marked``'s pending rows (not run), or None without a fast
        path (none are pending)."""
        if self.stream.exact is None:
            return None
        pending = restored_views(marked.where(~F.col(DECIDED))).drop(DECIDED, *OUTCOME)
        return cached_views(self.stream.exact.apply(pending))

    def _check_exactly(
        self, marked: DataFrame, summary: BatchSummary, exact: Future[DataFrame | None]
    ) -> tuple[DataFrame, DataFrame, BatchSummary]:
        """The batch's rows with the exact checks' outcome (``exact``) where the fast path
        left it `PENDING`; those rows (cached: the caller unpersists them); the summary
        with their rejects per code (and the ids of the valid ones when it has ids)."""
        checks = exact.result()
        assert checks is not None  # only a fast path leaves rows pending
        checked = checks.persist()
        ids = self._silver.batch_ids if summary.ids is not None else None
        counts = checked.groupBy("error_code").agg(
            F.count(F.lit(1)).alias("count"),
            *([] if ids is None else [F.collect_list(ids).alias("ids")]),
        )
        quarantined = {k: v for k, v in summary.quarantined.items() if k != PENDING}
        valid_ids: list[int] = []
        for row in counts.collect():
            if row["error_code"] is not None:
                quarantined[row["error_code"]] = int(row["count"])
            elif ids is not None:
                valid_ids = row["ids"]
        parsed = self.stream.validation.complete(marked, checked)
        completed = replace(summary, quarantined=quarantined)
        if summary.ids is not None:
            completed = replace(completed, ids=(*summary.ids, *valid_ids))
        return parsed, checked, completed


# A batch covering at most this many offsets is read, validated and written in one task
# per Spark job: every task pays Spark's fixed cost (its share of the plan deserialized,
# the code of its projections generated) whatever its rows, and a small batch's jobs
# are mostly that cost (docs/performance.md, "Small batches").
ONE_TASK_OFFSETS = 10_000


def is_small(start: Mapping[int, int], end: Mapping[int, int]) -> bool:
    """Whether a batch covering ``start``..``end`` (offsets per partition) covers at most
    `ONE_TASK_OFFSETS` offsets (not when a partition's start is unknown)."""
    known = bool(end) and all(p in start for p in end)
    return known and sum(end[p] - start[p] for p in end) <= ONE_TASK_OFFSETS


def in_one_task_if_small(
    rows: DataFrame, start: Mapping[int, int], end: Mapping[int, int]
) -> DataFrame:
    """``rows`` of a batch covering ``start``..``end`` in one partition (no shuffle) when it
    `is_small`; as read otherwise."""
    return rows.coalesce(1) if is_small(start, end) else rows


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
    batch_writes: BatchWrites,
) -> OffsetGaps:
    """The batch's gaps (`service.ingest.offset_gaps`): none, and no Spark job, when
    every partition read one record per offset of its range."""
    edges, inner = edge_gaps(start, end, summary.partitions)
    if not edges and not inner:
        return OffsetGaps()
    inner_rows = inner_gaps(parsed, inner) if inner else None
    rows = to_offset_gaps(
        parsed.sparkSession, edges, inner_rows, query.topic, query.name, batch_writes.batch_id,
        batch_writes.stamp,
    ).persist()  # fmt: skip
    counts = rows.agg(F.sum("offsets").alias("offsets"), F.count(F.lit(1)).alias("ranges"))
    total = counts.collect()[0]
    return OffsetGaps(int(total["offsets"] or 0), int(total["ranges"]), rows)


@dataclass(frozen=True)
class BatchWrites:
    """Which write this is: the txn (app id, batch id), the batch's stamp, its profile
    (a `service.ingest.batch.Writes`).

    ``fence`` runs before each table write (the driver lease is still ours).
    """

    app_id: str
    batch_id: int
    stamp: Column
    profile: BatchProfile
    fence: Callable[[], None]
    workers: ThreadPoolExecutor
    settings: Settings

    @property
    def version(self) -> int:
        """The txn version of its writes: the batch id."""
        return self.batch_id

    def together(self, writes: Sequence[Callable[[], object]]) -> None:
        """Run independent ``writes`` of this batch at once (`run_together`)."""
        run_together(SparkSession.active(), self.workers, writes)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Count the block's time as the profile phase ``name``."""
        with self.profile.phase(name):
            yield

    def append(self, rows: DataFrame, table: Table) -> Commit | None:
        """Append ``rows`` to ``table`` exactly once for this batch (a profile phase)."""
        with self.profile.phase(table.name):
            self.fence()
            files = _per_commit_files(rows, self.settings)
            uri = table.uri(self.settings.storage_uri)
            committing = self.profile.phase(f"{table.name}:commit")
            return append_once(files, uri, self.app_id, self.batch_id, committing=committing)


def _bronze(
    rows: DataFrame, bronze_table: Table, batch_writes: BatchWrites, gaps: OffsetGaps
) -> Callable[[], object]:
    """The write of bronze (every batch), then its offset gaps (when the batch has some).

    Bronze is the query's anchor table: it commits every batch, so its txn version
    proves which batches the tables hold (`service.lake.checkpoints`). The other tables
    commit only when they receive rows: an empty commit would cost a Delta
    transaction and prove nothing more. The gaps commit after bronze's: a replay of a
    compacted topic may read fewer records than the run that wrote bronze, and its
    larger gaps then only also cover offsets bronze holds. Bronze needs no record's
    outcome: it is written from the batch's rows as read.
    """
    bronze = restored_views(rows).select(*BRONZE.fieldNames())

    def write_bronze() -> None:
        batch_writes.append(bronze, bronze_table)
        if gaps.rows is not None:
            try:
                batch_writes.append(gaps.rows, OFFSET_GAPS_TABLE)
            finally:
                gaps.rows.unpersist()

    return write_bronze


def _per_commit_files(rows: DataFrame, settings: Settings) -> DataFrame:
    """``rows`` in at most ``spark_shuffle_partitions`` partitions: files per commit.

    A batch's rows keep the partitioning of its Kafka read (split into more tasks
    than cores when large); merging partitions (no shuffle) bounds the files one
    commit adds to a table (and a streaming reader's files per version) by the
    shuffle partitions, as when every silver write followed a shuffle.
    """
    return rows.coalesce(settings.spark_shuffle_partitions)
