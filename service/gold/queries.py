"""The gold queries: silver/sensor_readings read as a Delta stream, aggregated or joined.

Kafka is read only by the ingest queries. Each gold query reads silver as a
stream, applies a pure transform from `service.gold.transforms` (windows and the
stream-stream join are watermarked, so their state is bounded and each appended
row is final), and writes its table in ``foreachBatch`` with the same idempotent
``txnAppId``/``txnVersion`` scheme as ingest. The enrichment joins each
micro-batch with the silver/users snapshot current when the batch runs (a
stream-static join made explicit) and records that snapshot's version in
``users_version``. Alerts are also published to Kafka, after the Delta commit:
at least once there (a replayed batch publishes again), exactly once in Delta.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import structlog
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from service.config import Settings
from service.errors import ConfigError
from service.gold.transforms import (
    alerts,
    enrich_readings,
    heart_rate_stats,
    heart_rate_with_activity,
    sensor_stats,
)
from service.lake.checkpoints import checkpoint_plan
from service.lake.delta import append_once, latest_snapshot
from service.lake.hadoop_fs import HadoopFiles
from service.lake.maintenance import TableMaintenance
from service.lake.tables import (
    ALERTS,
    HEART_RATE_5M,
    HEART_RATE_ACTIVITY,
    READINGS_ENRICHED,
    SENSOR_STATS_1M,
    Table,
    catalogue_of,
)
from service.streaming.profile import BatchProfile
from service.streaming.runner import (
    IngestBatches,
    QueryWriter,
    checkpoint_location,
    start_with_writer,
)

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class GoldQuery:
    """One gold query: its table and how it turns the silver readings stream into rows."""

    name: str
    table: Table
    # How the silver readings stream becomes rows, by plan version (1, 2, ...): a new
    # version when a change alters the query's state layout; a checkpoint keeps the
    # version it was started with (`checkpoints.checkpoint_plan`), new ones get the last.
    plans: tuple[Callable[[DataFrame, Settings], DataFrame], ...]
    # Per micro-batch, before the write (e.g. a join with a table snapshot).
    per_batch: Callable[[DataFrame, Settings], DataFrame] | None = None
    # Per micro-batch, after the Delta commit (e.g. publishing to Kafka).
    after_write: Callable[[DataFrame, Settings], None] | None = None

    # The FAIR scheduler pool of its jobs, which also decides its trigger.
    pool: ClassVar[str] = "gold"

    @property
    def tables(self) -> tuple[Table, ...]:
        """The table this query writes."""
        return (self.table,)


def gold_queries() -> list[GoldQuery]:
    """Every gold query, in start order."""
    return [
        GoldQuery(
            "gold_sensor_stats_1m",
            SENSOR_STATS_1M,
            (lambda r, s: sensor_stats(r, s.stats_window, s.watermark),),
        ),
        GoldQuery(
            "gold_heart_rate_5m",
            HEART_RATE_5M,
            (
                lambda r, s: heart_rate_stats(
                    r, s.heart_rate_window, s.heart_rate_slide, s.watermark
                ),
            ),
        ),
        GoldQuery(
            "gold_readings_enriched",
            READINGS_ENRICHED,
            (lambda r, s: r,),
            per_batch=_enrich_with_current_users,
        ),
        GoldQuery(
            "gold_heart_rate_activity",
            HEART_RATE_ACTIVITY,
            (
                # 1: state keyed by user alone (checkpoints started before version 2).
                lambda r, s: heart_rate_with_activity(
                    r, s.watermark, s.join_tolerance_seconds, bucketed=False
                ),
                # 2: keyed by user and event-time minute: the same pairs, fewer comparisons.
                lambda r, s: heart_rate_with_activity(r, s.watermark, s.join_tolerance_seconds),
            ),
        ),
        GoldQuery(
            "gold_alerts",
            ALERTS,
            (lambda r, s: alerts(r, s.alert_heart_rate_bpm),),
            after_write=_publish_alerts,
        ),
    ]


class GoldWriter(QueryWriter):
    """The ``foreachBatch`` function of a gold query."""

    def __init__(
        self,
        query: GoldQuery,
        settings: Settings,
        fence: Callable[[], None],
        maintenance: TableMaintenance | None = None,
        ingest: IngestBatches | None = None,
        after_batch: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(query.name, fence, maintenance, after_batch)
        self.query = query
        self.settings = settings
        self._ingest = ingest or IngestBatches()

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        app_id = self.app_id(batch_id)
        with self.writing(batch_id):
            waited = self._ingest.wait_until_idle(self.settings.gold_yield_seconds)
            profile = BatchProfile(batch.sparkSession.sparkContext)
            table = self.query.table
            rows = batch
            if self.query.per_batch is not None:
                with profile.phase("per_batch"):
                    rows = self.query.per_batch(batch, self.settings)
            if self.query.after_write is not None:
                rows = rows.persist()  # published after the commit: computed once
            try:
                self.fence()
                with profile.phase(table.name):
                    append_once(
                        rows,
                        table.uri(self.settings.storage_uri),
                        app_id,
                        batch_id,
                        table.properties,
                        committing=profile.phase(f"{table.name}:commit"),
                        on_replay=lambda: _run_replayed(batch, table.name, batch_id),
                    )
                if self.query.after_write is not None:
                    with profile.phase("after_write"):
                        self.query.after_write(rows, self.settings)
            finally:
                rows.unpersist()
            log.info(
                "batch_written",
                query=self.query.name,
                batch_id=batch_id,
                waited_for_ingest_ms=round(waited * 1000),
                **profile.summary(),
            )


def _run_replayed(batch: DataFrame, table: str, batch_id: int) -> None:
    """Run a batch its table holds already, writing nothing: a restart replays the batch a
    crash left uncommitted, and Spark (4.2 on) fails a stateful query whose batch did not
    commit its state stores. The state it writes is the one the first run wrote."""
    batch.write.format("noop").mode("overwrite").save()
    log.info("batch_already_in_table", table=table, batch_id=batch_id)


def gold_sources(settings: Settings) -> tuple[Table, Table]:
    """The silver tables gold reads: the ``sensors`` contract's (readings) and the ``users``
    contract's (profiles); a deployment without them runs no gold (INGEST_GOLD_ENABLED)."""
    missing = [n for n in ("sensors", "users") if n not in settings.contracts.by_name]
    if missing:
        raise ConfigError(
            f"INGEST_GOLD_ENABLED: gold reads the contracts sensors and users, and "
            f"{', '.join(missing)} is not among this deployment's contracts; set "
            "INGEST_GOLD_ENABLED=false"
        )
    catalogue = catalogue_of(settings.contracts)
    return catalogue.of("sensors").silver, catalogue.of("users").silver


