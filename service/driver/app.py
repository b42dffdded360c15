"""The one composition root: settings → logging → HTTP → lease → Spark → queries → wait.

Every component is started here, in order, and stopped in the reverse order by one
`Lifecycle`, whether the run drains, is stopped by a signal or fails: the queries are
interrupted first (a clean stop has stopped them already), the HTTP server last, so
the final state (queries down, not ready) can still be scraped.

Exit codes (see ``service.__main__``): 0 after a clean stop (SIGTERM/SIGINT, or
``--available-now`` drained); non-zero, with one clear log line, otherwise.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import FrameType
from typing import Any

import structlog
from prometheus_client import CollectorRegistry
from pyspark.sql import SparkSession

from service.background import Lifecycle, Resource
from service.config import Settings
from service.driver.consumer_group import CommittedOffsetsListener, ConsumerGroupCommitter
from service.driver.freshness import CaughtUpKeeper
from service.driver.http import HttpServer
from service.driver.jvm import JvmSampler
from service.driver.lag import LagPoller
from service.driver.lake_audit import LakeAuditor
from service.driver.metrics import IngestMetrics, MetricsListener
from service.driver.running import Health, RunningQueries, wait
from service.gold.queries import GoldQuery, GoldWriter, gold_queries, start_gold_query
from service.ingest.query import (
    IngestQuery,
    IngestStream,
    ingest_queries,
    ingest_stream,
    start_ingest_query,
)
from service.ingest.writer import BatchOutcome, BatchWriter
from service.kafka.admin import check_kafka_access, ensure_topics
from service.kafka.lost_offsets import LostOffsets, check_lost_offsets, record_skipped
from service.kafka.offsets import broker_offsets, offsets_consumer
from service.lake.checkpoints import BatchRanges, QueryTarget
from service.lake.delta import ensure_table
from service.lake.evolution import Evolution, apply_evolution, plan_evolution, recording
from service.lake.invariants import reconcile
from service.lake.lakeview import LakeReader
from service.lake.lease import DriverLease, acquire_driver_lease
from service.lake.log_checkpoints import LogCheckpoints
from service.lake.maintenance import (
    MAINTAINED_FILE,
    MaintenanceRecord,
    TableMaintenance,
    maintenance_for,
)
from service.lake.object_files import ObjectFiles
from service.lake.tables import OPERATOR_TABLES, QuerySpec, Table
from service.streaming.runner import (
    IngestBatches,
    check_tables,
    checkpoint_location,
    trigger_seconds,
)
from service.streaming.session import MAINTENANCE_POOL, build_spark, expected_executors

log = structlog.get_logger(__name__)

# Partitions of the alerts topic when the service has to create it.
ALERTS_PARTITIONS = 3


def run(settings: Settings, available_now: bool = False) -> int:
    """Run every query until drained (``available_now``), stopped by a signal, or failed."""
    stop_requested = threading.Event()
    _stop_on_signals(stop_requested)
    log.info("starting", settings=settings.redacted(), available_now=available_now)
    check_kafka_access(settings)
    registry = CollectorRegistry()
    metrics = IngestMetrics(registry)
    metrics.jvm.executors_expected(expected_executors(settings))
    running = RunningQueries(expected=[q.name for q in _queries(settings)])
    health = Health(running, metrics, settings)
    metrics.watch_readiness(health.readiness)
    with Lifecycle() as components:
        server = components.start(
            HttpServer(
                settings.http_port, registry, health.readiness, health.liveness, health.status
            )
        )
        # Before Spark: a storage that does not answer, or another live driver, stops the
        # start in a second, without a JVM.
        lease = acquire_driver_lease(settings)
        components.start(Resource(lease.release))
        metrics.watch_storage(lambda: lease.record.heartbeat_at)
        # Before Spark too: a contract its tables cannot follow refuses the start at once.
        reader = LakeReader.from_settings(settings)
        evolution = plan_evolution(settings.contracts, reader.root, reader.options)
        spark = build_spark(settings, drain=available_now)
        components.start(Resource(lambda: _shutdown_spark(spark)))
        # PySpark's context replaced the SIGINT handler with one that cancels every job
        # and raises KeyboardInterrupt wherever the main thread is: Ctrl-C stops gracefully.
        _stop_on_signals(stop_requested)
        spark.streams.addListener(MetricsListener(metrics))
        context = spark.sparkContext
        components.start(JvmSampler(context._jvm, context._jsc.sc().statusTracker(), metrics.jvm))
        health.lease = lease
        files = ObjectFiles(settings)
        targets = [
            QueryTarget(q.name, q.topic, checkpoint_location(settings, q.name))
            for q in ingest_queries(settings)
        ]
        checkpoints = {t.name: t.checkpoint for t in targets}
        components.start(CaughtUpKeeper(checkpoints, files, metrics))
        if settings.consumer_group:
            committer = ConsumerGroupCommitter(settings, checkpoints, files, metrics)
            spark.streams.addListener(CommittedOffsetsListener(committer, list(checkpoints)))
            components.start(committer)
        stable_ends = offsets_consumer(settings)
        components.start(Resource(stable_ends.close))
        # The log's end (high watermark) tells a recreated topic from an open transaction.
        log_ends = offsets_consumer(settings, "read_uncommitted")
        components.start(Resource(log_ends.close))

        def stable(topics: Sequence[str]) -> dict[str, Any]:
            return broker_offsets(stable_ends, topics)

        skipped = check_lost_offsets(
            targets,
            files,
            lambda topics: broker_offsets(log_ends, topics),
            settings.kafka_skip_lost_offsets,
            stable,
        )
        auditor = LakeAuditor(
            targets,
            files,
            lambda increments: reconcile(
                LakeReader.from_settings(settings), settings, None, increments
            ),
            metrics.reconcile,
            settings.reconcile_interval_seconds,
        )
        auditing = bool(settings.reconcile_interval_seconds) and not available_now
        streams = _prepare_lake(
            spark, settings, files, lease, metrics, skipped, evolution, available_now
        )
        if auditing:
            auditor.start_from_committed()
        # Stopped after the queries (started before them), before the session.
        log_checkpoints = components.start(
            LogCheckpoints(
                spark, settings.storage_uri, settings.delta_checkpoint_commits, MAINTENANCE_POOL
            )
        )
        components.start(running)
        _start_queries(
            spark,
            settings,
            lease,
            metrics,
            running,
            streams,
            skipped,
            checkpoints,
            files,
            log_checkpoints,
            stop_requested,
            available_now,
        )
        components.start(
            LagPoller(
                targets,
                stable,
                files,
                metrics.lag,
                settings.kafka_starting_offsets == "earliest",
                settings.lag_poll_seconds,
            )
        )
        if auditing:
            components.start(auditor)
        log.info(
            "running",
            queries=[r.spec.name for r in running.queries],
            storage_root=settings.storage_uri,
            http_port=server.port,
        )
        wait(running, stop_requested, lease, available_now, settings)
    log.info("stopped", reason="drained" if available_now else "signal")
    return 0


def _stop_on_signals(stop_requested: threading.Event) -> None:
    """SIGTERM and SIGINT set ``stop_requested`` (logged once)."""

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        if not stop_requested.is_set():
            log.info("stop_requested", signal=signal.Signals(signum).name)
        stop_requested.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)


def _gold(settings: Settings) -> list[GoldQuery]:
    return gold_queries() if settings.gold_enabled else []


def _queries(settings: Settings) -> list[IngestQuery | GoldQuery]:
    """Every query of this deployment, ingest first."""
    return [*ingest_queries(settings), *_gold(settings)]


def _prepare_lake(
    spark: SparkSession,
    settings: Settings,
    files: ObjectFiles,
    lease: DriverLease,
    metrics: IngestMetrics,
    skipped: list[LostOffsets],
    evolution: list[Evolution],
    available_now: bool,
) -> dict[str, IngestStream]:
    """Refuse a checkpoint/table disagreement, create the missing tables, record skipped
    offsets and the alerts topic; return each ingest query's stream (`ingest_stream`).

    The streams are built while the tables are created: neither needs the other.
    """
    # The contracts' compatible changes first: the table checks then see their columns.
    apply_evolution(spark, settings.storage_uri, [e for e in evolution if e.exists], lease.fence)
    missing: dict[str, Table] = {}  # by name: the quarantine is every ingest query's
    for spec in _queries(settings):
        interval = trigger_seconds(settings, spec.pool, available_now)
        metrics.query_declared(spec.name, [t.name for t in spec.tables], interval)
        absent = check_tables(spark, settings, spec.name, spec.tables)
        missing.update((t.name, t) for t in absent)
    # Written on an operator's word only; here so that every reader finds them.
    missing.update((t.name, t) for t in OPERATOR_TABLES)
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="plan") as plans:
        validated = {
            q.name: plans.submit(
                ingest_stream, spark, settings, q, any(lost.query == q.name for lost in skipped)
            )
            for q in ingest_queries(settings)
        }
        lease.fence()
        # A new silver table records its contract in its first commit.
        recorded = {e.table.name: recording(e.contract) for e in evolution if not e.exists}
        # Each creation waits on the store (a few requests per table): side by side.
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="create") as creating:
            created_tables = [
                creating.submit(
                    ensure_table,
                    files,
                    table.uri(settings.storage_uri),
                    table,
                    recorded.get(table.name, {}),
                )
                for table in missing.values()
            ]
            for future in created_tables:
                future.result()
        if skipped:
            record_skipped(spark, settings.storage_uri, skipped, lease.fence)
            for lost in skipped:
                metrics.offsets_skipped(lost.topic, lost.count)
        if settings.gold_enabled:
            ensure_topics(settings, [settings.alerts_topic], partitions=ALERTS_PARTITIONS)
        return {name: future.result() for name, future in validated.items()}


def _start_queries(
    spark: SparkSession,
    settings: Settings,
    lease: DriverLease,
    metrics: IngestMetrics,
    running: RunningQueries,
    streams: dict[str, IngestStream],
    skipped: list[LostOffsets],
    checkpoints: Mapping[str, str],
    files: ObjectFiles,
    log_checkpoints: LogCheckpoints,
    stop_requested: threading.Event,
    available_now: bool,
) -> None:
    """Start the ingest queries (``checkpoints`` maps each to its checkpoint), then the
    gold ones (with ``available_now``, once ingest has drained: gold drains what ingest
    wrote). A stop requested meanwhile starts nothing more."""
    specs: list[QuerySpec] = list(_queries(settings))
    ingest_batches = IngestBatches(trigger_seconds(settings, IngestQuery.pool, available_now))

    def maintenance(spec: QuerySpec, checkpoint: str) -> TableMaintenance | None:
        record = f"{checkpoint}/{MAINTAINED_FILE}"
        return maintenance_for(
            spec, settings, specs, metrics.maintenance, MaintenanceRecord(files, record)
        )

    for spec in ingest_queries(settings):
        if stop_requested.is_set():
            return
        checkpoint = checkpoints[spec.name]
        ranges = BatchRanges(
            files,
            checkpoint,
            spec.topic,
            {lost.partition: lost.earliest for lost in skipped if lost.query == spec.name},
        )
        writer = BatchWriter(
            spec,
            streams[spec.name],
            settings,
            _record_batch(metrics),
            lease.fence,
            ingest_batches,
            ranges,
            maintenance(spec, checkpoint),
            log_checkpoints.after_batch_of(spec.tables),
            keep_recent_ids=not available_now,
        )
        handle = start_ingest_query(
            spark, settings, spec, streams[spec.name], writer, available_now
        )
        running.add(spec, handle, writer)
    if available_now:
        wait(running, stop_requested, lease, available_now, settings)
    for gold in _gold(settings):
        if stop_requested.is_set():
            return
        maintained = maintenance(gold, checkpoint_location(settings, gold.name))
        gold_writer = GoldWriter(
            gold,
            settings,
            lease.fence,
            maintained,
            ingest_batches,
            log_checkpoints.after_batch_of(gold.tables),
        )
        handle = start_gold_query(spark, settings, gold, gold_writer, available_now)
        running.add(gold, handle, gold_writer)


def _record_batch(metrics: IngestMetrics) -> Callable[[str, BatchOutcome], None]:
    def record(query_name: str, outcome: BatchOutcome) -> None:
        metrics.batch_written(
            query_name, outcome.rows_written, outcome.quarantined, outcome.duplicates
        )

    return record


def _shutdown_spark(spark: SparkSession) -> None:
    try:
        spark.stop()
    except Exception:
        log.exception("spark_stop_failed")
