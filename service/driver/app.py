"""The one composition root: settings → logging → Spark → lease → metrics/HTTP → queries → wait.

Exit codes (see ``service.__main__``): 0 after a clean stop (SIGTERM/SIGINT, or
``--available-now`` drained); non-zero, with one clear log line, otherwise.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import FrameType
from typing import Any

import structlog
from prometheus_client import CollectorRegistry
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from service.config import Settings
from service.driver.http import liveness_verdict, readiness_verdict, serve_http
from service.driver.lag import LaggedQuery, LagPoller
from service.driver.lake_audit import AuditedTopic, LakeAuditor
from service.driver.metrics import IngestMetrics, MetricsListener
from service.failures import query_failure
from service.gold.queries import GoldQuery, GoldWriter, gold_queries, start_gold_query
from service.ingest.query import IngestQuery, ingest_queries, ingest_stream, start_ingest_query
from service.ingest.writer import BatchOutcome, BatchWriter
from service.kafka.admin import check_kafka_access, ensure_topics
from service.kafka.lost_offsets import CheckedQuery, check_lost_offsets, record_skipped
from service.kafka.offsets import broker_offsets, offsets_consumer
from service.lake.checkpoints import BatchRanges
from service.lake.delta import ensure_table
from service.lake.lakeview import LakeReader
from service.lake.lease import DriverLease, acquire_driver_lease
from service.lake.maintenance import maintenance_for
from service.lake.object_files import ObjectFiles
from service.lake.tables import OPERATOR_TABLES, QuerySpec, Table
from service.streaming.queries import (
    IngestBatches,
    QueryWriter,
    check_tables,
    checkpoint_location,
)
from service.streaming.session import build_spark
from service.verbs.driver_view import DriverView, QueryNow
from service.verbs.reconcile import reconcile

log = structlog.get_logger(__name__)

_POLL_SECONDS = 0.5
# Spark 4.0's status messages of a micro-batch query between two triggers.
_WAITING_FOR_TRIGGER = ("Waiting for next trigger", "Waiting for data to arrive")
# Partitions of the alerts topic when the service has to create it.
ALERTS_PARTITIONS = 3
# A query silent (no progress, no idle event) for longer than this is stuck in a batch.
_MIN_PROGRESS_AGE_SECONDS = 120.0


@dataclass
class RunningQuery:
    """A started query with the writer that tells whether a batch is in flight."""

    spec: IngestQuery | GoldQuery
    handle: StreamingQuery
    writer: QueryWriter


def run(settings: Settings, available_now: bool = False) -> int:
    """Run every query until drained (``available_now``), stopped by a signal, or failed."""
    stop_requested = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        if not stop_requested.is_set():
            log.info("stop_requested", signal=signal.Signals(signum).name)
        stop_requested.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    log.info("starting", settings=settings.redacted(), available_now=available_now)
    check_kafka_access(settings)
    spark = build_spark(settings)
    # PySpark's context replaced the SIGINT handler with one that cancels every job
    # and raises KeyboardInterrupt wherever the main thread is: Ctrl-C stops gracefully.
    signal.signal(signal.SIGINT, request_stop)
    registry = CollectorRegistry()
    metrics = IngestMetrics(registry)
    spark.streams.addListener(MetricsListener(metrics))

    lease = acquire_driver_lease(settings)
    running: list[RunningQuery] = []

    def readiness() -> tuple[bool, str]:
        return _readiness(running, metrics, lease, settings)

    def liveness() -> tuple[bool, str]:
        alive, reason = liveness_verdict(
            {q.spec.name: metrics.seconds_since_progress(q.spec.name) for q in running},
            {q.spec.name: metrics.records_waiting(q.spec.name) for q in running},
            settings.wedged_seconds,
        )
        if not alive:
            log.error("driver_wedged", reason=reason)
        return alive, reason

    def status() -> str:
        return _driver_view(running, metrics, readiness(), liveness(), lease).to_json()

    metrics.watch_storage(lambda: lease.record.heartbeat_at)
    metrics.watch_readiness(readiness)
    server = serve_http(settings.http_port, registry, readiness, liveness, status)
    consumer = offsets_consumer(settings)
    # The log's end (high watermark) tells a recreated topic from an open transaction.
    log_ends = offsets_consumer(settings, "read_uncommitted")
    lag = LagPoller(
        [
            LaggedQuery(q.name, q.topic, checkpoint_location(settings, q.name))
            for q in ingest_queries(settings)
        ],
        lambda topics: broker_offsets(consumer, topics),
        ObjectFiles(settings),
        metrics,
        from_earliest=settings.kafka_starting_offsets == "earliest",
    )
    auditor = LakeAuditor(
        [
            AuditedTopic(q.topic, checkpoint_location(settings, q.name))
            for q in ingest_queries(settings)
        ],
        ObjectFiles(settings),
        lambda increments: reconcile(
            LakeReader.from_settings(settings), settings, None, increments
        ),
        metrics,
    )
    plans = ThreadPoolExecutor(max_workers=2, thread_name_prefix="plan")
    try:
        skipped = check_lost_offsets(
            [
                CheckedQuery(q.name, q.topic, checkpoint_location(settings, q.name))
                for q in ingest_queries(settings)
            ],
            ObjectFiles(settings),
            lambda topics: broker_offsets(log_ends, topics),
            settings.kafka_skip_lost_offsets,
            lambda topics: broker_offsets(consumer, topics),
        )
        gold_names = {g.name for g in _gold(settings)}
        specs: list[QuerySpec] = [*ingest_queries(settings), *_gold(settings)]
        missing: dict[str, Table] = {}  # by name: the quarantine is every ingest query's
        for spec in specs:
            interval = (
                settings.gold_trigger_seconds
                if spec.name in gold_names
                else settings.trigger_interval_seconds
            )
            metrics.query_declared(
                spec.name, [t.name for t in spec.tables], 0.0 if available_now else interval
            )
            absent = check_tables(spark, settings, spec.name, spec.tables)
            missing.update((t.name, t) for t in absent)
        # Written on an operator's word only; here so that every reader finds them.
        missing.update((t.name, t) for t in OPERATOR_TABLES)
        # Built while the tables are created below: neither needs the other.
        validated = {
            q.name: plans.submit(
                ingest_stream,
                spark,
                settings,
                q,
                any(lost.query == q.name for lost in skipped),
            )
            for q in ingest_queries(settings)
        }
        for table in missing.values():
            ensure_table(spark, table.uri(settings.storage_uri), table)
        if skipped:
            record_skipped(spark, settings.storage_uri, skipped, lease.fence)
            for lost in skipped:
                metrics.offsets_skipped(lost.topic, lost.count)
        if settings.gold_enabled:
            ensure_topics(settings, [settings.alerts_topic], partitions=ALERTS_PARTITIONS)
        if settings.reconcile_interval_seconds and not available_now:
            auditor.start_from_committed()
        ingest_batches = IngestBatches(0 if available_now else settings.trigger_interval_seconds)
        for spec in ingest_queries(settings):
            if stop_requested.is_set():  # stopped while starting: start nothing more
                break
            maintenance = maintenance_for(spec, settings, specs, metrics.maintenance)
            ranges = BatchRanges(
                ObjectFiles(settings),
                checkpoint_location(settings, spec.name),
                spec.topic,
                {lost.partition: lost.earliest for lost in skipped if lost.query == spec.name},
            )
            writer = BatchWriter(
                spec,
                settings,
                _record_batch(metrics),
                lease.fence,
                ingest_batches,
                ranges,
                maintenance,
            )
            stream = validated[spec.name].result()
            handle = start_ingest_query(spark, settings, spec, stream, writer, available_now)
            running.append(RunningQuery(spec, handle, writer))
        if available_now:  # gold drains what ingest wrote, so ingest drains first
            _wait(running, stop_requested, lease, available_now, settings)
        for gold in _gold(settings):
            if stop_requested.is_set():
                break
            maintenance = maintenance_for(gold, settings, specs, metrics.maintenance)
            gold_writer = GoldWriter(gold, settings, lease.fence, maintenance, ingest_batches)
            handle = start_gold_query(spark, settings, gold, gold_writer, available_now)
            running.append(RunningQuery(gold, handle, gold_writer))
        lag.start(settings.lag_poll_seconds)
        if settings.reconcile_interval_seconds and not available_now:
            auditor.start(settings.reconcile_interval_seconds)
        log.info(
            "running",
            queries=[r.spec.name for r in running],
            storage_root=settings.storage_uri,
            http_port=server.server_address[1],
        )
        _wait(running, stop_requested, lease, available_now, settings)
    except BaseException:
        _interrupt_all(running)
        raise
    finally:
        try:
            plans.shutdown(cancel_futures=True)
            auditor.stop()
            lag.stop()
            consumer.close()
            log_ends.close()
            lease.release()
            _shutdown_spark(spark)
        finally:
            # Last, so the final state (queries down, not ready) can still be scraped.
            server.shutdown()
    log.info("stopped", reason="drained" if available_now else "signal")
    return 0


def _wait(
    running: list[RunningQuery],
    stop_requested: threading.Event,
    lease: DriverLease,
    available_now: bool,
    settings: Settings,
) -> None:
    while True:
        lease.check()
        for query in running:
            if not query.handle.isActive and (error := query.handle.exception()) is not None:
                raise query_failure(
                    query.spec.name,
                    str(error),
                    settings.spark_local_dir,
                    (settings.storage_uri, settings.checkpoint_uri),
                )
        if available_now and not any(q.handle.isActive for q in running):
            return
        if stop_requested.is_set():
            _stop_gracefully(running, settings.stop_timeout_seconds)
            return
        stop_requested.wait(_POLL_SECONDS)


def _stop_gracefully(running: list[RunningQuery], timeout: float) -> None:
    """Let every query end after the trigger it is running, within ``timeout`` seconds.

    Each query is marked terminated the way `StreamingQuery.stop` marks it, without
    the interrupt: Spark checks that mark before it starts a trigger, so the batch
    in flight (planning or writing) finishes and is committed, and no new one
    starts. A query seen waiting for its next trigger twice in a row is stopped
    then (the interrupt lands in that wait); the others end by themselves. Queries
    still running at the deadline are interrupted: their batch replays on restart.
    """
    active = [q for q in running if q.handle.isActive]
    in_flight = {q.spec.name: q.writer.in_flight()[0] for q in active}
    log.info("stopping", in_flight={k: v for k, v in in_flight.items() if v is not None})
    for query in active:
        _end_after_current_trigger(query.handle)
    waiting: set[str] = set()
    deadline = time.monotonic() + timeout
    while active and time.monotonic() < deadline:
        for query in list(active):
            name = query.spec.name
            if _running(query.handle):
                if not _between_triggers(query):
                    waiting.discard(name)
                    continue
                if name not in waiting:
                    waiting.add(name)
                    continue
                query.handle.stop()
            active.remove(query)
            _log_stopped(query)
        time.sleep(0.2)
    if active:
        log.warning(
            "stop_timeout",
            timeout_seconds=timeout,
            interrupted=[q.spec.name for q in active],
            hint="their batches replay on restart; raise INGEST_STOP_TIMEOUT_SECONDS",
        )
        _interrupt_all(active)


def _running(handle: StreamingQuery) -> bool:
    """Whether the query's thread still runs (``isActive`` is false from the mark on)."""
    return bool(handle._jsq.streamingQuery().queryExecutionThread().isAlive())


