"""The ingest queries: what each reads, which tables it writes, and how a batch is written.

Kafka is read once per topic by an *ingest query*. Its ``foreachBatch`` writer
takes the micro-batch, makes the bronze rows, and from those same rows (cached,
so bronze and silver see identical records) validates, quarantines, dedups and
writes silver. Every table write carries Delta's ``txnAppId``/``txnVersion`` =
(query app id, batch id). If the driver dies anywhere inside a batch, the
restart replays the same offsets under the same batch id: tables that already
hold that batch skip it, the others apply it, so every record lands exactly
once in every table. Each table receives a commit every batch (possibly empty),
which is what lets `service.checkpoints` prove a table and its checkpoint agree.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

import structlog
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from service.config import Settings
from service.queries import QueryWriter, start_with_writer
from service.sinks.delta import append_once
from service.sinks.users import merge_users_once
from service.sources.kafka import read_topic
from service.tables import (
    BRONZE_SENSORS,
    BRONZE_USERS,
    QUARANTINE_TABLE,
    SENSOR_DUPLICATES_TABLE,
    SENSOR_READINGS,
    USERS,
    Table,
)
from service.transforms.bronze import to_bronze
from service.transforms.dedup import mark_duplicates, split_marked
from service.transforms.sensors import parse_sensor_readings, to_sensor_readings
from service.transforms.users import latest_user_changes, parse_user_changes
from service.transforms.validation import split_valid_invalid, to_quarantine

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class IngestQuery:
    """One Kafka topic's ingest query and the tables it writes."""

    name: str
    topic: str
    kind: Literal["users", "sensors"]

    @property
    def tables(self) -> tuple[Table, ...]:
        """Every table this query writes."""
        if self.kind == "users":
            return (BRONZE_USERS, QUARANTINE_TABLE, USERS)
        return (BRONZE_SENSORS, QUARANTINE_TABLE, SENSOR_READINGS, SENSOR_DUPLICATES_TABLE)


def ingest_queries(settings: Settings) -> list[IngestQuery]:
    """The ingest queries of this deployment, one per input topic."""
    return [
        IngestQuery("ingest_users", settings.users_topic, "users"),
        IngestQuery("ingest_sensors", settings.sensors_topic, "sensors"),
    ]


@dataclass
class BatchOutcome:
    """What one micro-batch wrote, for the summary log line and the metrics."""

    rows_in: int = 0
    quarantined: dict[str, int] = field(default_factory=dict)
    rows_written: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0


class BatchWriter(QueryWriter):
    """The ``foreachBatch`` function of an ingest query."""

    def __init__(
        self,
        query: IngestQuery,
        settings: Settings,
        on_batch: Callable[[str, BatchOutcome], None],
    ) -> None:
        super().__init__(query.name)
        self.query = query
        self.settings = settings
        self.on_batch = on_batch

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        app_id = self.app_id(batch_id)
        with self.writing(batch_id):
            started = time.monotonic()
            bronze = to_bronze(batch).persist()
            try:
                write = _write_users if self.query.kind == "users" else _write_sensors
                outcome = write(bronze, self.settings, app_id, batch_id)
            finally:
                bronze.unpersist()
            self.on_batch(self.query.name, outcome)
            log.info(
                "batch_written",
                query=self.query.name,
                batch_id=batch_id,
                rows_in=outcome.rows_in,
                quarantined=sum(outcome.quarantined.values()),
                duplicates=outcome.duplicates,
                rows_out=outcome.rows_written,
                duration_ms=round((time.monotonic() - started) * 1000),
            )


def _count_by_error(parsed: DataFrame) -> tuple[int, dict[str, int]]:
    """Rows in, and rejected rows per error code, in one pass over the cached batch."""
    counts = {
        r["error_code"]: int(r["count"]) for r in parsed.groupBy("error_code").count().collect()
    }
    return sum(counts.values()), {k: v for k, v in counts.items() if k is not None}


