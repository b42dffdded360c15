"""`lakehouse-ingest replay-quarantine`: send quarantined records that now pass to silver, once.

After a fix (a producer's clock, ``INGEST_MAX_FUTURE_SECONDS`` raised, a value the
contract now accepts), the quarantined records a selection names are read back from
bronze (their exact bytes) and go through what live records go through
(`service.ingest.modes`): validation with the current settings and contracts, then the
silver writes of the contract's write mode (an event already in silver lands in its
duplicates table; an entity's change obeys the MERGE's ordering rules). What
passes lands in silver; gold's streams read it like late data. Quarantine rows are
kept: silver/quarantine_replays records per record and replay what happened
(``silver``, ``duplicate``, or ``rejected`` with the code the record fails with now,
so a later replay may take it again).

A replay runs under the driver lease (never beside a running driver) and commits
under the Delta app id ``lakehouse-ingest:replay:<replay id>``: its plan (the
records it takes, version 0), the silver writes (version 1, one per table), its
outcomes (version 2). A replay killed part-way has a plan and no outcomes: the next
run resumes it with its own plan before selecting anything new, and Delta skips the
writes it already committed, so every record lands once. Records a replay moved are
never selected again.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import reduce
from typing import Literal

import structlog
from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from service.config import Settings
from service.ingest.batch import summarize
from service.ingest.modes import mode_of
from service.ingest.query import IngestQuery, ingest_queries
from service.ingest.validation import split_valid_invalid
from service.lake.checkpoints import APP_ID_PREFIX
from service.lake.delta import append_once, ensure_table
from service.lake.invariants import MOVED
from service.lake.lease import acquire_driver_lease
from service.lake.local_rows import local_frame
from service.lake.object_files import ObjectFiles
from service.lake.schemas import COORDINATES, INGESTED_AT, KAFKA_RECORD, QUARANTINE_REPLAYS
from service.lake.tables import (
    QUARANTINE_REPLAYS_TABLE,
    QUARANTINE_TABLE,
    Table,
    contract_tables,
)
from service.streaming.session import build_spark

log = structlog.get_logger(__name__)

PLANNED, REJECTED = "planned", "rejected"
SILVER, DUPLICATE = MOVED
_PLAN, _WRITES, _OUTCOMES = 0, 1, 2  # txn versions of a replay's commits
_SAMPLE = 5


@dataclass(frozen=True)
class ReplayRequest:
    """Which quarantined records to replay; every given filter must hold."""

    error_codes: tuple[str, ...] = ()
    topic: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    time_column: Literal["quarantined_at", "kafka_timestamp"] = "quarantined_at"
    dry_run: bool = False


@dataclass(frozen=True)
class ReplayReport:
    """What a run replayed (or, with ``dry_run``, would): counts by code and by outcome."""

    dry_run: bool
    replay_ids: list[str]
    resumed: list[str]
    selected: dict[str, int]
    outcomes: dict[str, int]
    rejected: dict[str, int]
    sample: list[dict[str, object]] = field(default_factory=list)

    def to_json(self) -> str:
        """The report as one JSON document."""
        return json.dumps(asdict(self), default=str)

    def to_text(self) -> str:
        """The report for a terminal."""
        verb = "would replay" if self.dry_run else "replayed"
        total = sum(self.selected.values())
        lines = [f"{verb} {total} quarantined records"]
        if self.resumed:
            lines.append(f"resumed interrupted replays: {', '.join(self.resumed)}")
        if self.replay_ids and not self.dry_run:
            lines.append(f"replay ids: {', '.join(self.replay_ids)}")
        lines += [f"  quarantined as {code}: {n}" for code, n in sorted(self.selected.items())]
        lines += [f"  -> {outcome}: {n}" for outcome, n in sorted(self.outcomes.items())]
        lines += [f"     still {code}: {n}" for code, n in sorted(self.rejected.items())]
        lines += [f"  e.g. {json.dumps(s, default=str)}" for s in self.sample]
        return "\n".join(lines)


def select_quarantined(
    quarantine: DataFrame, replays: DataFrame, request: ReplayRequest, topics: Sequence[str]
) -> DataFrame:
    """Coordinates and code of the quarantined records of ``topics`` that ``request`` names
    and no replay has moved to silver."""
    rows = quarantine.where(F.col("kafka_topic").isin(list(topics)))
    if request.topic is not None:
        rows = rows.where(F.col("kafka_topic") == request.topic)
    if request.error_codes:
        rows = rows.where(F.col("error_code").isin(list(request.error_codes)))
    if request.since is not None:
        rows = rows.where(F.col(request.time_column) >= F.lit(request.since))
    if request.until is not None:
        rows = rows.where(F.col(request.time_column) < F.lit(request.until))
    moved = replays.where(F.col("outcome").isin(list(MOVED))).select(*COORDINATES)
    return rows.join(moved, list(COORDINATES), "left_anti").select(*COORDINATES, "error_code")


def unfinished_replays(replays: DataFrame) -> list[str]:
    """Ids of replays with a plan and no outcomes (killed part-way), oldest first."""
    states = replays.groupBy("replay_id").agg(
        F.min("replayed_at").alias("planned_at"),
        F.max(F.when(F.col("outcome") != PLANNED, 1).otherwise(0)).alias("finished"),
    )
    rows = states.where(F.col("finished") == 0).orderBy("planned_at", "replay_id").collect()
    return [str(r["replay_id"]) for r in rows]


def classify(parsed: DataFrame, duplicates: DataFrame | None) -> DataFrame:
    """One outcome row per record of ``parsed`` (validated): rejected with its new code,
    else duplicate when it is one of ``duplicates``' coordinates, else silver."""
    repeats = (
        duplicates.select(*COORDINATES).withColumn("_repeat", F.lit(True))
        if duplicates is not None
        else None
    )
    rows = parsed.select(*COORDINATES, "kafka_timestamp", "error_code", "error_detail")
    if repeats is not None:
        rows = rows.join(repeats, list(COORDINATES), "left")
    repeat: Column = F.col("_repeat").isNotNull() if repeats is not None else F.lit(False)
    outcome = (
        F.when(F.col("error_code").isNotNull(), REJECTED).when(repeat, DUPLICATE).otherwise(SILVER)
    )
    return rows.withColumn("outcome", outcome).select(
        *COORDINATES, "kafka_timestamp", "outcome", "error_code", "error_detail"
    )


