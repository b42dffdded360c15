"""The streaming queries: what each reads, which tables it writes, how it starts.

Kafka is read once per topic by an *ingest query*. Its ``foreachBatch`` writer
appends the batch to bronze with ``txnAppId``/``txnVersion`` = (query app id,
batch id). If the driver dies after the write but before Spark commits the
batch, the restart replays the same offsets under the same batch id and Delta
skips the write: every record lands exactly once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import structlog
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from service import checkpoints
from service.config import Settings
from service.hadoop_fs import HadoopFiles
from service.schemas import BRONZE
from service.sinks.delta import append_once, ensure_table, table_transactions
from service.sources.kafka import read_topic
from service.transforms.bronze import to_bronze

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class IngestQuery:
    """One Kafka topic's ingest query and the tables it writes."""

    name: str
    topic: str
    bronze_table: str

    def tables(self) -> tuple[str, ...]:
        """Relative names of every table this query writes."""
        return (self.bronze_table,)


def ingest_queries(settings: Settings) -> list[IngestQuery]:
    """The ingest queries of this deployment, one per input topic."""
    return [
        IngestQuery("ingest_users", settings.users_topic, "bronze/users"),
        IngestQuery("ingest_sensors", settings.sensors_topic, "bronze/sensors"),
    ]


@dataclass
class BatchWriter:
    """The ``foreachBatch`` function of an ingest query; knows its app id once started."""

    query: IngestQuery
    table_uris: Mapping[str, str]
    on_rows_written: Callable[[str, int], None]
    _app_id: str | None = None
    _app_id_ready: threading.Event = field(default_factory=threading.Event)
    in_flight: threading.Event = field(default_factory=threading.Event)
    last_batch_id: int | None = None

    def bind(self, query_id: str) -> None:
        """Set the txn app id from the started query's (checkpoint-persisted) id."""
        self._app_id = checkpoints.app_id(self.query.name, query_id)
        self._app_id_ready.set()

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        if not self._app_id_ready.wait(timeout=120) or self._app_id is None:
            raise RuntimeError(f"query {self.query.name} started a batch before it was bound")
        self.in_flight.set()
        try:
            started = time.monotonic()
            bronze = to_bronze(batch).cache()
            rows = bronze.count()
            append_once(bronze, self.table_uris[self.query.bronze_table], self._app_id, batch_id)
            bronze.unpersist()
            self.on_rows_written(self.query.bronze_table, rows)
            self.last_batch_id = batch_id
            log.info(
                "batch_written",
                query=self.query.name,
                batch_id=batch_id,
                rows_in=rows,
                rows_bronze=rows,
                duration_ms=round((time.monotonic() - started) * 1000),
            )
        finally:
            self.in_flight.clear()


def prepare_tables(spark: SparkSession, settings: Settings, query: IngestQuery) -> None:
    """Refuse a checkpoint/table mismatch, then create this query's missing tables."""
    files = HadoopFiles(spark)
    checkpoint = checkpoints.read_checkpoint(files, checkpoint_uri(settings, query))
    txns = {
        settings.table_uri(t): table_transactions(spark, settings.table_uri(t))
        for t in query.tables()
    }
    checkpoints.verify_checkpoint_matches_tables(query.name, checkpoint, txns)
    ensure_table(spark, settings.table_uri(query.bronze_table), BRONZE)


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
    stream = (
        read_topic(spark, settings, query.topic)
        .writeStream.queryName(query.name)
        .option("checkpointLocation", checkpoint_uri(settings, query))
        .foreachBatch(writer)
    )
    if available_now:
        stream = stream.trigger(availableNow=True)
    else:
        stream = stream.trigger(processingTime=f"{settings.trigger_interval_seconds} seconds")
    started = stream.start()
    writer.bind(str(started.id))
    log.info("query_started", query=query.name, id=str(started.id), topic=query.topic)
    return started
