"""Prometheus metrics: the `IngestMetrics` facade, fed by a StreamingQueryListener and the writers.

Every family has the ``lakehouse_ingest_`` prefix, base units and, where it is
about a query, a ``query`` label (the query name: a handful of values). Spark's
progress events carry most numbers; what a ``foreachBatch`` writer observes
(quarantined rows by error code, rows per table, duplicates) comes from its
`BatchOutcome`. The listener runs on Spark's listener-bus thread, so it only
parses the event and updates in-memory metrics: no Spark jobs, no I/O.

Freshness: a query with an event-time watermark (gold) is complete up to its
watermark. The ingest queries have none; they are complete up to the moment
they last caught up with Kafka: the trigger start of a batch that consumed
everything the broker had (``maxOffsetsBehindLatest`` = 0, or end offset =
latest offset), or an idle event (nothing new to read). ``time() -
lakehouse_ingest_freshness_timestamp_seconds`` is therefore an upper bound of
how far the tables trail Kafka; unlike the newest record's Kafka timestamp it
does not flag a quiet topic as stale, and it needs no extra aggregation job.
A watermark moves only with events, so a watermarked query's idle events are
exported apart (``basis="idle"``: its input had nothing new): the alert counts a
gold query that idles as fresh, whatever its watermark.

Table maintenance (`service.lake.maintenance`) is reported per ``table`` by
`MaintenanceMetrics`, which `IngestMetrics` registers (``.maintenance``) and the
query writers that run it report to.
"""

from __future__ import annotations

import math
import platform
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyspark
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

import service
from service.driver.jvm import JvmSample
from service.ingest.validation import ERROR_CODES
from service.streaming.listener import JsonProgressListener

log = structlog.get_logger(__name__)

PREFIX = "lakehouse_ingest"
_BATCH_BUCKETS = (0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)
_MAINTENANCE_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
_KAFKA_LAG_STATS = ("min", "avg", "max")
_JAVA_CLASS = re.compile(r"^\s*(?:\[([A-Z][A-Z0-9_.]*)\]|([\w$.]*(?:Exception|Error)))")
_LABEL_SAFE = re.compile(r"[^A-Za-z0-9_.:\-]")

_QUERY = ("query",)
_LAG = ("query", "topic")


@dataclass(frozen=True)
class Family:
    """A metric family the service exports: its kind, name (after ``lakehouse_ingest_``),
    help text and labels. `declare` builds a table of them (`FAMILIES`, `LAG_FAMILIES`,
    `RECONCILE_FAMILIES`) as an object's attributes; `MaintenanceMetrics` builds
    `MAINTENANCE_FAMILIES` unregistered."""

    kind: type[Counter] | type[Gauge] | type[Histogram]
    name: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()

    def build(self, registry: CollectorRegistry | None) -> Any:
        """The family, registered on ``registry`` (None: unregistered)."""
        name = f"{PREFIX}_{self.name}"
        if self.kind is Histogram and self.buckets:
            return Histogram(name, self.help, self.labels, registry=registry, buckets=self.buckets)
        return self.kind(name, self.help, self.labels, registry=registry)


def declare(owner: object, families: Mapping[str, Family], registry: CollectorRegistry) -> None:
    """Build each of ``families`` on ``registry`` as ``owner``'s attribute of its key."""
    for attribute, family in families.items():
        setattr(owner, attribute, family.build(registry))


MAINTENANCE_FAMILIES = {
    "table_files": Family(
        Gauge,
        "table_files",
        "Files in a table's current Delta snapshot, counted at each maintenance check.",
        ("table",),
    ),
    "last_success": Family(
        Gauge,
        "maintenance_last_success_timestamp_seconds",
        "Unix time of a table's last successful maintenance (compaction check and VACUUM); "
        "0 = none since the driver started.",
        ("table",),
    ),
    "failures": Family(
        Counter,
        "maintenance_failures_total",
        "Maintenance runs of a table that failed (retried one interval later).",
        ("table",),
    ),
    "duration": Family(
        Histogram,
        "maintenance_duration_seconds",
        "Wall time of a table's successful maintenance run (OPTIMIZE if due, then VACUUM).",
        ("table",),
        _MAINTENANCE_BUCKETS,
    ),
}