def _between_triggers(query: RunningQuery) -> bool:
    """Whether the query's thread waits for its next trigger (no batch, no planning)."""
    if query.writer.in_flight()[0] is not None:
        return False
    return query.handle.status["message"] in _WAITING_FOR_TRIGGER


def _end_after_current_trigger(handle: StreamingQuery) -> None:
    """Mark the query terminated (Spark 4.0 internals) so that it starts no new trigger."""
    jvm: Any = SparkSession.active().sparkContext._jvm
    terminated = getattr(
        getattr(jvm.org.apache.spark.sql.execution.streaming, "TERMINATED$"), "MODULE$"
    )
    handle._jsq.streamingQuery().state().set(terminated)


def _interrupt_all(running: list[RunningQuery]) -> None:
    """Stop every query now, interrupting a batch in flight (it replays on restart)."""
    for query in running:
        if _running(query.handle):
            query.handle.stop()
            _log_stopped(query)


def _log_stopped(query: RunningQuery) -> None:
    log.info("query_stopped", query=query.spec.name, last_batch_id=query.writer.last_batch_id)


def _readiness(
    running: list[RunningQuery], metrics: IngestMetrics, lease: DriverLease, settings: Settings
) -> tuple[bool, str]:
    expected = [q.name for q in ingest_queries(settings)] + [g.name for g in _gold(settings)]
    started = {q.spec.name for q in running}
    if not started.issuperset(expected):
        return False, f"starting: {len(started)} of {len(expected)} queries started"
    return readiness_verdict(
        active={q.spec.name: bool(q.handle.isActive) for q in running},
        progress_age={q.spec.name: metrics.seconds_since_progress(q.spec.name) for q in running},
        max_progress_age=max(
            _MIN_PROGRESS_AGE_SECONDS,
            10 * max(settings.trigger_interval_seconds, settings.gold_trigger_seconds),
        ),
        storage_age=time.time() - lease.record.heartbeat_at,
        max_storage_age=settings.lease_ttl_seconds,
    )


