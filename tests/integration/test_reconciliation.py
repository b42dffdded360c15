"""Nothing lost, nothing doubled: bronze and silver reconcile by Kafka coordinates after kill -9.

Real Kafka (3 partitions per topic), a real S3 server, the real service as a child
process killed with SIGKILL three times at random moments and restarted.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from service.transforms.validation import ERROR_CODES
from tests.integration.harness import (
    KafkaRecord,
    Lake,
    assert_bronze_exactly_once,
    table_coordinates,
    topic_records,
)

pytestmark = pytest.mark.integration

PROFILE = ("first_name", "last_name", "dob", "gender", "country")


@dataclass(frozen=True)
class ExpectedUser:
    """The final silver/users row of one user, computed from the topic in plain Python."""

    profile: tuple[Any, ...] | None
    updated_at: datetime | None
    is_deleted: bool
    deleted_at: datetime | None


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).replace(tzinfo=None)


def expected_users(records: list[KafkaRecord]) -> dict[int, ExpectedUser]:
    """Newest upsert gives the profile; a tombstone at least as new as it marks deletion."""
    upserts: dict[int, tuple[datetime, int, int, dict[str, Any]]] = {}
    tombstones: dict[int, datetime] = {}
    for r in records:
        assert r.key is not None
        user_id = int(r.key)
        if r.value is None:
            at = datetime.fromtimestamp(r.timestamp_ms / 1000, UTC).replace(tzinfo=None)
            tombstones[user_id] = max(at, tombstones.get(user_id, at))
            continue
        payload = json.loads(r.value)
        candidate = (parse_time(payload["updated_at"]), r.partition, r.offset, payload)
        if user_id not in upserts or candidate[:3] > upserts[user_id][:3]:
            upserts[user_id] = candidate
    result = {}
    for user_id in upserts.keys() | tombstones.keys():
        upsert = upserts.get(user_id)
        deleted = tombstones.get(user_id)
        is_deleted = deleted is not None and (upsert is None or deleted >= upsert[0])
        result[user_id] = ExpectedUser(
            profile=tuple(upsert[3][f] for f in PROFILE) if upsert else None,
            updated_at=upsert[0] if upsert else None,
            is_deleted=is_deleted,
            deleted_at=deleted if is_deleted else None,
        )
    return result


def test_bronze_and_silver_reconcile_by_offsets_after_repeated_kill_9(
    spark: SparkSession, lake: Lake
) -> None:
    summary = json.loads(
        lake.generate(
            "--users", "100000", "--readings", "200000", "--seed", "11",
            "--bad-fraction", "0.05", "--late-fraction", "0.05", "--duplicate-fraction", "0.02",
            "--user-update-fraction", "0.05", "--tombstone-fraction", "0.01",
        )
    )  # fmt: skip
    categories = summary["by_category"]
    assert 0 == summary["delivery_errors"]
    assert categories["sensors.bad"] > 9000 and categories["sensors.duplicate"] > 3000
    assert categories["users.tombstone"] > 1000 and categories["users.stale_update"] > 1000

    rng = random.Random(2026)
    batches = {"INGEST_KAFKA_MAX_OFFSETS_PER_TRIGGER": "50000"}
    for attempt in range(3):
        driver = lake.service(f"crash-{attempt}", **batches).start()
        try:
            driver.wait_for_log('"event": "running"', timeout=180)
            if attempt:  # mid-stream: after some batches, at a random point of the next ones
                driver.wait_for_log(
                    '"event": "batch_written"', timeout=300, count=rng.randint(1, 3)
                )
            # The first kill may land before any batch commits.
            time.sleep(rng.uniform(0.5, 10.0))
            assert driver.alive(), driver.log_text()[-3000:]
            driver.kill9()
        finally:
            driver.cleanup()
    final = lake.service("final", "run", "--available-now", **batches).start()
    try:
        assert 0 == final.wait(timeout=900), final.log_text()[-4000:]
    finally:
        final.cleanup()

    bronze_sensors = assert_bronze_exactly_once(spark, lake)
    silver, silver_rows = table_coordinates(spark, lake.table("silver/sensor_readings"))
    quarantined, quarantine_rows = table_coordinates(
        spark, lake.table("silver/quarantine"), F.col("kafka_topic") == lake.sensors_topic
    )
    duplicates, duplicate_rows = table_coordinates(spark, lake.table("silver/sensor_duplicates"))
    assert (len(silver), len(quarantined), len(duplicates)) == (
        silver_rows,
        quarantine_rows,
        duplicate_rows,
    ), "a record was written twice into a silver table"
    assert bronze_sensors == silver | quarantined | duplicates
    assert len(bronze_sensors) == silver_rows + quarantine_rows + duplicate_rows
    assert categories["sensors.bad"] == quarantine_rows
    assert categories["sensors.duplicate"] == duplicate_rows

    codes = {
        r.error_code
        for r in spark.read.format("delta").load(lake.table("silver/quarantine")).collect()
    }
    assert codes <= set(ERROR_CODES)
    assert len(codes) >= 6

    expected = expected_users(topic_records(lake.bootstrap_servers, lake.users_topic))
    actual = {
        r.user_id: ExpectedUser(
            profile=None if r.updated_at is None else tuple(
                r.dob.isoformat() if f == "dob" else r[f] for f in PROFILE
            ),
            updated_at=r.updated_at,
            is_deleted=r.is_deleted,
            deleted_at=r.deleted_at,
        )
        for r in spark.read.format("delta").load(lake.table("silver/users")).collect()
    }  # fmt: skip
    assert len(expected) == len(actual)
    mismatched = [u for u in expected if expected[u] != actual.get(u)]
    assert [] == mismatched[:5], [(expected[u], actual.get(u)) for u in mismatched[:5]]
    # Every table reads whole, validated, with another Delta reader (delta-rs, Arrow),
    # with the rows Spark reads.
    delta_rs = lake.delta_rs_rows()
    assert {
        "bronze/sensors": len(bronze_sensors),
        "silver/sensor_readings": silver_rows,
        "silver/sensor_duplicates": duplicate_rows,
        "silver/users": len(actual),
    }.items() <= delta_rs.items()
    assert {
        name: spark.read.format("delta").load(lake.table(name)).count() for name in delta_rs
    } == delta_rs
