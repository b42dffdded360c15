"""Offsets a batch's Kafka range covered that no record was read at."""

from __future__ import annotations

from datetime import UTC, datetime

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from service.ingest.offset_gaps import PartitionRead, edge_gaps, inner_gaps, to_offset_gaps
from service.lake.schemas import OFFSET_GAPS


def test_a_batch_that_read_every_offset_of_its_range_has_no_gap() -> None:
    read = {0: PartitionRead(rows=10, first=0, last=9), 1: PartitionRead(1, 4, 4)}

    assert ([], []) == edge_gaps({0: 0, 1: 4}, {0: 10, 1: 5}, read)


def test_markers_at_the_edges_and_between_records_are_found() -> None:
    """Partition 0: a commit marker before the first record and one after the last;
    partition 1: records 3 and 7 with an aborted run between; partition 2: only markers."""
    read = {0: PartitionRead(3, 1, 3), 1: PartitionRead(2, 3, 7)}

    edges, inner = edge_gaps({0: 0, 1: 3, 2: 8}, {0: 5, 1: 8, 2: 10}, read)

    assert [(0, 0, 0), (0, 4, 4), (2, 8, 9)] == edges
    assert [1] == inner


def test_a_partition_new_since_the_previous_batch_has_no_leading_gap() -> None:
    assert ([(5, 9, 9)], []) == edge_gaps({}, {5: 10}, {5: PartitionRead(3, 6, 8)})


def test_gap_rows_hold_the_edges_and_the_runs_between_records(spark: SparkSession) -> None:
    batch = spark.createDataFrame(
        [(1, o) for o in (3, 4, 8, 9, 12)] + [(0, 0)],
        "kafka_partition INT, kafka_offset BIGINT",
    )
    stamp = F.lit(datetime(2026, 1, 31, tzinfo=UTC))

    rows = to_offset_gaps(
        spark, [(1, 13, 14)], inner_gaps(batch, [1]), "sensors", "ingest_sensors", 7, stamp
    ).collect()

    assert OFFSET_GAPS.fieldNames() == list(rows[0].asDict())
    assert [(1, 5, 7, 3), (1, 10, 11, 2), (1, 13, 14, 2)] == sorted(
        (r.kafka_partition, r.first_offset, r.last_offset, r.offsets) for r in rows
    )
    assert {("sensors", "ingest_sensors", 7)} == {
        (r.kafka_topic, r.query, r.batch_id) for r in rows
    }
