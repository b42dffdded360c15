"""The ingest queries: one per contract, reading its topic, validating, writing its tables."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import StructType

from service.config import Settings
from service.contracts.model import Contract
from service.ingest.bronze import to_records
from service.ingest.modes import Validation, parse_records
from service.ingest.recipe import Recipe
from service.kafka.source import read_topic
from service.lake.schemas import INGESTED_AT
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

    def validation(self, settings: Settings) -> Validation:
        """The validation of its records in two steps (`Validation`)."""
        return Validation.of(self.contract, settings.max_payload_bytes, settings.max_future_seconds)


def ingest_queries(settings: Settings) -> list[IngestQuery]:
    """The ingest queries of this deployment, one per contract."""
    return [IngestQuery(contract) for contract in settings.contracts]


@dataclass(frozen=True)
class IngestStream:
    """An ingest query's stream of marked records (`Validation.mark`), and how its batches'
    undecided records are checked (`Validation.complete` with ``exact``; None without a
    fast path, whose stream decides every record)."""

    marked: DataFrame
    validation: Validation
    exact: Recipe | None


def ingest_stream(
    spark: SparkSession, settings: Settings, query: IngestQuery, skip_lost: bool
) -> IngestStream:
    """The marked streaming DataFrame of ``query`` (``skip_lost``: past offsets the brokers
    no longer have, see `service.kafka.lost_offsets`) and the recipe of its exact checks
    for the rows its writer caches (`service.ingest.writer`).

    Recording the exact checks (or, without a fast path, building them into the stream)
    costs about 1.5 s of py4j calls and plan analysis at a driver's start (the validation
    rules are ~1,000 expression nodes), independent of any table: the driver builds it
    while it creates the missing tables (`service.driver.app`).
    """
    records = to_records(read_topic(spark, settings, query.topic, skip_lost))
    validation = query.validation(settings)
    cached = StructType([*records.schema.fields, INGESTED_AT])
    exact = validation.recipe(cached) if validation.path is not None else None
    return IngestStream(validation.mark(records), validation, exact)


def start_ingest_query(
    spark: SparkSession,
    settings: Settings,
    query: IngestQuery,
    stream: IngestStream,
    writer: QueryWriter,
    available_now: bool,
) -> StreamingQuery:
    """Start ``query`` writing its ``stream`` (`ingest_stream`) through ``writer``."""
    return start_with_writer(
        spark,
        stream.marked.writeStream,
        settings,
        writer,
        available_now,
        query.pool,
        topic=query.topic,
    )
