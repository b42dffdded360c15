"""Transactional and compacted topics: only committed records reach the lake, and reconcile
tells an offset that never held a readable record from one that was read and lost.

One story on the real broker and MinIO: a compacted users topic whose cleaner removed
older versions before the driver reads it; transactional producers (committed and
aborted transactions) interleaved with plain ones on both topics; a driver killed -9
while a transactional producer writes, and restarted; a transaction left open by a
producer killed -9, which holds the last stable offset until the broker aborts it;
then a real hole cut into bronze by hand.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tests.support.kafka import topic_records
from tests.support.lake import (
    Lake,
    LakeFactory,
    assert_bronze_exactly_once,
    generator_summary,
    table_coordinates,
)
from tests.support.service_process import ServiceProcess
from tests.support.users import expected_users, silver_users

pytestmark = pytest.mark.integration

# A users topic compacted as soon as a segment rolls (one segment per round below).
COMPACTED = {
    "cleanup.policy": "compact",
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
}
# Round 0 gives every user a profile; rounds 1-4 update the even users only, the last
# one tombstoning every tenth: compaction leaves the odd users' round 0 and the even
# users' round 4, and removes the versions between them (gaps inside the partitions).
ROUND_USERS, ROUNDS = 60, 5
# Profiles that survive compaction, plus user 1000's committed one and three more that
# roll the round-4 segment of every partition.
COMPACTED_RECORDS = ROUND_USERS + 1 + 3
# The producer that dies with its transaction open: the broker aborts it this long after.
OPEN_TRANSACTION_TIMEOUT_MS = 20_000
OPEN_TRANSACTION = """
import json, sys, time
from confluent_kafka import Producer
bootstrap, topic, timeout_ms = sys.argv[1], sys.argv[2], int(sys.argv[3])
producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "left-open",
                     "transaction.timeout.ms": timeout_ms})
producer.init_transactions()
producer.begin_transaction()
for i in range(10):
    reading = {"event_id": f"open-{i}", "device_id": "d-open", "sensor_type": "temperature",
               "event_time": sys.argv[4], "value": 20.0}
    producer.produce(topic, key=b"d-open", value=json.dumps(reading).encode(), partition=0)
producer.flush()
print("open", flush=True)
time.sleep(600)
"""


@pytest.fixture
def lake(request: pytest.FixtureRequest, make_lake: LakeFactory, tmp_path: Path) -> Lake:
    """Fresh topics, the users one compacted, and a fresh s3a storage root."""
    return make_lake(request.node.name, users_config=COMPACTED, work_dir=tmp_path)


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def profile(user: int, name: str, updated_at: datetime) -> bytes:
    return json.dumps(
        {"user_id": user, "first_name": name, "last_name": "Kafka", "dob": "1990-01-31",
         "gender": "X", "country": "FR", "updated_at": _iso(updated_at)}
    ).encode()  # fmt: skip


def produce_compacted_rounds(lake: Lake) -> int:
    """The rounds (one segment each), user 1000's committed and aborted updates, then a
    record per partition that rolls the last round's segment; return how many were sent."""
    producer = Producer({"bootstrap.servers": lake.bootstrap_servers, "linger.ms": 5})
    now, sent = datetime.now(UTC), 0
    for round_ in range(ROUNDS):
        for user in range(1 if round_ == 0 else 2, ROUND_USERS + 1, 1 if round_ == 0 else 2):
            tombstone = round_ == ROUNDS - 1 and user % 10 == 0
            at = now + timedelta(days=round_)
            value = None if tombstone else profile(user, f"Round{round_}", at)
            producer.produce(lake.users_topic, key=str(user).encode(), value=value)
            sent += 1
        producer.flush()
        time.sleep(0.3)  # past segment.ms: the next record rolls a new segment
    committed_and_aborted_user_updates(lake, now + timedelta(days=10))
    time.sleep(0.3)
    for partition, user in enumerate((1001, 1002, 1003)):
        value = profile(user, "Roll", now)
        producer.produce(lake.users_topic, key=str(user).encode(), value=value, partition=partition)
    producer.flush()
    return sent + 2 + 3


def committed_and_aborted_user_updates(lake: Lake, at: datetime) -> None:
    """User 1000: a committed profile, then a later update whose transaction aborts."""
    producer = Producer(
        {"bootstrap.servers": lake.bootstrap_servers, "transactional.id": uuid.uuid4().hex}
    )
    producer.init_transactions()
    for name, commit in (("Committed", True), ("Aborted", False)):
        at += timedelta(hours=1)
        producer.begin_transaction()
        producer.produce(lake.users_topic, key=b"1000", value=profile(1000, name, at))
        producer.flush()
        (producer.commit_transaction if commit else producer.abort_transaction)()


def wait_until(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout}s: {what}")