def replay_quarantine(settings: Settings, request: ReplayRequest) -> ReplayReport:
    """The ``replay-quarantine`` verb; a dry run takes no lease and writes nothing."""
    spark = build_spark(settings, "lakehouse-ingest-replay", jvm_log_target="SYSTEM_ERR")
    if request.dry_run:
        return _Replayer(spark, settings).run(request)
    lease = acquire_driver_lease(settings)
    try:
        return _Replayer(spark, settings, lease.fence).run(request)
    finally:
        lease.release()


class _Replayer:
    """One run: resume interrupted replays, then replay the new selection."""

    def __init__(
        self, spark: SparkSession, settings: Settings, fence: Callable[[], None] | None = None
    ) -> None:
        self.spark = spark
        self.settings = settings
        self.fence = fence
        self.replays_uri = QUARANTINE_REPLAYS_TABLE.uri(settings.storage_uri)
        self.queries = {q.topic: q for q in ingest_queries(settings)}

    def _read(self, uri: str) -> DataFrame:
        return self.spark.read.format("delta").load(uri)

    def run(self, request: ReplayRequest) -> ReplayReport:
        if not request.dry_run:
            ensure_table(ObjectFiles(self.settings), self.replays_uri, QUARANTINE_REPLAYS_TABLE)
        replays = self._replays()
        resumed = [] if request.dry_run else unfinished_replays(replays)
        outcomes: list[DataFrame] = []
        counts: dict[str, int] = {}
        for replay_id in resumed:
            plan = replays.where(
                (F.col("replay_id") == replay_id) & (F.col("outcome") == PLANNED)
            ).select(*COORDINATES, "error_code")
            log.info("replay_resumed", replay_id=replay_id)
            _add_counts(counts, plan)
            outcomes.append(self._replay(replay_id, plan, write_plan=False))
        selected = select_quarantined(
            self._read(QUARANTINE_TABLE.uri(self.settings.storage_uri)),
            self._replays(),
            request,
            list(self.queries),
        ).persist()
        replay_ids = list(resumed)
        if _add_counts(counts, selected):
            replay_id = uuid.uuid4().hex
            replay_ids.append(replay_id)
            outcome = self._replay(replay_id, selected, not request.dry_run, request.dry_run)
            outcomes.append(outcome)
        report = _report(request.dry_run, replay_ids, resumed, counts, outcomes)
        selected.unpersist()
        summary = {k: v for k, v in asdict(report).items() if k != "sample"}
        log.info("quarantine_replayed", **summary)
        return report

    def _replays(self) -> DataFrame:
        """silver/quarantine_replays, or no rows when it does not exist yet."""
        if DeltaTable.isDeltaTable(self.spark, self.replays_uri):
            return self._read(self.replays_uri)
        return local_frame(self.spark, [], QUARANTINE_REPLAYS)

    def _replay(
        self, replay_id: str, plan: DataFrame, write_plan: bool, dry_run: bool = False
    ) -> DataFrame:
        """Replay the records of ``plan`` as ``replay_id``; return their outcomes."""
        app_id = f"{APP_ID_PREFIX}:replay:{replay_id}"
        stamp = F.lit(datetime.now(UTC))
        if write_plan:
            planned = plan.select(
                *COORDINATES,
                F.lit(None).cast("timestamp").alias("kafka_timestamp"),
                F.lit(replay_id).alias("replay_id"),
                stamp.alias("replayed_at"),
                F.lit(PLANNED).alias("outcome"),
                F.col("error_code"),
                F.lit(None).cast("string").alias("error_detail"),
            )
            self.append(planned, self.replays_uri, app_id, _PLAN)
            log.info("replay_planned", replay_id=replay_id)
        outcomes = []
        for topic, query in self.queries.items():
            mine = plan.where(F.col("kafka_topic") == topic)
            outcomes.append(self._replay_topic(query, mine, app_id, stamp, dry_run))
        result = reduce(DataFrame.unionByName, outcomes).persist()
        if not dry_run:
            rows = result.select(
                *COORDINATES,
                "kafka_timestamp",
                F.lit(replay_id).alias("replay_id"),
                stamp.alias("replayed_at"),
                "outcome",
                "error_code",
                "error_detail",
            )
            self.append(rows, self.replays_uri, app_id, _OUTCOMES)
            log.info("replay_done", replay_id=replay_id)
        return result

    def _replay_topic(
        self, query: IngestQuery, plan: DataFrame, app_id: str, stamp: Column, dry_run: bool
    ) -> DataFrame:
        """Validate and write one topic's planned records as live records are (the same
        silver writes as the driver's); their outcomes."""
        tables = contract_tables(query.contract)
        records = self._read(tables.bronze.uri(self.settings.storage_uri)).join(
            plan.select(*COORDINATES), list(COORDINATES), "left_semi"
        )
        parsed = (
            query.validate(records.select(*KAFKA_RECORD.fieldNames()), self.settings)
            .withColumn(INGESTED_AT.name, stamp)
            .persist()
        )
        summary = summarize(parsed)
        valid, _ = split_valid_invalid(parsed)
        writer = mode_of(query.contract).silver_writes(self.settings, keep_recent_ids=False)
        outcome = writer.write(valid, summary, _ReplayWrites(self, app_id), dry_run)
        return classify(parsed, outcome.duplicates)

    def append(self, rows: DataFrame, uri: str, app_id: str, version: int) -> None:
        """Append ``rows`` once under the replay's txn (the lease fenced first)."""
        if self.fence is not None:
            self.fence()
        append_once(rows.coalesce(self.settings.spark_shuffle_partitions), uri, app_id, version)