def _write_users(bronze: DataFrame, settings: Settings, app_id: str, batch_id: int) -> BatchOutcome:
    append_once(bronze, BRONZE_USERS.uri(settings.storage_uri), app_id, batch_id)
    parsed = parse_user_changes(bronze, max_payload_bytes=settings.max_payload_bytes).persist()
    try:
        rows_in, quarantined = _count_by_error(parsed)
        valid, invalid = split_valid_invalid(parsed)
        append_once(
            to_quarantine(invalid), QUARANTINE_TABLE.uri(settings.storage_uri), app_id, batch_id
        )
        merge_users_once(
            latest_user_changes(valid), USERS.uri(settings.storage_uri), app_id, batch_id
        )
    finally:
        parsed.unpersist()
    valid_rows = rows_in - sum(quarantined.values())
    return BatchOutcome(
        rows_in=rows_in,
        quarantined=quarantined,
        rows_written={
            BRONZE_USERS.name: rows_in,
            QUARANTINE_TABLE.name: sum(quarantined.values()),
            USERS.name: valid_rows,
        },
    )


def _write_sensors(
    bronze: DataFrame, settings: Settings, app_id: str, batch_id: int
) -> BatchOutcome:
    append_once(bronze, BRONZE_SENSORS.uri(settings.storage_uri), app_id, batch_id)
    parsed = parse_sensor_readings(
        bronze,
        max_payload_bytes=settings.max_payload_bytes,
        max_future_seconds=settings.max_future_seconds,
    ).persist()
    try:
        rows_in, quarantined = _count_by_error(parsed)
        valid, invalid = split_valid_invalid(parsed)
        append_once(
            to_quarantine(invalid), QUARANTINE_TABLE.uri(settings.storage_uri), app_id, batch_id
        )
        readings = to_sensor_readings(valid)
        recent = _recent_readings(bronze, settings)
        # Cached: the silver lookup and its shuffles run once for both outputs.
        marked = mark_duplicates(readings, recent, settings.dedup_horizon_seconds).persist()
        try:
            fresh, duplicates = split_marked(marked)
            duplicate_rows = duplicates.count()
            append_once(
                duplicates, SENSOR_DUPLICATES_TABLE.uri(settings.storage_uri), app_id, batch_id
            )
            append_once(fresh, SENSOR_READINGS.uri(settings.storage_uri), app_id, batch_id)
        finally:
            marked.unpersist()
    finally:
        parsed.unpersist()
    fresh_rows = rows_in - sum(quarantined.values()) - duplicate_rows
    return BatchOutcome(
        rows_in=rows_in,
        quarantined=quarantined,
        duplicates=duplicate_rows,
        rows_written={
            BRONZE_SENSORS.name: rows_in,
            QUARANTINE_TABLE.name: sum(quarantined.values()),
            SENSOR_READINGS.name: fresh_rows,
            SENSOR_DUPLICATES_TABLE.name: duplicate_rows,
        },
    )


def _recent_readings(bronze: DataFrame, settings: Settings) -> DataFrame:
    """silver/sensor_readings pruned to the arrivals that can be originals of this batch."""
    bounds = bronze.agg(F.min("kafka_timestamp"), F.max("kafka_timestamp")).first()
    silver = bronze.sparkSession.read.format("delta").load(
        SENSOR_READINGS.uri(settings.storage_uri)
    )
    if bounds is None or bounds[0] is None:
        return silver.limit(0)
    earliest = bounds[0] - timedelta(seconds=settings.dedup_horizon_seconds)
    return silver.where(F.col("kafka_timestamp").between(F.lit(earliest), F.lit(bounds[1])))


def start_ingest_query(
    spark: SparkSession,
    settings: Settings,
    query: IngestQuery,
    writer: BatchWriter,
    available_now: bool,
) -> StreamingQuery:
    """Start ``query`` reading Kafka and writing through ``writer``."""
    stream = read_topic(spark, settings, query.topic).writeStream
    return start_with_writer(stream, settings, writer, available_now, topic=query.topic)