def partition_ends(lake: Lake, partition: int) -> tuple[int, int]:
    """(last stable offset, high watermark) of the sensors topic's ``partition``."""
    ends = []
    for isolation in ("read_committed", "read_uncommitted"):
        consumer = Consumer({"bootstrap.servers": lake.bootstrap_servers, "group.id": "ends",
                             "isolation.level": isolation})  # fmt: skip
        try:
            tp = TopicPartition(lake.sensors_topic, partition)
            ends.append(consumer.get_watermark_offsets(tp, timeout=10)[1])
        finally:
            consumer.close()
    return ends[0], ends[1]


def sensors_status(lake: Lake) -> dict[str, Any]:
    """``status --json``'s row of the ingest_sensors query."""
    result = lake.cli("status", "--json")
    queries = json.loads(result.out)["queries"]
    query: dict[str, Any] = next(q for q in queries if q["query"] == "ingest_sensors")
    return query


def sensors_partition_status(lake: Lake, partition: int) -> dict[str, Any]:
    """``status --json``'s row of the sensors topic's ``partition``."""
    partitions = sensors_status(lake)["partitions"]
    row: dict[str, Any] = next(p for p in partitions if p["partition"] == partition)
    return row


def lag_gauge(driver: ServiceProcess) -> float:
    """The driver's polled ``kafka_offsets_behind_latest`` of ingest_sensors, from /metrics."""
    port = driver.events("running")[-1]["http_port"]
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    sample = 'lakehouse_ingest_kafka_offsets_behind_latest{query="ingest_sensors"'
    return float(next(line for line in text.splitlines() if line.startswith(sample)).split()[-1])


def beside_a_gap(spark: SparkSession, lake: Lake, table: str, topic: str) -> tuple[int, int]:
    """(partition, offset) of a bronze row whose previous offset is a recorded gap's last."""
    gaps = spark.read.format("delta").load(lake.table("bronze/offset_gaps"))
    after_gaps = {
        (g.kafka_partition, g.last_offset + 1)
        for g in gaps.where(F.col("kafka_topic") == topic).collect()
    }
    rows = spark.read.format("delta").load(lake.table(table))
    present = {(r.kafka_partition, r.kafka_offset) for r in rows.collect()}
    return min(after_gaps & present)


