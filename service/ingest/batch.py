"""A micro-batch's summary and the writes its tables go through, the same for an ingest
query's batch (`service.ingest.writer`) and for ``replay-quarantine``.

`summarize` is the batch's first Spark job: rows in, rejects per code, arrival bounds and
the offsets read per partition. Every table write goes through a `Writes`: the transaction
(app id, version) it commits under, the lease fence before it, the phases of the batch's
profile, and whether independent writes run at once. A write mode's silver writes
(`service.ingest.modes`) report a `SilverOutcome`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from service.ingest.offset_gaps import PartitionRead
from service.lake.delta import Commit
from service.lake.tables import Table

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def utc_from_micros(micros: int) -> datetime:
    """A UTC datetime from microseconds since the epoch: exact in every time zone (a
    collected timestamp is naive local time, ambiguous in the hour a clock goes back)."""
    return _EPOCH + timedelta(microseconds=micros)


@dataclass(frozen=True)
class BatchSummary:
    """Counts, arrival-time bounds (UTC) and offsets read per partition of a parsed batch,
    from one aggregation job."""

    rows_in: int
    quarantined: dict[str, int]
    first_arrival: datetime | None
    last_arrival: datetime | None
    partitions: dict[int, PartitionRead] = field(default_factory=dict)
    # The ids (their hashes) of its valid rows, when collected with it (`summarize`).
    ids: tuple[int, ...] | None = None

    @property
    def valid(self) -> int:
        """Rows that passed validation."""
        return self.rows_in - sum(self.quarantined.values())


def summarize(parsed: DataFrame, ids: Column | None = None) -> BatchSummary:
    """Rows in, rejected rows per error code, the arrival bounds and the offsets read per
    partition, in one pass (it caches); with ``ids``, the values of that column that are
    not null (a valid row's id or key hash, a silver writer's ``batch_ids``), in the same
    pass."""
    groups = (
        parsed.groupBy("kafka_partition", "error_code")
        .agg(
            F.count(F.lit(1)).alias("rows"),
            F.unix_micros(F.min("kafka_timestamp")).alias("first"),
            F.unix_micros(F.max("kafka_timestamp")).alias("last"),
            F.min("kafka_offset").alias("first_offset"),
            F.max("kafka_offset").alias("last_offset"),
            *([] if ids is None else [F.collect_list(ids).alias("ids")]),
        )
        .collect()
    )
    firsts = [g["first"] for g in groups if g["first"] is not None]
    lasts = [g["last"] for g in groups if g["last"] is not None]
    quarantined: dict[str, int] = {}
    partitions: dict[int, PartitionRead] = {}
    for g in groups:
        if g["error_code"]:
            quarantined[g["error_code"]] = quarantined.get(g["error_code"], 0) + int(g["rows"])
        seen = partitions.get(g["kafka_partition"])
        partitions[g["kafka_partition"]] = PartitionRead(
            rows=int(g["rows"]) + (seen.rows if seen else 0),
            first=min(g["first_offset"], seen.first) if seen else g["first_offset"],
            last=max(g["last_offset"], seen.last) if seen else g["last_offset"],
        )
    return BatchSummary(
        rows_in=sum(int(g["rows"]) for g in groups),
        quarantined=quarantined,
        first_arrival=utc_from_micros(min(firsts)) if firsts else None,
        last_arrival=utc_from_micros(max(lasts)) if lasts else None,
        partitions=partitions,
        ids=None if ids is None else tuple(i for g in groups for i in g["ids"]),
    )


class Writes(Protocol):
    """How a batch writes its tables (`service.ingest.writer.BatchWrites` in the driver)."""

    @property
    def app_id(self) -> str: ...
    @property
    def version(self) -> int: ...
    def append(self, rows: DataFrame, table: Table) -> Commit | None: ...
    def together(self, writes: Sequence[Callable[[], object]]) -> None: ...
    def phase(self, name: str) -> AbstractContextManager[None]: ...
    def fence(self) -> None: ...


@dataclass
class SilverOutcome:
    """What the silver writes of a batch did: rows per table, and the duplicates found
    (cached: the caller unpersists them)."""

    rows: dict[str, int] = field(default_factory=dict)
    duplicates: DataFrame | None = None
    duplicate_rows: int = 0
