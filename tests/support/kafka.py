"""Records read back from a topic of the test broker."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient

# Records by where they were read: (topic, partition, offset).
Coordinates = set[tuple[str, int, int]]


@dataclass(frozen=True)
class KafkaRecord:
    """One record read back from the broker."""

    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None


def topic_records(bootstrap_servers: str, topic: str) -> list[KafkaRecord]:
    """Every record currently in ``topic``, read back from the broker."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"harness-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=30)
        partitions = sorted(metadata.topics[topic].partitions)
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            for p in partitions
        }
        pending = {p for p in partitions if ends[p][1] > ends[p][0]}
        consumer.assign([TopicPartition(topic, p, ends[p][0]) for p in pending])
        records: list[KafkaRecord] = []
        while pending:
            msg = consumer.poll(10)
            if msg is None:
                raise AssertionError(f"timed out reading {topic}; still pending {pending}")
            error, partition, offset = msg.error(), msg.partition(), msg.offset()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    pending.discard(partition)
                    continue
                raise AssertionError(str(error))
            assert partition is not None and offset is not None
            records.append(
                KafkaRecord(partition, offset, msg.timestamp()[1], msg.key(), msg.value())
            )
            if offset + 1 >= ends[partition][1]:
                pending.discard(partition)
        return records
    finally:
        consumer.close()


def topic_coordinates(bootstrap_servers: str, topic: str) -> Coordinates:
    """Every (topic, partition, offset) currently in ``topic``."""
    return {(topic, r.partition, r.offset) for r in topic_records(bootstrap_servers, topic)}


def end_offsets(bootstrap_servers: str, topic: str) -> dict[int, int]:
    """Each partition of ``topic``'s end offset (its high watermark)."""
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "end-offsets"})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in partitions
        }
    finally:
        consumer.close()


def group_offsets(
    bootstrap_servers: str, group: str, topic: str, partitions: Iterable[int]
) -> dict[int, int]:
    """The offsets consumer group ``group`` committed for ``topic``'s ``partitions``, read
    through the broker's admin API (-1001 where it committed none)."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in partitions])
    [future] = admin.list_consumer_group_offsets([request]).values()
    return {tp.partition: tp.offset for tp in future.result(timeout=30).topic_partitions}