# The families `IngestMetrics` updates, by its attribute name.
FAMILIES = {
    "build_info": Family(
        Gauge,
        "build_info",
        "Build information (always 1): service, Spark and Python versions.",
        ("version", "spark_version", "python_version"),
    ),
    "ready": Family(
        Gauge,
        "ready",
        "1 while /readyz answers 200 (every query active and progressing or idle), else 0.",
    ),
    "storage_heartbeat": Family(
        Gauge,
        "storage_heartbeat_timestamp_seconds",
        "Unix time of the last successful write to the checkpoint storage (lease renewal).",
    ),
    "trigger_interval": Family(
        Gauge,
        "trigger_interval_seconds",
        "A query's configured trigger interval (0 = as fast as possible, or available-now).",
        _QUERY,
    ),
    "query_up": Family(Gauge, "query_up", "1 while a query is active, else 0.", _QUERY),
    "terminations": Family(
        Counter,
        "query_terminations_total",
        "Query terminations by error class (none = a clean stop).",
        ("query", "error_class"),
    ),
    "last_progress": Family(
        Gauge,
        "last_progress_timestamp_seconds",
        "Unix time of a query's last start, progress or idle event (idle is alive).",
        _QUERY,
    ),
    "last_batch_id": Family(
        Gauge,
        "last_batch_id",
        "Id of a query's last completed micro-batch (the checkpoint's batch numbering).",
        _QUERY,
    ),
    "input_rows": Family(Counter, "input_rows_total", "Rows read by a query.", _QUERY),
    "input_rate": Family(
        Gauge,
        "input_rows_per_second",
        "Rate at which rows arrived for a query's last micro-batch.",
        _QUERY,
    ),
    "processed_rate": Family(
        Gauge,
        "processed_rows_per_second",
        "Rate at which a query's last micro-batch processed rows.",
        _QUERY,
    ),
    "batch_duration": Family(
        Histogram,
        "batch_duration_seconds",
        "Wall time of a micro-batch (trigger start to progress).",
        _QUERY,
        _BATCH_BUCKETS,
    ),
    "phase_seconds": Family(
        Counter,
        "trigger_phase_seconds_total",
        "Time spent in each trigger phase (Spark durationMs: addBatch, walCommit, ...).",
        ("query", "phase"),
    ),
    "group_commits": Family(
        Counter,
        "consumer_group_commits",
        "Commits of an ingest query's checkpoint offsets to INGEST_KAFKA_CONSUMER_GROUP, by "
        "result (ok, error: retried with the next batch), for Kafka's own lag tools.",
        ("query", "result"),
    ),
    "kafka_offsets_skipped": Family(
        Counter,
        "kafka_offsets_skipped_total",
        "Kafka offsets the brokers no longer had when the driver started, skipped on "
        "INGEST_KAFKA_SKIP_LOST_OFFSETS (bronze/skipped_offsets lists them).",
        ("topic",),
    ),
    "freshness": Family(
        Gauge,
        "freshness_timestamp_seconds",
        "Time up to which a query's output is complete: its event-time watermark "
        "(basis=watermark) or when it last caught up with Kafka (basis=caught_up); "
        "a watermarked query's last idle trigger, its input empty (basis=idle).",
        ("query", "basis"),
    ),
    "state_rows": Family(
        Gauge,
        "state_rows",
        "Rows held in a query's state stores (0 for stateless queries).",
        _QUERY,
    ),
    "state_memory": Family(
        Gauge, "state_memory_bytes", "Memory used by a query's state stores.", _QUERY
    ),
    "dropped_by_watermark": Family(
        Counter,
        "rows_dropped_by_watermark_total",
        "Late rows dropped by a stateful operator because they were behind the watermark.",
        _QUERY,
    ),
    "quarantined": Family(
        Counter,
        "quarantined_rows_total",
        "Records rejected into silver/quarantine, by error code.",
        ("query", "error_code"),
    ),
    "duplicates": Family(
        Counter,
        "duplicates_dropped_total",
        "Events dropped as duplicates of an id seen within the dedup horizon.",
        _QUERY,
    ),
    "rows_written": Family(
        Counter,
        "table_rows_written_total",
        "Rows appended or merged into a table.",
        ("query", "table"),
    ),
}