@dataclass(frozen=True)
class _ReplayWrites:
    """A replay's silver writes (`service.ingest.batch.Writes`): one after the other,
    each committed under the replay's app id with the writes' version."""

    replayer: _Replayer
    app_id: str
    version: int = _WRITES

    def append(self, rows: DataFrame, table: Table) -> None:
        self.replayer.append(
            rows, table.uri(self.replayer.settings.storage_uri), self.app_id, self.version
        )

    def together(self, writes: Sequence[Callable[[], object]]) -> None:
        for write in writes:
            write()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        yield

    def fence(self) -> None:
        if self.replayer.fence is not None:
            self.replayer.fence()


def _add_counts(counts: dict[str, int], plan: DataFrame) -> int:
    """Add ``plan``'s records per error code to ``counts``; return how many it has."""
    total = 0
    for row in plan.groupBy("error_code").agg(F.count("*").alias("n")).collect():
        counts[row["error_code"]] = counts.get(row["error_code"], 0) + int(row["n"])
        total += int(row["n"])
    return total


def _report(
    dry_run: bool,
    replay_ids: list[str],
    resumed: list[str],
    selected: dict[str, int],
    outcomes: list[DataFrame],
) -> ReplayReport:
    by_outcome: dict[str, int] = {}
    rejected: dict[str, int] = {}
    sample: list[dict[str, object]] = []
    for result in outcomes:
        for row in result.groupBy("outcome", "error_code").agg(F.count("*").alias("n")).collect():
            by_outcome[row["outcome"]] = by_outcome.get(row["outcome"], 0) + int(row["n"])
            if row["outcome"] == REJECTED:
                rejected[row["error_code"]] = rejected.get(row["error_code"], 0) + int(row["n"])
        if len(sample) < _SAMPLE:
            picked = result.orderBy(*COORDINATES).limit(_SAMPLE - len(sample)).collect()
            sample += [r.asDict() for r in picked]
        result.unpersist()
    return ReplayReport(dry_run, replay_ids, resumed, selected, by_outcome, rejected, sample)