def _driver_view(
    running: list[RunningQuery],
    metrics: IngestMetrics,
    readiness: tuple[bool, str],
    liveness: tuple[bool, str],
    lease: DriverLease,
) -> DriverView:
    queries = []
    for query in list(running):
        name = query.spec.name
        batch_id, seconds = query.writer.in_flight()
        queries.append(
            QueryNow(
                query=name,
                active=bool(query.handle.isActive),
                batch_in_flight=batch_id,
                in_flight_seconds=round(seconds, 1) if seconds is not None else None,
                last_batch_id=query.writer.last_batch_id,
                seconds_since_progress=metrics.seconds_since_progress(name),
                records_waiting=metrics.records_waiting(name),
            )
        )
    return DriverView(
        pid=os.getpid(),
        ready=readiness[0],
        ready_reason=readiness[1],
        alive=liveness[0],
        alive_reason=liveness[1],
        lease_heartbeat_age_seconds=round(time.time() - lease.record.heartbeat_at, 1),
        queries=queries,
    )


def _record_batch(metrics: IngestMetrics) -> Callable[[str, BatchOutcome], None]:
    def record(query_name: str, outcome: BatchOutcome) -> None:
        metrics.batch_written(
            query_name, outcome.rows_written, outcome.quarantined, outcome.duplicates
        )

    return record


def _gold(settings: Settings) -> list[GoldQuery]:
    return gold_queries() if settings.gold_enabled else []


def _shutdown_spark(spark: SparkSession) -> None:
    try:
        spark.stop()
    except Exception:
        log.exception("spark_stop_failed")
