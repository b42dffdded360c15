"""Prometheus metrics, fed by a StreamingQueryListener and by the batch writers."""

from __future__ import annotations

import time
from typing import Any

import pyspark
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from pyspark.sql.streaming.listener import StreamingQueryListener

import service
from service.pipeline import BatchOutcome, IngestQuery

log = structlog.get_logger(__name__)

PREFIX = "lakehouse_ingest"
_BATCH_BUCKETS = (0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)


class IngestMetrics:
    """The service's metric families, registered on ``registry``; intent-named updates."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.build_info = Gauge(
            f"{PREFIX}_build_info",
            "Build information; always 1.",
            ["version", "spark_version"],
            registry=registry,
        )
        self.build_info.labels(service.__version__, pyspark.__version__).set(1)
        self.input_rows = Counter(
            f"{PREFIX}_input_rows_total", "Rows read by a query.", ["query"], registry=registry
        )
        self.batch_duration = Histogram(
            f"{PREFIX}_batch_duration_seconds",
            "Wall time of a micro-batch.",
            ["query"],
            buckets=_BATCH_BUCKETS,
            registry=registry,
        )
        self.query_up = Gauge(
            f"{PREFIX}_query_up", "1 while a query is active, else 0.", ["query"], registry=registry
        )
        self.last_progress = Gauge(
            f"{PREFIX}_last_progress_timestamp_seconds",
            "Unix time of a query's last progress or idle event.",
            ["query"],
            registry=registry,
        )
        self.quarantined = Counter(
            f"{PREFIX}_quarantined_rows_total",
            "Records rejected into silver/quarantine, by input and error code.",
            ["input", "error_code"],
            registry=registry,
        )
        self.duplicates = Counter(
            f"{PREFIX}_duplicates_dropped_total",
            "Readings dropped as duplicates of an event id seen within the dedup horizon.",
            ["query"],
            registry=registry,
        )
        self.rows_written = Counter(
            f"{PREFIX}_table_rows_written_total",
            "Rows appended or merged into a table.",
            ["table"],
            registry=registry,
        )

    def query_started(self, query: str) -> None:
        """Record that ``query`` is running."""
        self.query_up.labels(query).set(1)
        self.last_progress.labels(query).set(time.time())

    def batch_completed(self, query: str, input_rows: int, duration_seconds: float) -> None:
        """Record one finished micro-batch of ``query``."""
        self.input_rows.labels(query).inc(input_rows)
        self.batch_duration.labels(query).observe(duration_seconds)
        self.last_progress.labels(query).set(time.time())

    def query_idle(self, query: str) -> None:
        """Record that ``query`` is alive with nothing to do."""
        self.last_progress.labels(query).set(time.time())

    def query_terminated(self, query: str) -> None:
        """Record that ``query`` stopped."""
        self.query_up.labels(query).set(0)

    def batch_written(self, query: IngestQuery, outcome: BatchOutcome) -> None:
        """Record what one ingest micro-batch wrote, quarantined and dropped."""
        for table, rows in outcome.rows_written.items():
            self.rows_written.labels(table).inc(rows)
        for code, rows in outcome.quarantined.items():
            self.quarantined.labels(query.kind, code).inc(rows)
        self.duplicates.labels(query.name).inc(outcome.duplicates)


class MetricsListener(StreamingQueryListener):
    """Feed `IngestMetrics` from query events; never blocks the query."""

    def __init__(self, metrics: IngestMetrics) -> None:
        self._metrics = metrics
        self._names: dict[str, str] = {}

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark's callback names
        name = event.name or str(event.id)
        self._names[str(event.id)] = name
        self._metrics.query_started(name)

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802
        progress = event.progress
        name = progress.name or str(progress.id)
        duration = progress.batchDuration / 1000.0
        self._metrics.batch_completed(name, int(progress.numInputRows), duration)
        log.info(
            "query_progress",
            query=name,
            batch_id=progress.batchId,
            input_rows=progress.numInputRows,
            input_rows_per_second=round(progress.inputRowsPerSecond, 1),
            processed_rows_per_second=round(progress.processedRowsPerSecond, 1),
            batch_duration_ms=progress.batchDuration,
        )

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        self._metrics.query_idle(self._names.get(str(event.id), str(event.id)))

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        name = self._names.get(str(event.id), str(event.id))
        self._metrics.query_terminated(name)
        if event.exception:
            log.error("query_terminated", query=name, error=event.exception)
        else:
            log.info("query_terminated", query=name)