# The families of `LagMetrics`.
LAG_FAMILIES = {
    **{
        f"kafka_lag_{stat}": Family(
            Gauge,
            f"kafka_{stat}_offsets_behind_latest",
            f"{stat.capitalize()} over partitions of records in Kafka not yet committed to "
            "the lake (broker end offset minus the checkpoint's), polled every "
            "INGEST_LAG_POLL_SECONDS.",
            _LAG,
        )
        for stat in _KAFKA_LAG_STATS
    },
    "kafka_lag_total": Family(
        Gauge,
        "kafka_offsets_behind_latest",
        "Records in Kafka not yet committed to the lake, summed over a topic's partitions.",
        _LAG,
    ),
    "kafka_retention_headroom": Family(
        Gauge,
        "kafka_retention_headroom_records",
        "Records retention can delete before it deletes one the query has not read: the "
        "next offset to read minus the log start, least over the partitions with records "
        "waiting (negative: deleted unread).",
        _LAG,
    ),
    "kafka_lag_polled_at": Family(
        Gauge,
        "kafka_lag_polled_timestamp_seconds",
        "When a query's Kafka lag was last polled successfully (the poller's start "
        "until its first success).",
        _QUERY,
    ),
}

# The families of `ReconcileMetrics`.
RECONCILE_FAMILIES = {
    "reconcile_checks": Family(
        Counter,
        "reconcile_checks_total",
        "The driver's periodic reconcile checks by result: ok, broken (an invariant does "
        "not hold) or error (the lake or a checkpoint could not be read; retried).",
        ("result",),
    ),
    "reconcile_problems": Family(
        Gauge,
        "reconcile_problems",
        "Invariant violations the driver's periodic reconcile found since it started.",
    ),
    "reconcile_records": Family(
        Counter,
        "reconcile_records_checked_total",
        "Bronze records the driver's periodic reconcile checked, per table.",
        ("table",),
    ),
    "reconcile_last_check": Family(
        Gauge,
        "reconcile_last_check_timestamp_seconds",
        "Unix time the driver's last periodic reconcile check completed (the checks' "
        "start until the first completes; 0: checks off).",
    ),
    "reconcile_duration": Family(
        Gauge,
        "reconcile_duration_seconds",
        "Wall time of the driver's last periodic reconcile check.",
    ),
}


class MaintenanceMetrics(Collector):
    """Table maintenance families, per ``table``: a collector any registry can expose.

    Created unregistered; `IngestMetrics` registers its own.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        families = {k: f.build(None) for k, f in MAINTENANCE_FAMILIES.items()}
        self.table_files: Gauge = families["table_files"]
        self.last_success: Gauge = families["last_success"]
        self.failures: Counter = families["failures"]
        self.duration: Histogram = families["duration"]
        self._families = (self.table_files, self.last_success, self.failures, self.duration)

    def collect(self) -> Iterator[Metric]:
        for family in self._families:
            yield from family.collect()

    def describe(self) -> Iterator[Metric]:
        for family in self._families:
            yield from family.describe()

    def tables_declared(self, tables: Iterable[str]) -> None:
        """Create the failure count and last success of ``tables`` at 0, for the alerts."""
        for table in tables:
            self.failures.labels(table)
            self.last_success.labels(table)

    def table_files_counted(self, table: str, files: int) -> None:
        """Record that ``table``'s current snapshot has ``files`` files."""
        self.table_files.labels(table).set(files)

    def maintenance_succeeded(self, table: str, duration_seconds: float) -> None:
        """Record a successful maintenance run of ``table`` that took ``duration_seconds``."""
        self.last_success.labels(table).set(self._clock())
        self.duration.labels(table).observe(max(0.0, duration_seconds))

    def maintenance_failed(self, table: str) -> None:
        """Record a failed maintenance run of ``table``."""
        self.failures.labels(table).inc()


