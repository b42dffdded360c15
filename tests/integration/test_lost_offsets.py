"""Offsets no longer in Kafka: refused at start, skipped only on the operator's word, recorded.

Real Kafka and MinIO. Retention is played by Kafka's DeleteRecords (what
``kafka-delete-records.sh`` and a short ``retention.ms`` both do to the log start
offset); the recreated topic is a real delete and create.
"""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.cimpl import NewTopic
from devstack import KafkaBroker
from pyspark.sql import SparkSession

from tests.support.kafka import Coordinates, topic_coordinates
from tests.support.lake import Lake, table_coordinates
from tests.support.service_process import ServiceProcess

pytestmark = pytest.mark.integration

UNREAD = 40  # offsets of sensors partition 0 removed before the driver read them
PARTITIONS = 3  # of the `lake` fixture's topics


def end_offsets(bootstrap_servers: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "lost-offsets"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def run_to_end(lake: Lake, name: str, **env: str) -> tuple[int, ServiceProcess]:
    """Run ``run --available-now`` to its end: its exit code and the process (for its log)."""
    driver = lake.service(name, "run", "--available-now", **env).start()
    try:
        return driver.wait(timeout=600), driver
    finally:
        driver.cleanup()


def error_lines(driver: ServiceProcess) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in driver.log_text().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("level") == "error"]


def recreate(broker: KafkaBroker, topic: str, partitions: int) -> None:
    """Delete ``topic`` and create it again (deletion completes asynchronously)."""
    admin = broker.admin()
    admin.delete_topics([topic])[topic].result(timeout=30)
    deadline = time.monotonic() + 60
    while True:
        future = admin.create_topics([NewTopic(topic, partitions, replication_factor=1)])[topic]
        try:
            future.result(timeout=30)
            break
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    broker.create_topics([topic], partitions)  # waits for the partitions' leaders


def test_lost_offsets_refuse_the_start_until_skipped_which_records_them_for_reconcile(
    kafka_broker: KafkaBroker, lake: Lake, spark: SparkSession
) -> None:
    sensors = lake.sensors_topic
    lake.generate("--users", "5", "--readings", "300", "--seed", "3", "--bad-fraction", "0.05")
    code, first = run_to_end(lake, "first")
    assert 0 == code, first.log_text()[-3000:]
    read_up_to = end_offsets(lake.bootstrap_servers, sensors, PARTITIONS)

    lake.generate("--users", "5", "--readings", "300", "--seed", "4", "--bad-fraction", "0.05")
    produced = topic_coordinates(lake.bootstrap_servers, sensors)
    first_lost = read_up_to[0]
    admin = kafka_broker.admin()  # kept: a collected client never completes its futures
    deleted = admin.delete_records([TopicPartition(sensors, 0, first_lost + UNREAD)])
    for future in deleted.values():
        future.result(timeout=30)
    lost: Coordinates = {(sensors, 0, o) for o in range(first_lost, first_lost + UNREAD)}
    assert lost <= produced

    code, refused = run_to_end(lake, "refused")
    assert 3 == code, refused.log_text()[-3000:]
    [line] = error_lines(refused)
    assert ("refusing_to_start", "KafkaOffsetsLostError") == (line["event"], line["error_class"])
    message = str(line["error"])
    assert (
        f"topic {sensors} partition 0: offsets {first_lost}-{first_lost + UNREAD - 1}"
        f" ({UNREAD}) are no longer in Kafka" in message
    )
    assert "INGEST_KAFKA_SKIP_LOST_OFFSETS=true" in message
    assert "docs/runbooks/KafkaOffsetsLost.md" in message

    code, skipped = run_to_end(lake, "skipped", INGEST_KAFKA_SKIP_LOST_OFFSETS="true")
    assert 0 == code, skipped.log_text()[-3000:]
    assert [] == error_lines(skipped)
    [event] = skipped.events("kafka_offsets_skipped")
    assert (sensors, 0, first_lost, first_lost + UNREAD - 1, UNREAD) == (
        event["topic"], event["partition"], event["first_offset"], event["last_offset"],
        event["offsets"],
    )  # fmt: skip
    bronze, rows = table_coordinates(spark, lake.table("bronze/sensors"))
    assert (produced - lost, len(produced - lost)) == (bronze, rows)
    recorded = spark.read.format("delta").load(lake.table("bronze/skipped_offsets")).collect()
    assert [(sensors, 0, first_lost, first_lost + UNREAD - 1, UNREAD, "ingest_sensors")] == [
        (r.kafka_topic, r.kafka_partition, r.first_offset, r.last_offset, r.offsets, r.query)
        for r in recorded
    ]

    code, report = lake.reconcile()
    assert 0 == code, report["problems"]
    assert [(sensors, 0, first_lost, first_lost + UNREAD - 1)] == [
        (r["topic"], r["partition"], r["first"], r["last"]) for r in report["skipped"]
    ]
    assert len(produced - lost) == report["sensors"]["bronze_rows"]
    assert lake.delta_rs_rows()["bronze/skipped_offsets"] == 1

    # A recreated topic starts its offsets again: refused even with the skip setting, as
    # its records would reuse coordinates bronze already holds.
    recreate(kafka_broker, sensors, PARTITIONS)
    lake.generate("--users", "1", "--readings", "20", "--seed", "5")
    code, again = run_to_end(lake, "recreated", INGEST_KAFKA_SKIP_LOST_OFFSETS="true")
    assert 3 == code, again.log_text()[-3000:]
    [line] = error_lines(again)
    assert "KafkaOffsetsLostError" == line["error_class"]
    assert f"topic {sensors} partition 0: the checkpoint of ingest_sensors reads on from" in str(
        line["error"]
    )
    assert "partition ends at" in str(line["error"])
