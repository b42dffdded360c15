"""Gold transforms on static DataFrames: windows, percentiles, enrichment, joins, alerts."""

from __future__ import annotations

import math
from datetime import date, datetime, timedelta

import pytest
from pyspark.sql import SparkSession

from service.gold.transforms import (
    alerts,
    enrich_readings,
    heart_rate_stats,
    heart_rate_with_activity,
    sensor_stats,
)
from service.lake.schemas import SILVER_USERS
from tests.support.gold import T0, acc, hr, readings


def test_sensor_stats_aggregate_value_or_magnitude_per_device_type_and_minute(
    spark: SparkSession,
) -> None:
    rows = [
        hr("a", 1, T0 + timedelta(seconds=1), 60.0),
        hr("b", 1, T0 + timedelta(seconds=59), 80.0),
        hr("c", 1, T0 + timedelta(seconds=60), 100.0),
        acc("d", 1, T0 + timedelta(seconds=5), 3.0, "walk"),
        acc("e", 1, T0 + timedelta(seconds=6), 5.0, "walk"),
    ]
    stats = sensor_stats(readings(spark, rows), "1 minute", "10 minutes").collect()
    actual = {
        (r.window_start, r.sensor_type): (r["count"], r.avg, r.min, r.max, r.stddev) for r in stats
    }
    assert {
        (T0, "heart_rate"): (2, 70.0, 60.0, 80.0, math.sqrt(200.0)),
        (T0 + timedelta(minutes=1), "heart_rate"): (1, 100.0, 100.0, 100.0, None),
        (T0, "accelerometer"): (2, 4.0, 3.0, 5.0, math.sqrt(2.0)),
    } == actual
    assert {timedelta(minutes=1)} == {r.window_end - r.window_start for r in stats}


def test_heart_rate_stats_slide_every_minute_over_five_minutes_per_user(
    spark: SparkSession,
) -> None:
    rows = [hr(str(i), 7, T0 + timedelta(minutes=2, seconds=i), 60.0 + i) for i in range(20)]
    rows.append(hr("other", 8, T0, 90.0))
    stats = heart_rate_stats(readings(spark, rows), "5 minutes", "1 minute", "10 minutes")
    user7 = sorted(
        (r.window_start, r["count"], r.p95_bpm) for r in stats.collect() if r.user_id == 7
    )
    starts = [T0 + timedelta(minutes=m) for m in (-2, -1, 0, 1, 2)]
    assert [(s, 20, 78.0) for s in starts] == user7  # p95 of 60..79: the 19th of 20 values


def test_enrichment_keeps_unknown_and_deleted_users_with_user_known_false(
    spark: SparkSession,
) -> None:
    users = spark.createDataFrame(
        [
            (1, "A", "B", date(1990, 11, 22), "F", "FR", T0, False, None),
            (2, "C", "D", date(1950, 1, 1), "M", "DE", T0, True, T0),
        ],
        SILVER_USERS.fieldNames()[:9],
    )
    rows = [hr("known", 1, T0, 70.0), hr("deleted", 2, T0, 70.0), hr("unknown", 3, T0, 70.0)]
    rows.append({**hr("nobody", 0, T0, 70.0), "user_id": None})
    enriched = enrich_readings(readings(spark, rows), users).collect()
    actual = {r.event_id: (r.user_known, r.age, r.age_band, r.gender, r.country) for r in enriched}
    assert {
        "known": (True, 35, "30-44", "F", "FR"),  # 36th birthday is tomorrow
        "deleted": (False, None, None, None, None),
        "unknown": (False, None, None, None, None),
        "nobody": (False, None, None, None, None),
    } == actual


@pytest.mark.parametrize("bucketed", [True, False])
def test_heart_rate_joins_every_accelerometer_reading_of_the_user_within_30_seconds(
    spark: SparkSession, bucketed: bool
) -> None:
    rows = [
        hr("h1", 1, T0, 120.0),
        acc("a-30", 1, T0 - timedelta(seconds=30), 9.0, "bike"),
        acc("a+10", 1, T0 + timedelta(seconds=10), 11.0, "bike"),
        acc("a+31", 1, T0 + timedelta(seconds=31), 12.0, "walk"),
        acc("other-user", 2, T0, 10.0, "sit"),
    ]
    pairs = heart_rate_with_activity(
        readings(spark, rows), "10 minutes", 30, bucketed=bucketed
    ).collect()
    assert [("h1", "a+10", "bike"), ("h1", "a-30", "bike")] == sorted(
        (r.hr_event_id, r.acc_event_id, r.activity) for r in pairs
    )


@pytest.mark.parametrize("tolerance", [30, 45, 90])
def test_bucketed_join_finds_every_pair_once_across_bucket_edges(
    spark: SparkSession, tolerance: int
) -> None:
    """Readings on and around minute edges, and around the epoch (where integer division
    makes one bucket two minutes wide): the pairs are exactly the brute-force ones, each
    once, whatever the tolerance's ratio to the bucket."""
    edge = datetime(2026, 11, 21, 12, 1, 0)
    offsets_ms = [-90_000, -60_001, -60_000, -45_000, -30_001, -30_000, -29_999, -1, 0, 1,
                  29_999, 30_000, 30_001, 59_999, 60_000, 90_000, 119_999]  # fmt: skip
    rows = []
    for base in (edge, datetime(1969, 12, 31, 23, 59, 0)):
        for i, off in enumerate(offsets_ms):
            at = base + timedelta(milliseconds=off)
            rows.append(hr(f"h{base.year}-{i}", 1, at, 70.0))
            rows.append(acc(f"a{base.year}-{i}", 1, at, 1.0, "walk"))
    by_id = {r["event_id"]: r["event_time"] for r in rows}
    expected = sorted(
        (h, a)
        for h in by_id
        if h.startswith("h")
        for a in by_id
        if a.startswith("a") and abs(by_id[a] - by_id[h]) <= timedelta(seconds=tolerance)
    )
    found = heart_rate_with_activity(readings(spark, rows), "10 minutes", tolerance).collect()
    assert expected == sorted((r.hr_event_id, r.acc_event_id) for r in found)


@pytest.mark.parametrize("threshold", [180.0, 100.0])
def test_alerts_flag_high_heart_rate_and_high_temperature_danger(
    spark: SparkSession, threshold: float
) -> None:
    rows = [
        hr("calm", 1, T0, 90.0),
        hr("racing", 1, T0, 190.0),
        {"event_id": "hot", "device_id": "t", "sensor_type": "temperature", "event_time": T0,
         "value": 40.0, "danger_level": "HIGH"},
        {"event_id": "warm", "device_id": "t", "sensor_type": "temperature", "event_time": T0,
         "value": 38.0, "danger_level": "MEDIUM"},
    ]  # fmt: skip
    found = {(r.event_id, r.alert_type) for r in alerts(readings(spark, rows), threshold).collect()}
    expected = {("racing", "heart_rate_high"), ("hot", "temperature_high")}
    if threshold < 90:
        expected.add(("calm", "heart_rate_high"))
    assert expected == found
