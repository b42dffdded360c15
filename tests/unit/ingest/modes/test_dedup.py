"""Dedup: repeats within the horizon dropped, replays never; the batch bounds it searches."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from service.ingest.batch import summarize
from service.ingest.modes import dedup
from service.ingest.modes.dedup import (
    BROADCAST_IDS,
    ID_HASH,
    duplicate_candidates,
    find_duplicates,
    with_id_hash,
    without_duplicates,
)
from service.lake.schemas import SENSOR_DUPLICATES, SILVER_SENSOR_READINGS
from tests.support.records import id_hashes, readings
from tests.support.spark import jobs_of

T0 = datetime(2026, 11, 21, 12, 0, 0)
HORIZON = 3600


def candidate_ids(batch: DataFrame, silver: DataFrame) -> list[str]:
    """The batch's ids whose hash `duplicate_candidates` names (by `dedup.with_id_hash`)."""
    hashes = duplicate_candidates(dedup.with_id_hash(batch), dedup.with_id_hash(silver))
    named = dedup.with_id_hash(batch).join(hashes, ID_HASH, "left_semi")
    return sorted({r.event_id for r in named.collect()})


@pytest.mark.parametrize(
    ("rows", "local_ids", "in_set", "collide", "given"),
    [
        (6, 10, 10, False, False),
        (6, 10, 2, False, False),
        (6, 2, 10, False, False),
        (BROADCAST_IDS + 1, 10, 10, False, False),
        (6, 10, 10, True, False),
        (6, 10, 10, False, True),
        (6, 10, 2, False, True),
    ],
    ids=[
        "in-set-collected",
        "broadcast-collected",
        "broadcast-planned",
        "planned-by-spark",
        "one-hash",
        "given",
        "given-broadcast",
    ],
)
def test_repeats_within_the_horizon_are_duplicates_and_replays_are_not(
    spark: SparkSession,
    rows: int,
    local_ids: int,
    in_set: int,
    collide: bool,
    given: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Three or four candidates below: collected and named in the plan or broadcast, or
    # more than LOCAL_IDS.
    monkeypatch.setattr(dedup, "LOCAL_IDS", local_ids)
    monkeypatch.setattr(dedup, "IN_SET", in_set)
    if collide:
        # Every id with one hash: every reading a candidate, and the same verdicts.
        one_hash = F.lit(7).cast("long")
        monkeypatch.setattr(dedup, "with_id_hash", lambda r: r.withColumn(ID_HASH, one_hash))
    silver = readings(
        spark,
        [
            ("seen", 0, 1, T0),  # an earlier batch's reading
            ("old", 0, 2, T0 - timedelta(hours=2)),  # beyond the horizon of its repeat
            ("replayed", 1, 7, T0),  # this very record, written before a crash
        ],
    )
    batch = readings(
        spark,
        [
            ("seen", 2, 10, T0 + timedelta(minutes=5)),
            ("old", 2, 11, T0 + timedelta(minutes=5)),
            ("replayed", 1, 7, T0),
            ("twice", 0, 20, T0 + timedelta(minutes=1)),
            ("twice", 1, 21, T0 + timedelta(minutes=2)),
            ("new", 2, 12, T0),
        ],
    )
    # Given: the hashes of the ids silver holds or the batch repeats (`RecentIds`'s), which
    # the search narrows to without a job of its own.
    candidates = id_hashes(spark, "seen", "old", "replayed", "twice") if given else None
    found: list[DataFrame | None] = []
    jobs = jobs_of(
        spark,
        f"dedup-{rows}-{local_ids}-{in_set}-{collide}-{given}",
        lambda: found.append(
            find_duplicates(batch, silver, HORIZON, rows, "event_id", SENSOR_DUPLICATES, candidates)
        ),
    )
    assert (0 if given or rows > BROADCAST_IDS else 3) == jobs
    (duplicates,) = found
    assert duplicates is not None
    fresh = without_duplicates(batch, duplicates)
    assert ["new", "old", "replayed", "twice"] == sorted(r.event_id for r in fresh.collect())
    # Given the duplicates' coordinates, the same readings, without a broadcast (its job).
    named = without_duplicates(batch, duplicates, [(2, 10), (1, 21)])
    assert sorted(fresh.collect()) == sorted(named.collect())
    assert "BroadcastExchange" not in named._jdf.queryExecution().executedPlan().toString()
    assert [("seen", 2, 10, 0, 1), ("twice", 1, 21, 0, 20)] == sorted(
        (r.event_id, r.kafka_partition, r.kafka_offset, r.original_kafka_partition,
         r.original_kafka_offset)
        for r in duplicates.collect()
    )  # fmt: skip
    # The ids the search narrows to: at two coordinates, whatever the horizon.
    expected = ["new", "old", "replayed", "seen", "twice"] if collide else ["old", "seen", "twice"]
    assert expected == candidate_ids(batch, silver)
    assert SILVER_SENSOR_READINGS.fieldNames() == fresh.columns
    assert [(f.name, f.dataType) for f in SENSOR_DUPLICATES.fields] == [
        (f.name, f.dataType) for f in duplicates.schema.fields
    ]


def test_an_id_is_a_candidate_when_its_partitions_or_its_offsets_differ(
    spark: SparkSession,
) -> None:
    batch = readings(
        spark,
        [
            ("partitions", 0, 5, T0), ("partitions", 1, 5, T0),  # the same offset
            ("offsets", 2, 5, T0), ("offsets", 2, 6, T0),  # the same partition
            ("silver", 1, 3, T0),  # and silver's at (1, 4)
            ("replayed", 0, 9, T0),  # silver's at the same coordinates
            ("once", 0, 10, T0),
        ],
    )  # fmt: skip
    silver = readings(
        spark,
        [
            ("silver", 1, 4, T0),
            ("replayed", 0, 9, T0),
            ("silver-only", 0, 1, T0),
            ("silver-only", 1, 1, T0),
        ],
    )
    assert ["offsets", "partitions", "silver"] == candidate_ids(batch, silver)
    # A hash aggregation: no sort of the batch and the horizon by id.
    candidates = duplicate_candidates(with_id_hash(batch), with_id_hash(silver))
    plan = candidates._jdf.queryExecution().executedPlan().toString()
    assert ("HashAggregate" in plan, "SortAggregate" in plan) == (True, False), plan


def test_an_in_set_holds_exactly_its_values_to_the_extremes_of_64_bits(
    spark: SparkSession,
) -> None:
    values = spark.createDataFrame([(v,) for v in (-(2**63), -1, 0, 5, 2**63 - 1)], "v long")
    chosen = {-(2**63), 0, 2**63 - 1}
    assert sorted(chosen) == sorted(r.v for r in values.where(dedup.in_set("v", chosen)).collect())


def test_a_batch_without_repeats_has_no_duplicates(spark: SparkSession) -> None:
    silver = readings(spark, [("a", 0, 1, T0)])
    batch = readings(spark, [("b", 0, 2, T0), ("c", 1, 3, T0), ("a", 0, 1, T0)])
    # "a" at the same coordinates in silver is a replay, not a candidate: no search at all.
    assert find_duplicates(batch, silver, HORIZON, 3, "event_id", SENSOR_DUPLICATES) is None
    # Nor with no candidate given.
    given = frozenset[int]()
    assert find_duplicates(batch, silver, HORIZON, 3, "event_id", SENSOR_DUPLICATES, given) is None
    # With a repeat beyond the horizon there is a candidate, and the search finds nothing.
    beyond = readings(spark, [("b", 2, 9, T0 - timedelta(hours=2))]).unionByName(silver)
    duplicates = find_duplicates(batch, beyond, HORIZON, 3, "event_id", SENSOR_DUPLICATES)
    assert duplicates is not None
    assert 0 == duplicates.count()
    assert ["a", "b", "c"] == sorted(
        r.event_id for r in without_duplicates(batch, duplicates).collect()
    )


def test_a_batch_summary_counts_rows_per_code_and_bounds_arrivals_exactly_in_utc(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Berlin's clocks go from 03:00 back to 02:00 at 01:00 UTC that day: as naive local
    # times (what a collected timestamp is) the later arrival would read 02:10, the
    # earlier 02:30.
    first = datetime(2026, 10, 25, 0, 30, 0, 123000, tzinfo=UTC)
    last = first + timedelta(minutes=40)
    batch = readings(spark, [("a", 0, 1, last), ("b", 0, 2, first), ("c", 1, 3, first)])
    batch = batch.withColumn("error_code", F.when(F.col("event_id") == "c", "E_SCHEMA"))

    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    try:
        summary = summarize(batch)
    finally:
        monkeypatch.undo()
        time.tzset()

    assert (3, {"E_SCHEMA": 1}, 2) == (summary.rows_in, summary.quarantined, summary.valid)
    assert (first, last) == (summary.first_arrival, summary.last_arrival)
