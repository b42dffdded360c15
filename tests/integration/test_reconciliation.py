"""Nothing lost, nothing doubled: bronze and silver reconcile by Kafka coordinates after kill -9.

Real Kafka (3 partitions per topic), a real S3 server, the real service as a child
process killed with SIGKILL at ten named points of a batch's commits (see
`PHASES`), restarted after each, then drained.
"""

from __future__ import annotations

import json
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
    ServiceProcess,
    assert_bronze_exactly_once,
    table_coordinates,
    topic_records,
)

pytestmark = pytest.mark.integration

PROFILE = ("first_name", "last_name", "dob", "gender", "country")

# Where each driver is killed (`tests.integration.crash_at`), one after the other:
# before, between and after the commits of a batch of each query, and between its
# last table commit and its checkpoint commit.
PHASES = (
    "before:bronze/users",
    "after:bronze/users",
    "after:silver/users",
    "checkpoint:ingest_users",
    "before:bronze/sensors",
    "after:bronze/sensors",
    "after:silver/quarantine",
    "after:silver/sensor_duplicates",
    "after:silver/sensor_readings",
    "checkpoint:ingest_sensors",
)


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


def test_bronze_and_silver_reconcile_by_offsets_after_kill_9_at_every_commit_phase(
    spark: SparkSession, lake: Lake
) -> None:
    summary = json.loads(
        lake.generate(
            "--users", "10000", "--readings", "40000", "--seed", "11",
            "--bad-fraction", "0.05", "--late-fraction", "0.05", "--duplicate-fraction", "0.02",
            "--user-update-fraction", "0.05", "--tombstone-fraction", "0.01",
        )
    )  # fmt: skip
    categories = summary["by_category"]
    assert 0 == summary["delivery_errors"]
    assert categories["sensors.bad"] > 1500 and categories["sensors.duplicate"] > 500
    assert categories["users.tombstone"] > 50 and categories["users.stale_update"] > 50

    # A few batches per driver, so each phase meets a batch of both queries with rows
    # for every table; the final drain takes larger ones.
    small = {"INGEST_KAFKA_MAX_OFFSETS_PER_TRIGGER": "2000"}
    for attempt, phase in enumerate(PHASES):
        driver = ServiceProcess(
            lake.env(CRASH_AT=phase, **small),
            lake.work_dir / f"crash-{attempt}.log",
            ("run",),
            module="tests.integration.crash_at",
        ).start()
        try:
            assert -9 == driver.wait(timeout=300), driver.log_text()[-4000:]
            assert [phase] == [e["phase"] for e in driver.events("crash_point")]
        finally:
            driver.cleanup()
    final = lake.service(
        "final", "run", "--available-now", INGEST_KAFKA_MAX_OFFSETS_PER_TRIGGER="50000"
    ).start()
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
