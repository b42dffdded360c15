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

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

import structlog
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.readwriter import DataStreamWriter
from pyspark.sql.types import StructType

from service import checkpoints
from service.config import Settings
from service.hadoop_fs import HadoopFiles
from service.schemas import (
    BRONZE,
    QUARANTINE,
    SENSOR_DUPLICATES,
    SILVER_SENSOR_READINGS,
    SILVER_USERS,
)
from service.sinks.delta import append_once, ensure_table, table_transactions
from service.sinks.users import merge_users_once
from service.sources.kafka import read_topic
from service.transforms.bronze import to_bronze
from service.transforms.dedup import mark_duplicates, split_marked
from service.transforms.sensors import parse_sensor_readings, to_sensor_readings
from service.transforms.users import latest_user_changes, parse_user_changes
from service.transforms.validation import split_valid_invalid, to_quarantine

log = structlog.get_logger(__name__)

QUARANTINE_TABLE = "silver/quarantine"
TABLE_SCHEMAS: dict[str, tuple[StructType, tuple[str, ...]]] = {
    "bronze/users": (BRONZE, ()),
    "bronze/sensors": (BRONZE, ()),
    QUARANTINE_TABLE: (QUARANTINE, ()),
    "silver/users": (SILVER_USERS, ()),
    "silver/sensor_readings": (SILVER_SENSOR_READINGS, ("event_date",)),
    "silver/sensor_duplicates": (SENSOR_DUPLICATES, ()),
}


@dataclass(frozen=True)
class IngestQuery:
    """One Kafka topic's ingest query and the tables it writes."""

    name: str
    topic: str
    kind: Literal["users", "sensors"]

    def tables(self) -> tuple[str, ...]:
        """Relative names of every table this query writes."""
        if self.kind == "users":
            return ("bronze/users", QUARANTINE_TABLE, "silver/users")
        return (
            "bronze/sensors",
            QUARANTINE_TABLE,
            "silver/sensor_readings",
            "silver/sensor_duplicates",
        )


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


class QueryWriter:
    """State shared by ``foreachBatch`` writers: the txn app id and the batch in flight.

    The app id is derived from the query id Spark keeps in the checkpoint, known only
    once the query has started: `bind` sets it, and a batch waits for it.
    """

    def __init__(self, query_name: str) -> None:
        self.query_name = query_name
        self._app_id: str | None = None
        self._bound = threading.Event()
        self._in_flight: int | None = None
        self.last_batch_id: int | None = None

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        """Write micro-batch ``batch_id`` (the ``foreachBatch`` function)."""
        raise NotImplementedError

    def bind(self, query_id: str) -> None:
        """Set the txn app id from the started query's (checkpoint-persisted) id."""
        self._app_id = checkpoints.app_id(self.query_name, query_id)
        self._bound.set()

    def app_id(self) -> str:
        """The txn app id, once bound."""
        if not self._bound.wait(timeout=120) or self._app_id is None:
            raise RuntimeError(f"query {self.query_name} started a batch before it was bound")
        return self._app_id

    @contextmanager
    def writing(self, batch_id: int) -> Iterator[None]:
        """Mark batch ``batch_id`` as being written for the duration of the block."""
        self._in_flight = batch_id
        try:
            yield
            self.last_batch_id = batch_id
        finally:
            self._in_flight = None

    def finish_in_flight(self, timeout: float) -> int | None:
        """Wait (up to ``timeout``) for the batch being written to end; return its id."""
        batch_id = self._in_flight
        deadline = time.monotonic() + timeout
        while batch_id is not None and self._in_flight == batch_id:
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        return batch_id


class BatchWriter(QueryWriter):
    """The ``foreachBatch`` function of an ingest query."""

    def __init__(
        self,
        query: IngestQuery,
        settings: Settings,
        on_batch: Callable[[IngestQuery, BatchOutcome], None],
    ) -> None:
        super().__init__(query.name)
        self.query = query
        self.settings = settings
        self.on_batch = on_batch

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        app_id = self.app_id()
        with self.writing(batch_id):
            started = time.monotonic()
            bronze = to_bronze(batch).persist()
            try:
                write = _write_users if self.query.kind == "users" else _write_sensors
                outcome = write(bronze, self.settings, app_id, batch_id)
            finally:
                bronze.unpersist()
            self.on_batch(self.query, outcome)
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
    append_once(bronze, settings.table_uri("bronze/users"), app_id, batch_id)
    parsed = parse_user_changes(bronze, max_payload_bytes=settings.max_payload_bytes).persist()
    try:
        rows_in, quarantined = _count_by_error(parsed)
        valid, invalid = split_valid_invalid(parsed)
        append_once(to_quarantine(invalid), settings.table_uri(QUARANTINE_TABLE), app_id, batch_id)
        merge_users_once(
            latest_user_changes(valid), settings.table_uri("silver/users"), app_id, batch_id
        )
    finally:
        parsed.unpersist()
    valid_rows = rows_in - sum(quarantined.values())
    return BatchOutcome(
        rows_in=rows_in,
        quarantined=quarantined,
        rows_written={
            "bronze/users": rows_in,
            QUARANTINE_TABLE: sum(quarantined.values()),
            "silver/users": valid_rows,
        },
    )