def test_only_committed_records_land_and_reconcile_knows_markers_aborts_and_compaction(
    spark: SparkSession, lake: Lake
) -> None:
    produced = produce_compacted_rounds(lake)
    # Nothing rolls a users segment afterwards, so the cleaner removes nothing more.
    wait_until(
        lambda: len(topic_records(lake.bootstrap_servers, lake.users_topic)) == COMPACTED_RECORDS,
        60,
        "the log cleaner removed every older version of the users",
    )
    # Readings from a transactional producer (a third of its transactions aborted) and a
    # plain one at once, on the same topic; their user profiles go to another topic.
    elsewhere = {"INGEST_USERS_TOPIC": f"{lake.users_topic}-generators"}
    generators = [
        lake.producing("--users", "20", "--readings", "3000", "--seed", "5",
                       "--transaction-size", "150", "--abort-fraction", "0.34", **elsewhere),
        lake.producing("--users", "20", "--readings", "1500", "--seed", "6", **elsewhere),
    ]  # fmt: skip
    summaries = [generator_summary(g, timeout=300) for g in generators]
    assert summaries[0]["by_category"]["sensors.aborted"] >= 450, summaries[0]

    env = {
        "INGEST_RECONCILE_INTERVAL_SECONDS": "3",
        "INGEST_KAFKA_MAX_OFFSETS_PER_TRIGGER": "800",
        "INGEST_LAG_POLL_SECONDS": "2",  # the lag gauge below, fresh within seconds
    }
    first = lake.service("driver-1", **env).start()
    drivers = [first]
    live = lake.producing(
        "--users", "20", "--rate", "150", "--duration", "20", "--seed", "7",
        "--transaction-size", "40", "--abort-fraction", "0.3", **elsewhere,
    )  # fmt: skip
    try:
        wait_until(
            lambda: sum(e["query"] == "ingest_sensors" for e in first.events("batch_written")) >= 4,
            180,
            "four sensors batches",
        )
        first.kill9()  # while the live producer's transactions go on
        second = lake.service("driver-2", **env).start()
        drivers.append(second)
        assert 0 == live.wait(timeout=120), live.stderr.read() if live.stderr else ""
        second.wait_for_log('"event": "running"', 180)

        def caught_up_to_stable() -> bool:
            query = sensors_status(lake)
            [row] = [p for p in query["partitions"] if p["partition"] == 0]
            return bool(query["lag"] == 0 and row["latest"] == partition_ends(lake, 0)[0])

        # Every partition: the lag gauge below sums them.
        wait_until(caught_up_to_stable, 180, "the driver read everything committed")
        opener = subprocess.Popen(
            [sys.executable, "-c", OPEN_TRANSACTION, lake.bootstrap_servers, lake.sensors_topic,
             str(OPEN_TRANSACTION_TIMEOUT_MS), _iso(datetime.now(UTC))],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert opener.stdout is not None and "open" == opener.stdout.readline().strip()
        opener.kill()  # its producer dies with the transaction open
        opener.wait(timeout=30)
        plain = Producer({"bootstrap.servers": lake.bootstrap_servers})
        for i in range(5):  # behind the open transaction: not readable until it ends
            reading = {
                "event_id": f"after-{i}", "device_id": "d-after", "value": 21.0,
                "sensor_type": "temperature", "event_time": _iso(datetime.now(UTC)),
            }  # fmt: skip
            plain.produce(lake.sensors_topic, value=json.dumps(reading).encode(), partition=0)
        plain.flush()

        stable, high = partition_ends(lake, 0)
        assert 15 == high - stable  # the 10 open records, then our 5
        row = sensors_partition_status(lake, 0)
        assert (stable, 0) == (row["latest"], row["lag"]), "lag counts only what can be read"

        def gauge_settled_while_open() -> bool:
            stable, high = partition_ends(lake, 0)
            assert 15 == high - stable, "the broker aborted the transaction before the check"
            return lag_gauge(second) == 0

        # The polled gauge (every 2 s) counts only what can be read, too.
        wait_until(gauge_settled_while_open, 10, "the lag gauge at 0 with the transaction open")

        def drained_after_abort() -> bool:
            row = sensors_partition_status(lake, 0)
            return bool(row["latest"] == partition_ends(lake, 0)[1] and row["lag"] == 0)

        timeout = OPEN_TRANSACTION_TIMEOUT_MS / 1000 + 60
        wait_until(drained_after_abort, timeout, "the broker aborted it and the driver drained")
        second.wait_for_log('"event": "lake_reconciled"', 60)
        second.terminate()
        assert 0 == second.wait(timeout=120), second.log_text()[-3000:]
    finally:
        live.kill()
        for driver in drivers:
            driver.cleanup()

    assert [] == [e for d in drivers for e in d.events("lake_invariant_broken")]
    bronze_sensors = assert_bronze_exactly_once(spark, lake)
    silver, silver_rows = table_coordinates(spark, lake.table("silver/sensor_readings"))
    assert (bronze_sensors, len(bronze_sensors)) == (silver, silver_rows)
    readings = spark.read.format("delta").load(lake.table("silver/sensor_readings"))
    assert 0 == readings.where(F.col("event_id").startswith("open-")).count()
    assert 5 == readings.where(F.col("event_id").startswith("after-")).count()

    expected = expected_users(topic_records(lake.bootstrap_servers, lake.users_topic))
    users = silver_users(spark, lake)
    mismatched = [u for u in expected.keys() | users.keys() if expected.get(u) != users.get(u)]
    assert [] == mismatched[:5], [(expected.get(u), users.get(u)) for u in mismatched[:5]]
    names = {u: (e.profile[0] if e.profile else None, e.is_deleted) for u, e in users.items()}
    assert ("Committed", False) == names[1000], "an aborted update never wins"
    assert {("Round0", False)} == {names[u] for u in range(1, ROUND_USERS + 1, 2)}
    assert {("Round4", False)} == {names[u] for u in range(2, ROUND_USERS + 1, 2) if u % 10}
    # Their earlier versions were compacted away before the driver read them: a tombstone
    # of a user it never saw inserts a deleted row without a profile.
    assert {(None, True)} == {names[u] for u in range(10, ROUND_USERS + 1, 10)}

    code, report = lake.reconcile()
    assert (0, []) == (code, report["problems"])
    without_record = dict.fromkeys(("bronze/users", "bronze/sensors"), 0)
    for p in report["bronze"]:
        without_record[p["table"]] += p["without_record"]
    # Versions compacted away between the survivors in users (all but the even users'
    # round 0, which may precede them); markers and aborted records in both.
    assert without_record["bronze/users"] >= produced - COMPACTED_RECORDS - ROUND_USERS // 2
    assert without_record["bronze/sensors"] >= summaries[0]["by_category"]["sensors.aborted"]

    # A real hole: a record right after a recorded gap deleted from bronze by hand.
    holes = []
    for topic, table in (
        (lake.sensors_topic, "bronze/sensors"),
        (lake.users_topic, "bronze/users"),
    ):
        partition, offset = beside_a_gap(spark, lake, table, topic)
        where = f"kafka_partition = {partition} AND kafka_offset = {offset}"
        DeltaTable.forPath(spark, lake.table(table)).delete(where)
        holes.append(f"{table} {topic}/{partition}: 1 offsets missing (gaps: {offset})")
    code, report = lake.reconcile()
    assert 1 == code
    assert set(holes) <= set(report["problems"]), report["problems"]
