"""Gold tables against batch oracles over silver, through real Kafka and a real S3 server.

Readings span 40 minutes of event time, out of order; a second wave adds readings
far behind the watermark (dropped from the stateful gold tables, kept in silver)
and readings that advance the watermark. Every emitted window must equal the same
aggregation recomputed as a batch over silver minus the dropped readings.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from confluent_kafka import Producer
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from service.transforms.gold import (
    alerts,
    enrich_readings,
    heart_rate_stats,
    heart_rate_with_activity,
    sensor_stats,
)
from tests.integration.harness import Lake

pytestmark = pytest.mark.integration

BASE = (datetime.now(UTC) - timedelta(minutes=90)).replace(second=0, microsecond=0)
USERS = 12


def iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def reading(rng: random.Random, n: int, at: datetime) -> dict[str, Any]:
    user_id = rng.randint(1, USERS)
    kind = rng.choice(("heart_rate", "heart_rate", "accelerometer", "temperature"))
    record: dict[str, Any] = {
        "event_id": f"r{n}",
        "device_id": f"dev-{user_id}-{kind[:4]}",
        "user_id": user_id if rng.random() > 0.05 else None,
        "sensor_type": kind,
        "event_time": iso(at),
    }
    if kind == "heart_rate":
        record["value"] = round(rng.uniform(50, 200), 1)
    elif kind == "temperature":
        record["value"] = round(rng.uniform(35, 40), 2)
        record["danger_level"] = "HIGH" if record["value"] > 39.5 else "LOW"
    else:
        record.update({c: round(rng.gauss(0, 3), 3) for c in "xyz"})
        record["activity"] = rng.choice(("walk", "sit", "bike"))
    return record


def produce(
    lake: Lake, topic: str, records: Sequence[tuple[str, Mapping[str, Any] | None]]
) -> None:
    producer = Producer({"bootstrap.servers": lake.bootstrap_servers})
    for key, value in records:
        producer.produce(topic, key=key, value=None if value is None else json.dumps(value))
    assert 0 == producer.flush(30)


def run_available_now(lake: Lake, name: str) -> None:
    driver = lake.service(name, "run", "--available-now", INGEST_GOLD_ENABLED="true").start()
    try:
        assert 0 == driver.wait(timeout=600), driver.log_text()[-4000:]
    finally:
        driver.cleanup()


def rows(df: DataFrame, key: list[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {tuple(r[k] for k in key): r.asDict() for r in df.collect()}


def assert_close(
    expected: dict[str, Any], actual: dict[str, Any], exact: list[str], rel: list[str]
) -> None:
    for column in exact:
        assert expected[column] == actual[column], column
    for column in rel:
        e, a = expected[column], actual[column]
        assert (e is None and a is None) or a == pytest.approx(e, rel=1e-9, abs=1e-12), column


def test_gold_tables_equal_their_batch_oracles_over_silver(spark: SparkSession, lake: Lake) -> None:
    rng = random.Random(5)
    profiles = [
        (str(u), {"user_id": u, "dob": f"19{50 + u}-03-04", "gender": "F", "country": "FR",
                  "updated_at": iso(BASE)})
        for u in range(1, USERS)  # the last user stays unknown
    ]  # fmt: skip
    produce(lake, lake.users_topic, profiles)
    # Wave 1: 40 minutes of event time, shuffled within 3-minute blocks (out of order).
    times = sorted(BASE + timedelta(seconds=rng.uniform(0, 2400)) for _ in range(2500))
    blocks = [times[i : i + 180] for i in range(0, len(times), 180)]
    wave1 = [t for block in blocks for t in rng.sample(block, len(block))]
    produce(lake, lake.sensors_topic,
            [(f"k{i}", reading(rng, i, t)) for i, t in enumerate(wave1)])  # fmt: skip
    run_available_now(lake, "wave1")

    # Wave 2: far behind the watermark (dropped by the windows and the join), then on time.
    late = [(f"late{i}", reading(rng, 10_000 + i, BASE + timedelta(seconds=rng.uniform(0, 600))))
            for i in range(60)]  # fmt: skip
    fresh = [(f"new{i}", reading(rng, 20_000 + i, BASE + timedelta(seconds=2400 + 15 * i)))
             for i in range(40)]  # fmt: skip
    produce(lake, lake.sensors_topic, late + fresh)
    produce(lake, lake.users_topic, [("3", None)])  # user 3 deleted from now on
    run_available_now(lake, "wave2")

    def table(name: str) -> DataFrame:
        return spark.read.format("delta").load(lake.table(name))

    silver = table("silver/sensor_readings")
    assert 2600 == silver.count()
    late_ids = [r["event_id"] for _, r in late]
    on_time = silver.where(~F.col("event_id").isin(late_ids))
    max_event = BASE + timedelta(seconds=2400 + 15 * 39)
    final_watermark = (max_event - timedelta(minutes=10)).replace(tzinfo=None)
    wave1_watermark = (max(wave1) - timedelta(minutes=10)).replace(tzinfo=None)

    # 1-minute stats: every emitted window equals the oracle; all windows closed by wave 1's
    # watermark are there; none closes after the final watermark; none appears twice.
    gold = table("gold/sensor_stats_1m")
    key = ["window_start", "device_id", "sensor_type"]
    assert gold.count() == gold.select(*key).distinct().count()
    oracle = rows(sensor_stats(on_time, "1 minute", "10 minutes"), key)
    emitted = rows(gold, key)
    assert emitted and set(emitted) <= set(oracle)
    for k, actual in emitted.items():
        assert actual["window_end"] <= final_watermark
        assert_close(oracle[k], actual, ["count", "min", "max"], ["avg", "stddev"])
    closed = {k for k, v in oracle.items() if v["window_end"] <= wave1_watermark}
    assert closed <= set(emitted)

    # 5-minute sliding heart-rate windows, p95 from the same percentile_approx accuracy.
    gold_hr = table("gold/heart_rate_5m")
    key = ["window_start", "user_id"]
    assert gold_hr.count() == gold_hr.select(*key).distinct().count()
    oracle = rows(heart_rate_stats(on_time, "5 minutes", "1 minute", "10 minutes"), key)
    emitted = rows(gold_hr, key)
    assert emitted and set(emitted) <= set(oracle)
    for k, actual in emitted.items():
        assert_close(oracle[k], actual, ["count", "min_bpm", "max_bpm", "p95_bpm"], ["avg_bpm"])
    assert {k for k, v in oracle.items() if v["window_end"] <= wave1_watermark} <= set(emitted)

    # Stream-static enrichment: each row equals the batch join with the users snapshot
    # (version) its micro-batch saw.
    enriched = table("gold/readings_enriched")
    assert 2600 == enriched.count() == enriched.select("event_id").distinct().count()
    columns = ["event_id", "user_known", "age", "age_band", "gender", "country"]
    for (version,) in enriched.select("users_version").distinct().collect():
        snapshot = (
            spark.read.format("delta")
            .option("versionAsOf", version)
            .load(lake.table("silver/users"))
        )
        seen = enriched.where(F.col("users_version") == version)
        ids = [r.event_id for r in seen.select("event_id").collect()]
        expected = enrich_readings(silver.where(F.col("event_id").isin(ids)), snapshot)
        assert rows(expected.select(*columns), ["event_id"]) == rows(
            seen.select(*columns), ["event_id"]
        )
    assert enriched.where("user_id = 3 AND NOT user_known").count() > 0
    assert enriched.where("user_id = 12 AND user_known").count() == 0

    # Stream-stream join: every ±30 s pair of on-time readings, once.
    pairs = table("gold/heart_rate_activity")
    key = ["hr_event_id", "acc_event_id"]
    oracle_pairs = rows(heart_rate_with_activity(on_time, "10 minutes", 30), key)
    assert set(oracle_pairs) == set(rows(pairs, key))
    assert pairs.count() == len(oracle_pairs)

    # Alerts: stateless, every offending reading exactly once (late ones included).
    found = table("gold/alerts")
    expected_ids = {r.event_id for r in alerts(silver, 180.0).collect()}
    assert expected_ids == {r.event_id for r in found.collect()}
    assert found.count() == len(expected_ids) > 0
