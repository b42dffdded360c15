"""Recent ids: a batch skips dedup's search only when the search would find nothing."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from service.ingest.dedup import find_duplicates
from service.ingest.recent_ids import RecentIds
from service.lake.delta import append_once, ensure_table
from service.lake.live_files import LiveFiles
from service.lake.schemas import SENSOR_DUPLICATES as DUPLICATES
from service.lake.tables import SENSOR_READINGS
from tests.support.records import readings
from tests.support.spark import jobs_of

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
HORIZON = 3600
_GROUPS = itertools.count()  # Spark job group names, never reused


class Writer:
    """Silver's writer as the sensors query is: ids checked, then the batch appended."""

    def __init__(
        self,
        spark: SparkSession,
        uri: str,
        most: int = 100,
        small: int = 10,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spark, self.uri = spark, uri
        self.live = LiveFiles(uri, "kafka_timestamp")
        self.recent = RecentIds(self.live, HORIZON, "event_id", most=most, small=small, clock=clock)
        self.batches = 0
        self.check_jobs = 0  # Spark jobs of the last batch's check

    def batch(self, ids: list[str], minute: float) -> bool:
        """Whether the batch of ``ids`` arriving at ``T0 + minute`` skips the search (which
        then must find nothing in it); the batch is then appended."""
        arrival = T0 + timedelta(minutes=minute)
        rows = [(i, 0, 1000 * self.batches + n, arrival) for n, i in enumerate(ids)]
        batch = readings(self.spark, rows).coalesce(1)
        checked: list[bool] = []
        self.check_jobs = jobs_of(
            self.spark,
            f"recent-{next(_GROUPS)}",
            lambda: checked.append(
                self.recent.none_seen(self.spark, batch, len(ids), arrival, arrival)
            ),
        )
        if checked[0]:
            silver = self.live.read(self.spark, arrival - timedelta(seconds=HORIZON), arrival)
            found = find_duplicates(batch, silver, HORIZON, len(ids), "event_id", DUPLICATES)
            assert found is None
        commit = append_once(batch, self.uri, "sensors", self.batches)
        self.live.committed(commit)
        self.recent.committed(commit)
        self.batches += 1
        return checked[0]


def test_a_batch_skips_the_search_only_when_it_finds_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    uri = f"file:{tmp_path / 'silver'}"
    ensure_table(spark, uri, SENSOR_READINGS)
    writer = Writer(spark, uri)
    assert writer.batch(["a", "b"], 0)  # loads silver's ids: none
    # Its live files (listed by the checksum of silver's version: no job) hold no
    # arrival, so no read of silver follows: the one job collects the batch's ids.
    assert 1 == writer.check_jobs
    # Kept ids: the check runs one Spark job, the collect of the batch's ids.
    assert writer.batch(["c"], 1)
    assert (1, 3) == (writer.check_jobs, writer.recent.size)
    assert not writer.batch(["a", "d"], 2)  # a repeat of silver's
    assert not writer.batch(["e", "e"], 3)  # a repeat within the batch

    # Another writer's row: the ids are loaded again, its id with them.
    other = readings(spark, [("x", 1, 5, T0 + timedelta(minutes=4))])
    other.write.format("delta").mode("append").save(uri)
    assert not writer.batch(["x"], 5)
    assert writer.batch(["f"], 6)

    # A new writer (a restart) loads silver's ids.
    writer = Writer(spark, uri)
    writer.batches = 100
    assert not writer.batch(["b"], 7)

    # Beyond the horizon (and its slack), ids are forgotten; an id there is no repeat.
    assert writer.batch(["a"], 130)
    assert 1 == writer.recent.size
    # Arrivals that went back past what is kept: the search decides.
    assert not writer.batch(["g"], 60)


def test_large_batches_and_many_ids_search_and_only_the_horizon_is_loaded(
    spark: SparkSession, tmp_path: Path
) -> None:
    uri = f"file:{tmp_path / 'silver'}"
    ensure_table(spark, uri, SENSOR_READINGS)
    now = [0.0]
    writer = Writer(spark, uri, most=4, small=4, clock=lambda: now[0])
    assert writer.batch(["a", "b"], 0)
    assert not writer.batch(["c", "d", "e", "f", "g"], 1)  # too many to collect
    assert 0 == writer.recent.size
    assert not writer.batch(["h"], 2)  # silver holds seven ids: too many to load
    assert not writer.batch(["i"], 3)  # and no load is tried for a while
    assert 0 == writer.check_jobs
    now[0] += 300
    assert not writer.batch(["j"], 4)  # tried again: nine ids
    assert writer.check_jobs > 0

    # All in one file, most of it before the horizon of a batch an hour later: the
    # ids from the floor (its horizon and slack, 3 minutes in) on are few enough.
    DeltaTable.forPath(spark, uri).optimize().executeCompaction()
    assert 1 == len(spark.read.format("delta").load(uri).inputFiles())
    now[0] += 300
    assert writer.batch(["k"], 73)
    assert 3 == writer.recent.size  # i, j and k

    uri = f"file:{tmp_path / 'other'}"
    ensure_table(spark, uri, SENSOR_READINGS)
    writer = Writer(spark, uri, most=2)
    assert writer.batch(["a", "b"], 0)
    assert writer.batch(["c"], 1)  # checked against all ids; three are too many to keep
    assert 0 == writer.recent.size
    assert not writer.batch(["d"], 2)
