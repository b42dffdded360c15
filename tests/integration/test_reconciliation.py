"""Nothing lost, nothing doubled: bronze and silver reconcile by Kafka coordinates after kill -9.

Real Kafka (3 partitions per topic, written in transactions, some aborted), a real S3
server, the real service as a child process killed with SIGKILL at eleven named points
of a batch's commits (see `PHASES`), restarted after each, then drained by a driver that
runs both queries.
"""

from __future__ import annotations

import json

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from service.ingest.validation import ERROR_CODES
from service.logs import MERGE_SOURCE_NOT_COPIED
from tests.support.kafka import topic_records
from tests.support.lake import Lake, assert_bronze_exactly_once, table_coordinates
from tests.support.users import expected_users, silver_users

pytestmark = pytest.mark.integration

# Where each driver is killed (`tests.support.crash_at`), one after the other:
# before, between and after the commits of a batch of each query, and between its
# last table commit and its checkpoint commit. Each of these drivers runs the query
# (the contract) it is killed in: the other query's batches would only delay the kill.
PHASES = (
    ("users", "before:bronze/users"),
    ("users", "after:bronze/users"),
    ("users", "after:silver/users"),
    ("users", "checkpoint:ingest_users"),
    ("sensors", "before:bronze/sensors"),
    ("sensors", "after:bronze/sensors"),
    ("sensors", "after:bronze/offset_gaps"),
    ("sensors", "after:silver/quarantine"),
    ("sensors", "after:silver/sensor_duplicates"),
    ("sensors", "after:silver/sensor_readings"),
    ("sensors", "checkpoint:ingest_sensors"),
)


def test_bronze_and_silver_reconcile_by_offsets_after_kill_9_at_every_commit_phase(
    spark: SparkSession, lake: Lake
) -> None:
    summary = json.loads(
        lake.generate(
            "--users", "10000", "--readings", "40000", "--seed", "11",
            "--bad-fraction", "0.05", "--late-fraction", "0.05", "--duplicate-fraction", "0.02",
            "--user-update-fraction", "0.05", "--tombstone-fraction", "0.01",
            # In Kafka transactions, a tenth of them aborted: bronze/offset_gaps gets a
            # commit in most batches, and the aborted records must land nowhere.
            "--transaction-size", "500", "--abort-fraction", "0.1",
        )
    )  # fmt: skip
    categories = summary["by_category"]
    assert 0 == summary["delivery_errors"]
    assert categories["sensors.bad"] > 1500 and categories["sensors.duplicate"] > 500
    assert categories["users.tombstone"] > 50 and categories["users.stale_update"] > 50
    assert categories["sensors.aborted"] > 1000

    # A few batches per driver, so each phase meets a batch with rows for every table of
    # its query; the final drain takes larger ones.
    small = {"INGEST_KAFKA_MAX_OFFSETS_PER_TRIGGER": "2000"}
    for attempt, (contract, phase) in enumerate(PHASES):
        lake.killed_at(f"crash-{attempt}", phase, {**small, "INGEST_CONTRACT_NAMES": contract})
    final = lake.service(
        "final", "run", "--available-now", INGEST_KAFKA_MAX_OFFSETS_PER_TRIGGER="50000"
    ).start()
    try:
        assert 0 == final.wait(timeout=900), final.log_text()[-4000:]
    finally:
        final.cleanup()
    # Its users batches MERGEd into a silver table with rows, without Delta's warning
    # about the uncopied source (`service.logs` drops it: the service chose so).
    merged = [
        e for e in final.events("batch_written") if e["query"] == "ingest_users" and e["rows_in"]
    ]
    assert merged and "silver/users" in merged[0]["phases_ms"]
    assert MERGE_SOURCE_NOT_COPIED not in final.log_text()

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
    actual = silver_users(spark, lake)
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
    # The lake's own check agrees: the aborted records and the markers were recorded as
    # offsets without a record, by the batches that covered them.
    code, report = lake.reconcile()
    assert (0, []) == (code, report["problems"])
    assert sum(p["without_record"] for p in report["bronze"]) >= categories["sensors.aborted"]