class JvmMetrics(Collector):
    """The driver JVM's families and its executors, from its latest sample
    (`service.driver.jvm`): nothing is read from the JVM at scrape time.

    The JVM's families are absent until the first sample. The executors are exported from
    the start, 0 until a sample counts them, beside the count the configuration asks for
    (`executors_expected`): a driver whose executors never register fires the alert.
    """

    def __init__(self) -> None:
        self._sample: JvmSample | None = None
        self._executors = 0
        self._executors_expected: int | None = None

    def sampled(self, sample: JvmSample) -> None:
        """Keep ``sample`` for the next scrapes."""
        self._sample = sample

    def executors_counted(self, executors: int) -> None:
        """Record that ``executors`` executors are registered with the driver."""
        self._executors = executors

    def executors_expected(self, executors: int | None) -> None:
        """Record how many executors the configuration asks for (None: it does not say)."""
        self._executors_expected = executors

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            f"{PREFIX}_executors",
            "Executors registered with the driver (0 in local mode, where the driver runs "
            "the tasks, and until the first sample).",
            value=self._executors,
        )
        expected = self._executors_expected
        if expected is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_executors_expected",
                "Executors the configuration asks for (INGEST_SPARK_EXECUTOR_INSTANCES, or "
                "INGEST_SPARK_CORES_MAX // INGEST_SPARK_EXECUTOR_CORES on a standalone "
                "master; 0 in local mode).",
                value=expected,
            )
        sample = self._sample
        if sample is None:
            return
        used = GaugeMetricFamily(
            f"{PREFIX}_jvm_memory_used_bytes", "Driver JVM memory in use.", labels=["area"]
        )
        used.add_metric(["heap"], sample.heap_used)
        used.add_metric(["nonheap"], sample.nonheap_used)
        yield used
        if sample.heap_max > 0:
            limit = GaugeMetricFamily(
                f"{PREFIX}_jvm_memory_max_bytes",
                "Driver JVM heap maximum (-Xmx, from INGEST_SPARK_DRIVER_MEMORY).",
                labels=["area"],
            )
            limit.add_metric(["heap"], sample.heap_max)
            yield limit
        gc = CounterMetricFamily(
            f"{PREFIX}_jvm_gc_collection_seconds",
            "Time the driver JVM's garbage collectors spent collecting.",
            labels=["gc"],
        )
        for name, seconds in sorted(sample.gc_seconds.items()):
            gc.add_metric([name], seconds)
        yield gc
        threads = GaugeMetricFamily(
            f"{PREFIX}_jvm_threads", "Driver JVM threads.", labels=["state"]
        )
        threads.add_metric(["live"], sample.threads)
        threads.add_metric(["daemon"], sample.daemon_threads)
        yield threads

    def describe(self) -> Iterator[Metric]:
        return iter(())