def _write_sensors(
    bronze: DataFrame, settings: Settings, app_id: str, batch_id: int
) -> BatchOutcome:
    append_once(bronze, settings.table_uri("bronze/sensors"), app_id, batch_id)
    parsed = parse_sensor_readings(
        bronze,
        max_payload_bytes=settings.max_payload_bytes,
        max_future_seconds=settings.max_future_seconds,
    ).persist()
    try:
        rows_in, quarantined = _count_by_error(parsed)
        valid, invalid = split_valid_invalid(parsed)
        append_once(to_quarantine(invalid), settings.table_uri(QUARANTINE_TABLE), app_id, batch_id)
        readings = to_sensor_readings(valid)
        recent = _recent_readings(bronze, settings)
        # Cached: the silver lookup and its shuffles run once for both outputs.
        marked = mark_duplicates(readings, recent, settings.dedup_horizon_seconds).persist()
        try:
            fresh, duplicates = split_marked(marked)
            duplicate_rows = duplicates.count()
            append_once(
                duplicates, settings.table_uri("silver/sensor_duplicates"), app_id, batch_id
            )
            append_once(fresh, settings.table_uri("silver/sensor_readings"), app_id, batch_id)
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
            "bronze/sensors": rows_in,
            QUARANTINE_TABLE: sum(quarantined.values()),
            "silver/sensor_readings": fresh_rows,
            "silver/sensor_duplicates": duplicate_rows,
        },
    )


def _recent_readings(bronze: DataFrame, settings: Settings) -> DataFrame:
    """silver/sensor_readings pruned to the arrivals that can be originals of this batch."""
    bounds = bronze.agg(F.min("kafka_timestamp"), F.max("kafka_timestamp")).first()
    silver = bronze.sparkSession.read.format("delta").load(
        settings.table_uri("silver/sensor_readings")
    )
    if bounds is None or bounds[0] is None:
        return silver.limit(0)
    earliest = bounds[0] - timedelta(seconds=settings.dedup_horizon_seconds)
    return silver.where(F.col("kafka_timestamp").between(F.lit(earliest), F.lit(bounds[1])))


def prepare_tables(spark: SparkSession, settings: Settings, query: IngestQuery) -> None:
    """Refuse a checkpoint/table mismatch, then create this query's missing tables."""
    files = HadoopFiles(spark)
    checkpoint = checkpoints.read_checkpoint(files, checkpoint_uri(settings, query))
    txns = {
        settings.table_uri(t): table_transactions(spark, settings.table_uri(t))
        for t in query.tables()
    }
    checkpoints.verify_checkpoint_matches_tables(query.name, checkpoint, txns)
    for table in query.tables():
        if txns[settings.table_uri(table)] is None:  # not a Delta table yet
            schema, partition_by = TABLE_SCHEMAS[table]
            ensure_table(spark, settings.table_uri(table), schema, partition_by)


def checkpoint_uri(settings: Settings, query: IngestQuery) -> str:
    """Checkpoint location of ``query``."""
    return f"{settings.checkpoint_uri}/{query.name}"


def start_ingest_query(
    spark: SparkSession,
    settings: Settings,
    query: IngestQuery,
    writer: BatchWriter,
    available_now: bool,
) -> StreamingQuery:
    """Start ``query`` reading Kafka and writing through ``writer``."""
    stream = read_topic(spark, settings, query.topic).writeStream.option(
        "checkpointLocation", checkpoint_uri(settings, query)
    )
    return start_with_writer(stream, settings, writer, available_now, topic=query.topic)


def start_with_writer(
    stream: DataStreamWriter,
    settings: Settings,
    writer: QueryWriter,
    available_now: bool,
    **context: str,
) -> StreamingQuery:
    """Start ``stream`` as the query ``writer`` writes, with the deployment's trigger."""
    stream = stream.queryName(writer.query_name).foreachBatch(writer)
    if available_now:
        stream = stream.trigger(availableNow=True)
    else:
        stream = stream.trigger(processingTime=f"{settings.trigger_interval_seconds} seconds")
    started = stream.start()
    writer.bind(str(started.id))
    log.info("query_started", query=writer.query_name, id=str(started.id), **context)
    return started
