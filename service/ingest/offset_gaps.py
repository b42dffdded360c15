"""Offsets a batch's Kafka range covered that no record was read at (pure).

A read-committed consumer never sees a transaction marker (one offset per commit or
abort) nor an aborted transaction's records, and the log cleaner of a compacted topic
removes records: their offsets lie in the range Spark planned for a batch, yet no row
of the batch has them. The ingest writer records them in bronze/offset_gaps, so that
reconcile tells such a gap in bronze from a record that was read and then lost.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StructField, StructType

from service.lake.local_rows import local_frame
from service.lake.schemas import OFFSET_GAPS

# (partition, first offset, last offset), both inclusive.
GapRange = tuple[int, int, int]


@dataclass(frozen=True)
class PartitionRead:
    """What a batch read from one partition: its rows, and their lowest and highest offset."""

    rows: int
    first: int
    last: int


def edge_gaps(
    start: Mapping[int, int], end: Mapping[int, int], read: Mapping[int, PartitionRead]
) -> tuple[list[GapRange], list[int]]:
    """The gaps at the edges of each partition's range ``start``..``end`` (exclusive), and
    the partitions whose rows leave gaps between their first and last offset.

    A partition without a recorded start (new since the previous batch) has no leading
    gap: its first offsets may be ones retention removed, which are not this batch's.
    """
    edges: list[GapRange] = []
    inner: list[int] = []
    for partition, stop in sorted(end.items()):
        begin = start.get(partition)
        got = read.get(partition)
        if got is None:
            if begin is not None and stop > begin:
                edges.append((partition, begin, stop - 1))
            continue
        if begin is not None and got.first > begin:
            edges.append((partition, begin, got.first - 1))
        if got.last < stop - 1:
            edges.append((partition, got.last + 1, stop - 1))
        if got.rows < got.last - got.first + 1:
            inner.append(partition)
    return edges, inner


def inner_gaps(rows: DataFrame, partitions: Sequence[int]) -> DataFrame:
    """(``kafka_partition``, ``first_offset``, ``last_offset``) of every run of offsets
    absent between two rows of ``rows`` in ``partitions``."""
    previous = F.lag("kafka_offset").over(
        Window.partitionBy("kafka_partition").orderBy("kafka_offset")
    )
    return (
        rows.where(F.col("kafka_partition").isin(list(partitions)))
        .select("kafka_partition", "kafka_offset", previous.alias("previous"))
        .where(F.col("kafka_offset") > F.col("previous") + 1)
        .select(
            "kafka_partition",
            (F.col("previous") + 1).alias("first_offset"),
            (F.col("kafka_offset") - 1).alias("last_offset"),
        )
    )


_RANGES = StructType(
    [
        StructField("kafka_partition", IntegerType()),
        StructField("first_offset", LongType()),
        StructField("last_offset", LongType()),
    ]
)


def to_offset_gaps(
    spark: SparkSession,
    edges: Sequence[GapRange],
    inner: DataFrame | None,
    topic: str,
    query: str,
    batch_id: int,
    stamp: Column,
) -> DataFrame:
    """bronze/offset_gaps rows: the ``edges`` and the ``inner`` gaps of one batch."""
    ranges = local_frame(spark, [tuple(edge) for edge in edges], _RANGES)
    if inner is not None:
        ranges = ranges.unionByName(inner)
    return ranges.select(
        F.lit(topic).alias("kafka_topic"),
        "kafka_partition",
        "first_offset",
        "last_offset",
        (F.col("last_offset") - F.col("first_offset") + 1).alias("offsets"),
        F.lit(query).alias("query"),
        F.lit(batch_id).cast("bigint").alias("batch_id"),
        stamp.alias("recorded_at"),
    ).select([F.col(f.name).cast(f.dataType) for f in OFFSET_GAPS.fields])
