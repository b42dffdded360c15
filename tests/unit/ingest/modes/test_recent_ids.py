"""Recent ids: a batch skips dedup's search only when the search would find nothing."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from service.ingest.modes.dedup import find_duplicates, id_hash
from service.ingest.modes.recent_ids import RecentIds, Sighting
from service.lake.delta import append_once, ensure_table
from service.lake.live_files import LiveFiles
from service.lake.schemas import SENSOR_DUPLICATES as DUPLICATES
from service.lake.tables import SENSOR_READINGS
from tests.support.lake import LOCAL_FILES
from tests.support.records import id_hashes, readings
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
        self.files_searched = 0  # silver files the last batch's search read

    def batch(self, ids: list[str], minute: float) -> Sighting:
        """What the kept ids say of the batch of ``ids`` arriving at ``T0 + minute``: a clear
        batch's search must find nothing, and the search of the files its windows name,
        narrowed to its candidates, what the search of silver's whole horizon finds. The
        batch is then appended."""
        arrival = T0 + timedelta(minutes=minute)
        rows = [(i, 0, 1000 * self.batches + n, arrival) for n, i in enumerate(ids)]
        batch = readings(self.spark, rows).coalesce(1)
        # As the batch's summary collects them.
        hashes = [r.h for r in batch.select(id_hash("event_id").alias("h")).collect()]
        checked: list[Sighting] = []
        self.check_jobs = jobs_of(
            self.spark,
            f"recent-{next(_GROUPS)}",
            lambda: checked.append(self.recent.sighting(self.spark, hashes, arrival, arrival)),
        )
        earliest = arrival - timedelta(seconds=HORIZON)
        whole = self.found(batch, self.live.read(self.spark, earliest, arrival))
        if checked[0].clear:
            assert [] == whole
        near = self.live.read(self.spark, earliest, arrival, checked[0].windows)
        self.files_searched = len(near.inputFiles())
        assert whole == self.found(batch, near, checked[0].candidates)
        commit = append_once(batch, self.uri, "sensors", self.batches)
        self.live.committed(commit)
        self.recent.committed(commit)
        self.batches += 1
        return checked[0]

    def found(
        self, batch: DataFrame, silver: DataFrame, candidates: frozenset[int] | None = None
    ) -> list[tuple[object, ...]]:
        """The duplicates the search finds in ``batch`` against ``silver``, sorted."""
        found = find_duplicates(
            batch, silver, HORIZON, batch.count(), "event_id", DUPLICATES, candidates
        )
        return [] if found is None else sorted(tuple(r) for r in found.collect())


def test_a_batch_skips_the_search_only_when_it_finds_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    uri = f"file:{tmp_path / 'silver'}"
    ensure_table(LOCAL_FILES, uri, SENSOR_READINGS)
    writer = Writer(spark, uri)
    assert writer.batch(["a", "b"], 0).clear  # loads silver's ids: none
    # Its live files (listed by the checksum of silver's version: no job) hold no
    # arrival, so no read of silver follows: no Spark job at all.
    assert 0 == writer.check_jobs
    # Kept ids: the check runs no Spark job either.
    assert writer.batch(["c"], 1).clear
    assert (0, 3) == (writer.check_jobs, writer.recent.size)
    # A repeat of silver's: the search reads the files of the batch it repeats only.
    at = [T0 + timedelta(minutes=m) for m in range(8)]

    assert Sighting(False, ((at[0], at[0]),), id_hashes(spark, "a")) == writer.batch(["a", "d"], 2)
    assert 1 == writer.files_searched  # of the two in silver
    # A repeat within the batch: no silver row shares an id with it, no file is read.
    assert Sighting(False, (), id_hashes(spark, "e")) == writer.batch(["e", "e"], 3)
    assert 0 == writer.files_searched

    # Another writer's row: the ids are loaded again (one window: the rows' arrivals),
    # its id with them.
    other = readings(spark, [("x", 1, 5, at[4])])
    other.write.format("delta").mode("append").save(uri)
    assert Sighting(False, ((at[0], at[4]),), id_hashes(spark, "x")) == writer.batch(["x"], 5)
    assert writer.batch(["f"], 6).clear

    # A new writer (a restart) loads silver's ids.
    writer = Writer(spark, uri)
    writer.batches = 100
    assert Sighting(False, ((at[0], at[6]),), id_hashes(spark, "b")) == writer.batch(["b"], 7)

    # Beyond the horizon (and its slack), ids are forgotten; an id there is no repeat.
    assert writer.batch(["a"], 130).clear
    assert 1 == writer.recent.size
    # Arrivals that went back past what is kept: the search decides, over the horizon.
    assert Sighting(False, None) == writer.batch(["g"], 60)


def test_large_batches_and_many_ids_search_and_only_the_horizon_is_loaded(
    spark: SparkSession, tmp_path: Path
) -> None:
    uri = f"file:{tmp_path / 'silver'}"
    ensure_table(LOCAL_FILES, uri, SENSOR_READINGS)
    now = [0.0]
    writer = Writer(spark, uri, most=4, small=4, clock=lambda: now[0])
    assert writer.batch(["a", "b"], 0).clear
    assert not writer.batch(["c", "d", "e", "f", "g"], 1).clear  # too many to collect
    assert 0 == writer.recent.size
    assert not writer.batch(["h"], 2).clear  # silver holds seven ids: too many to load
    assert not writer.batch(["i"], 3).clear  # and no load is tried for a while
    assert 0 == writer.check_jobs
    now[0] += 300
    assert not writer.batch(["j"], 4).clear  # tried again: nine ids
    assert writer.check_jobs > 0

    # All in one file, most of it before the horizon of a batch an hour later: the
    # ids from the floor (its horizon and slack, 3 minutes in) on are few enough.
    DeltaTable.forPath(spark, uri).optimize().executeCompaction()
    assert 1 == len(spark.read.format("delta").load(uri).inputFiles())
    now[0] += 300
    assert writer.batch(["k"], 73).clear
    assert 3 == writer.recent.size  # i, j and k

    uri = f"file:{tmp_path / 'other'}"
    ensure_table(LOCAL_FILES, uri, SENSOR_READINGS)
    writer = Writer(spark, uri, most=2)
    assert writer.batch(["a", "b"], 0).clear
    assert writer.batch(["c"], 1).clear  # checked against all ids; three are too many to keep
    assert 0 == writer.recent.size
    assert not writer.batch(["d"], 2).clear
