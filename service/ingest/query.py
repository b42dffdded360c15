"""The ingest queries: one per Kafka topic, what each reads and validates, the tables it writes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from service.config import Settings
from service.ingest.bronze import to_records
from service.ingest.sensors import parse_sensor_readings
from service.ingest.users import parse_user_changes
from service.kafka.source import read_topic
from service.lake.tables import (
    BRONZE_SENSORS,
    BRONZE_USERS,
    OFFSET_GAPS_TABLE,
    QUARANTINE_TABLE,
    SENSOR_DUPLICATES_TABLE,
    SENSOR_READINGS,
    USERS,
    Table,
)
from service.streaming.queries import QueryWriter, start_with_writer


@dataclass(frozen=True)
class IngestQuery:
    """One Kafka topic's ingest query and the tables it writes."""

    name: str
    topic: str
    kind: Literal["users", "sensors"]
    # The FAIR scheduler pool of its jobs, which also decides its trigger.
    pool: ClassVar[str] = "ingest"

    @property
    def tables(self) -> tuple[Table, ...]:
        """Every table this query writes."""
        if self.kind == "users":
            return (BRONZE_USERS, QUARANTINE_TABLE, USERS, OFFSET_GAPS_TABLE)
        return (
            BRONZE_SENSORS,
            QUARANTINE_TABLE,
            SENSOR_READINGS,
            SENSOR_DUPLICATES_TABLE,
            OFFSET_GAPS_TABLE,
        )

    def validate(self, records: DataFrame, settings: Settings) -> DataFrame:
        """`to_records` rows with their ``error_code``/``error_detail`` and parsed payload."""
        if self.kind == "users":
            return parse_user_changes(records, max_payload_bytes=settings.max_payload_bytes)
        return parse_sensor_readings(
            records,
            max_payload_bytes=settings.max_payload_bytes,
            max_future_seconds=settings.max_future_seconds,
        )


def ingest_queries(settings: Settings) -> list[IngestQuery]:
    """The ingest queries of this deployment, one per input topic."""
    return [
        IngestQuery("ingest_users", settings.users_topic, "users"),
        IngestQuery("ingest_sensors", settings.sensors_topic, "sensors"),
    ]


def ingest_stream(
    spark: SparkSession, settings: Settings, query: IngestQuery, skip_lost: bool
) -> DataFrame:
    """The validated streaming DataFrame of ``query`` (``skip_lost``: past offsets the
    brokers no longer have, see `service.kafka.lost_offsets`).

    Building it costs about 1.7 s of py4j calls and plan analysis at a driver's start
    (the validation rules are ~1,000 expression nodes), independent of any table:
    the driver builds it while it creates the missing tables (`service.driver.app`).
    """
    records = to_records(read_topic(spark, settings, query.topic, skip_lost))
    return query.validate(records, settings)


def start_ingest_query(
    spark: SparkSession,
    settings: Settings,
    query: IngestQuery,
    validated: DataFrame,
    writer: QueryWriter,
    available_now: bool,
) -> StreamingQuery:
    """Start ``query`` writing its ``validated`` stream (`ingest_stream`) through ``writer``."""
    return start_with_writer(
        spark,
        validated.writeStream,
        settings,
        writer,
        available_now,
        query.pool,
        topic=query.topic,
    )