class LagMetrics:
    """Each query's polled Kafka lag and retention headroom: the sink of
    `service.driver.lag.LagPoller`. Each family of `LAG_FAMILIES` is the attribute of its key."""

    kafka_lag_min: Gauge
    kafka_lag_avg: Gauge
    kafka_lag_max: Gauge
    kafka_lag_total: Gauge
    kafka_retention_headroom: Gauge
    kafka_lag_polled_at: Gauge

    def __init__(self, registry: CollectorRegistry, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._records_waiting: dict[str, int] = {}
        declare(self, LAG_FAMILIES, registry)

    def records_waiting(self, query: str) -> int | None:
        """A query's last polled Kafka lag, summed over partitions (None: not polled)."""
        with self._lock:
            return self._records_waiting.get(query)

    def kafka_lag_declared(self, query: str) -> None:
        """Start ``query``'s polled time at now, so polls that never succeed age it."""
        self.kafka_lag_polled_at.labels(query).set(self._clock())

    def kafka_lag_polled(
        self, query: str, topic: str, lags: Sequence[int], headroom: int | None = None
    ) -> None:
        """Record a query's polled per-partition lag and its retention headroom
        (`service.driver.lag.LagPoller`)."""
        if headroom is not None:
            self.kafka_retention_headroom.labels(query, topic).set(headroom)
        for gauge, value in (
            (self.kafka_lag_min, min(lags)),
            (self.kafka_lag_avg, sum(lags) / len(lags)),
            (self.kafka_lag_max, max(lags)),
        ):
            gauge.labels(query, topic).set(value)
        self.kafka_lag_total.labels(query, topic).set(sum(lags))
        with self._lock:
            self._records_waiting[query] = sum(lags)
        self.kafka_lag_polled_at.labels(query).set(self._clock())


class ReconcileMetrics:
    """The driver's periodic reconcile checks: the sink of
    `service.driver.lake_audit.LakeAuditor`. Each family of `RECONCILE_FAMILIES` is the
    attribute of its key."""

    reconcile_checks: Counter
    reconcile_problems: Gauge
    reconcile_records: Counter
    reconcile_last_check: Gauge
    reconcile_duration: Gauge

    def __init__(self, registry: CollectorRegistry, clock: Callable[[], float]) -> None:
        self._clock = clock
        declare(self, RECONCILE_FAMILIES, registry)
        for result in ("ok", "broken", "error"):
            self.reconcile_checks.labels(result)

    def reconcile_checked(
        self, records: Mapping[str, int], problems: int, duration_seconds: float
    ) -> None:
        """Record a periodic reconcile check (`service.driver.lake_audit.LakeAuditor`)."""
        self.reconcile_checks.labels("broken" if problems else "ok").inc()
        self.reconcile_problems.inc(problems)
        for table, count in records.items():
            self.reconcile_records.labels(table).inc(count)
        self.reconcile_last_check.set(self._clock())
        self.reconcile_duration.set(max(0.0, duration_seconds))

    def reconcile_declared(self) -> None:
        """Start the last-check time at now, so a first check that never completes ages it."""
        self.reconcile_last_check.set(self._clock())

    def reconcile_failed(self) -> None:
        """Record a periodic reconcile check that could not read the lake or a checkpoint."""
        self.reconcile_checks.labels("error").inc()


class IngestMetrics:
    """The service's metric families on ``registry``, updated through intent-named methods:
    each family of `FAMILIES` is the attribute of its key; ``lag``, ``reconcile``,
    ``maintenance`` and ``jvm`` hold the others, registered on ``registry`` too."""

    build_info: Gauge
    ready: Gauge
    storage_heartbeat: Gauge
    trigger_interval: Gauge
    query_up: Gauge
    terminations: Counter
    last_progress: Gauge
    last_batch_id: Gauge
    input_rows: Counter
    input_rate: Gauge
    processed_rate: Gauge
    batch_duration: Histogram
    phase_seconds: Counter
    group_commits: Counter
    kafka_offsets_skipped: Counter
    freshness: Gauge
    state_rows: Gauge
    state_memory: Gauge
    dropped_by_watermark: Counter
    quarantined: Counter
    duplicates: Counter
    rows_written: Counter

    def __init__(self, registry: CollectorRegistry, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._last_event: dict[str, float] = {}
        self._caught_up: dict[str, float] = {}
        self.maintenance = MaintenanceMetrics(clock)
        registry.register(self.maintenance)
        self.jvm = JvmMetrics()
        registry.register(self.jvm)
        self.lag = LagMetrics(registry, clock)
        self.reconcile = ReconcileMetrics(registry, clock)
        ProcessCollector(namespace=PREFIX, registry=registry)
        declare(self, FAMILIES, registry)
        self.build_info.labels(service.__version__, pyspark.__version__, _python_version()).set(1)

    # -- lifecycle ---------------------------------------------------------------------------

    def query_declared(
        self, query: str, tables: Iterable[str] = (), trigger_interval_seconds: float | None = None
    ) -> None:
        """Create ``query``'s series at zero, so rates and alerts work from its first row."""
        tables = tuple(tables)
        if trigger_interval_seconds is not None:
            self.trigger_interval.labels(query).set(trigger_interval_seconds)
        for family in (
            self.query_up,
            self.input_rows,
            self.duplicates,
            self.dropped_by_watermark,
            self.state_rows,
            self.state_memory,
        ):
            family.labels(query)
        self.terminations.labels(query, "none")
        for code in ERROR_CODES:
            self.quarantined.labels(query, code)
        for table in tables:
            self.rows_written.labels(query, table)
        self.maintenance.tables_declared(tables)

    def query_started(self, query: str) -> None:
        """Record that ``query`` is running."""
        self.query_declared(query)
        self.query_up.labels(query).set(1)
        self._alive(query)

    def query_idle(self, query: str, watermarked: bool) -> None:
        """Record that ``query`` is alive with nothing new to read: caught up with Kafka,
        or for a ``watermarked`` query (whose watermark stands still) its input empty."""
        now = self._alive(query)
        if watermarked:
            self.freshness.labels(query, "idle").set(now)
        else:
            self._caught_up_at(query, now)

    def _caught_up_at(self, query: str, at: float) -> None:
        with self._lock:
            self._caught_up[query] = at
        self.freshness.labels(query, "caught_up").set(at)

    def caught_up(self, query: str) -> float | None:
        """When ``query`` last read all Kafka had (unix seconds; None: not known)."""
        with self._lock:
            return self._caught_up.get(query)

    def freshness_seeded(self, query: str, at: float) -> None:
        """Start ``query``'s caught-up freshness at ``at`` (persisted by an earlier driver),
        unless it caught up since."""
        with self._lock:
            if query in self._caught_up:
                return
        self._caught_up_at(query, at)

    def query_terminated(self, query: str, error_class: str) -> None:
        """Record that ``query`` stopped, cleanly (``none``) or with ``error_class``."""
        self.query_up.labels(query).set(0)
        self.terminations.labels(query, error_class).inc()

    def consumer_group_declared(self, query: str) -> None:
        """Create ``query``'s consumer-group commit counts at zero."""
        for result in ("ok", "error"):
            self.group_commits.labels(query, result)

    def consumer_group_committed(self, query: str, ok: bool) -> None:
        """Record a commit of ``query``'s checkpoint offsets to the consumer group."""
        self.group_commits.labels(query, "ok" if ok else "error").inc()

    def offsets_skipped(self, topic: str, count: int) -> None:
        """Record ``count`` offsets of ``topic`` skipped at start (`service.kafka.lost_offsets`)."""
        self.kafka_offsets_skipped.labels(topic).inc(count)

    def watch_storage(self, last_write: Callable[[], float]) -> None:
        """Report ``last_write()`` (unix time of the last successful storage write) at scrape."""
        self.storage_heartbeat.set_function(last_write)

    def watch_readiness(self, readiness: Callable[[], tuple[bool, str]]) -> None:
        """Report ``readiness()`` (the /readyz verdict) as a 0/1 gauge at scrape."""
        self.ready.set_function(lambda: 1.0 if readiness()[0] else 0.0)

    def seconds_since_progress(self, query: str) -> float | None:
        """Seconds since ``query``'s last start, progress or idle event; None if never seen."""
        with self._lock:
            last = self._last_event.get(query)
        return None if last is None else max(0.0, self._clock() - last)

    def _alive(self, query: str) -> float:
        now = self._clock()
        with self._lock:
            self._last_event[query] = now
        self.last_progress.labels(query).set(now)
        return now

    # -- micro-batches -----------------------------------------------------------------------

    def progress_reported(self, progress: Any) -> None:
        """Record one micro-batch's `StreamingQueryProgress` (Spark's listener event)."""
        name = progress.name or str(progress.id)
        self._alive(name)
        self.last_batch_id.labels(name).set(progress.batchId)
        self.input_rows.labels(name).inc(max(0, int(progress.numInputRows or 0)))
        for gauge, value in (
            (self.input_rate, progress.inputRowsPerSecond),
            (self.processed_rate, progress.processedRowsPerSecond),
        ):
            if (rate := _finite(value)) is not None:
                gauge.labels(name).set(rate)
        self.batch_duration.labels(name).observe(max(0, progress.batchDuration) / 1000.0)
        for phase, millis in (progress.durationMs or {}).items():
            if (ms := _finite(millis)) is not None and ms >= 0:
                self.phase_seconds.labels(name, _label(phase)).inc(ms / 1000.0)
        caught_up = bool(progress.sources)
        for source in progress.sources:
            caught_up = _read_all(source) and caught_up
        rows, memory, dropped = state_totals(progress)
        self.state_rows.labels(name).set(rows)
        self.state_memory.labels(name).set(memory)
        self.dropped_by_watermark.labels(name).inc(dropped)
        watermark = _epoch_seconds((progress.eventTime or {}).get("watermark"))
        if watermark is not None:
            if watermark > 0:  # 0 = no event seen yet
                self.freshness.labels(name, "watermark").set(watermark)
        elif caught_up and (started := _epoch_seconds(progress.timestamp)) is not None:
            self._caught_up_at(name, started)

    def batch_written(
        self,
        query: str,
        rows_written: Mapping[str, int],
        quarantined: Mapping[str, int],
        duplicates: int,
    ) -> None:
        """Record what one ingest micro-batch wrote (rows per table), quarantined and dropped."""
        for table, rows in rows_written.items():
            self.rows_written.labels(query, table).inc(rows)
        for code, rows in quarantined.items():
            self.quarantined.labels(query, code).inc(rows)
        self.duplicates.labels(query).inc(duplicates)


class MetricsListener(JsonProgressListener):
    """Feed `IngestMetrics` from query events; cheap updates only, never blocks the query."""

    def __init__(self, metrics: IngestMetrics) -> None:
        self._metrics = metrics
        self._names: dict[str, str] = {}
        self._watermarked: set[str] = set()

    def _name(self, query_id: Any) -> str:
        return self._names.get(str(query_id), str(query_id))

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark's callback names
        name = event.name or str(event.id)
        self._names[str(event.id)] = name
        self._metrics.query_started(name)

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802
        progress = event.progress
        name = progress.name or str(progress.id)
        self._names.setdefault(str(progress.id), name)
        if "watermark" in (progress.eventTime or {}):
            self._watermarked.add(name)
        try:
            self._metrics.progress_reported(progress)
            state_rows, state_memory, dropped = state_totals(progress)
        except (TypeError, ValueError, KeyError, AttributeError):
            # A malformed event must not fail Spark's listener bus; say so, and go on.
            log.exception("progress_metrics_failed", query=name, batch_id=progress.batchId)
            return
        # One line per micro-batch and query: what `jq` answers "is state growing?" from.
        log.info(
            "query_progress",
            query=name,
            batch_id=progress.batchId,
            input_rows=progress.numInputRows,
            batch_duration_ms=progress.batchDuration,
            duration_ms=dict(progress.durationMs or {}),
            watermark=(progress.eventTime or {}).get("watermark"),
            event_time_max=(progress.eventTime or {}).get("max"),
            state_rows=state_rows,
            state_memory_bytes=state_memory,
            dropped_by_watermark=dropped,
            sources=[dict(s.metrics or {}) for s in progress.sources],
        )

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        name = self._name(event.id)
        self._metrics.query_idle(name, watermarked=name in self._watermarked)

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        name = self._name(event.id)
        error_class = termination_error_class(event.exception, event.errorClassOnException)
        self._metrics.query_terminated(name, error_class)
        if event.exception:
            message, _, stack = str(event.exception).partition("\n")
            log.error(
                "query_terminated",
                query=name,
                error_class=error_class,
                error=message,
                stack_trace=stack.splitlines(),
            )
        else:
            log.info("query_terminated", query=name)


def _read_all(source: Any) -> bool:
    """Whether a progress event's source read all it had (its lag is polled apart:
    `LagMetrics.kafka_lag_polled`)."""
    metrics: Mapping[str, str] = source.metrics or {}
    behind = _finite(metrics.get("maxOffsetsBehindLatest"))
    if behind is not None:
        return behind == 0
    latest = source.latestOffset
    return latest not in (None, "None", "null") and latest == source.endOffset


def state_totals(progress: Any) -> tuple[int, int, int]:
    """State rows, state memory bytes and rows dropped by the watermark, over all operators."""
    rows = memory = dropped = 0
    for operator in progress.stateOperators:
        rows += max(0, int(operator.numRowsTotal))
        memory += max(0, int(operator.memoryUsedBytes))
        dropped += max(0, int(operator.numRowsDroppedByWatermark))
    return rows, memory, dropped


def termination_error_class(exception: str | None, error_class: str | None) -> str:
    """A low-cardinality label for why a query ended: Spark's error class, else the exception."""
    if not exception:
        return "none"
    if error_class:
        return _label(error_class)
    match = _JAVA_CLASS.match(exception)
    if match is None:
        return "unknown"
    return _label((match.group(1) or match.group(2)).rsplit(".", 1)[-1])


def _label(text: str) -> str:
    return _LABEL_SAFE.sub("_", text)[:100]


def _finite(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _epoch_seconds(timestamp: str | None) -> float | None:
    """Unix seconds of Spark's ISO-8601 UTC timestamps (``2024-05-01T12:00:00.000Z``)."""
    if not timestamp:
        return None
    try:
        return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _python_version() -> str:
    return platform.python_version()
