"""The ingest queries: one per contract, reading its topic, validating, writing its tables."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from service.config import Settings
from service.contracts.model import Contract
from service.ingest.bronze import to_records
from service.ingest.modes import parse_records
from service.kafka.source import read_topic
from service.lake.tables import Table, contract_tables
from service.streaming.runner import QueryWriter, start_with_writer


@dataclass(frozen=True)
class IngestQuery:
    """The ingest query of one contract: its topic and the tables it writes."""

    contract: Contract
    # The FAIR scheduler pool of its jobs, which also decides its trigger.
    pool: ClassVar[str] = "ingest"

    @property
    def name(self) -> str:
        """The query's name (``ingest_<contract>``), also its checkpoint's."""
        return self.contract.query

    @property
    def topic(self) -> str:
        """The Kafka topic it reads."""
        return self.contract.topic

    @property
    def tables(self) -> tuple[Table, ...]:
        """Every table this query writes, bronze (its anchor) first."""
        return contract_tables(self.contract).written

    def validate(self, records: DataFrame, settings: Settings) -> DataFrame:
        """`to_records` rows with their ``error_code``/``error_detail`` and typed ``record``."""
        return parse_records(
            self.contract, records, settings.max_payload_bytes, settings.max_future_seconds
        )


def ingest_queries(settings: Settings) -> list[IngestQuery]:
    """The ingest queries of this deployment, one per contract."""
    return [IngestQuery(contract) for contract in settings.contracts]


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