def _enrich_with_current_users(batch: DataFrame, settings: Settings) -> DataFrame:
    """Join ``batch`` with silver/users as of now, pinned to one version for the whole batch."""
    spark = batch.sparkSession
    uri = gold_sources(settings)[1].uri(settings.storage_uri)
    # The latest version from a listing of the log: no Spark job, unlike the table's
    # history (0.15-0.2 s a batch; measured: a 10-row batch 0.57-0.70 s → 0.35-0.54 s).
    version = int(latest_snapshot(spark, uri)[1].version())
    users = spark.read.format("delta").option("versionAsOf", version).load(uri)
    return enrich_readings(batch, users).withColumn("users_version", F.lit(version))


def _publish_alerts(rows: DataFrame, settings: Settings) -> None:
    """Publish alert rows to the alerts topic keyed by ``event_id`` (at least once)."""
    (
        rows.select(F.col("event_id").alias("key"), F.to_json(F.struct("*")).alias("value"))
        .write.format("kafka")
        .options(**settings.kafka.spark_options())
        .option("topic", settings.alerts_topic)
        .save()
    )


def start_gold_query(
    spark: SparkSession,
    settings: Settings,
    query: GoldQuery,
    writer: GoldWriter,
    available_now: bool,
) -> StreamingQuery:
    """Start ``query`` reading silver/sensor_readings as a stream, with the plan version
    its checkpoint was started with."""
    checkpoint = checkpoint_location(settings, query.name)
    version = checkpoint_plan(HadoopFiles(spark), checkpoint, len(query.plans))
    if version < len(query.plans):
        log.warning(
            "gold_plan_kept",
            query=query.name,
            plan_version=version,
            latest=len(query.plans),
            hint="the checkpoint's state was started by an earlier plan and keeps it; "
            "docs/tables.md 'Gold plan versions' rebuilds the query with the latest",
        )
    source, _ = gold_sources(settings)
    readings = (
        spark.readStream.format("delta")
        .option("maxFilesPerTrigger", settings.gold_max_files_per_trigger)
        .load(source.uri(settings.storage_uri))
    )
    stream = query.plans[version - 1](readings, settings).writeStream.outputMode("append")
    return start_with_writer(
        spark,
        stream,
        settings,
        writer,
        available_now,
        query.pool,
        source=source.name,
    )
