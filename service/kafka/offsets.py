"""The brokers' offsets, and Kafka lag: what is in Kafka and not yet in the lake.

Per partition, the lag is the broker's end offset (for a read-committed reader the
last stable offset) minus the next offset after the query's last committed batch
(its checkpoint's ``offsets/`` and ``commits/`` logs). `status` computes it once; the
driver's lag poller (`service.driver.lag`) exports it on a timer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from confluent_kafka import Consumer, KafkaException, TopicPartition

from service.config import Settings

log = structlog.get_logger(__name__)

KAFKA_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class PartitionStatus:
    """One Kafka partition: the next offset the checkpoint will read vs the broker's end."""

    partition: int
    committed: int | None
    latest: int | None
    lag: int | None


def partition_lag(
    committed: Mapping[int, int],
    watermarks: Mapping[int, tuple[int, int]] | None,
    from_earliest: bool = True,
) -> list[PartitionStatus]:
    """Per partition: committed (next to read) vs latest.

    A partition no batch has read yet lags from the broker's first offset when the
    query starts from ``earliest``, and not at all when it starts from ``latest``.
    """
    partitions = sorted(set(committed) | set(watermarks or {}))
    result = []
    for p in partitions:
        low_high = (watermarks or {}).get(p)
        latest = low_high[1] if low_high else None
        unread_start = (low_high[0] if from_earliest else low_high[1]) if low_high else None
        start = committed.get(p, unread_start)
        lag = max(0, latest - start) if latest is not None and start is not None else None
        result.append(PartitionStatus(p, committed.get(p), latest, lag))
    return result


def retention_headroom(
    committed: Mapping[int, int],
    watermarks: Mapping[int, tuple[int, int]] | None,
    from_earliest: bool = True,
) -> int | None:
    """The records retention can still delete from a topic before it deletes one the query
    has not read: per partition, the next offset to read minus the log start offset; the
    least over the partitions with records waiting (a partition read to its end has
    nothing at risk, so then the least over all). Negative: records already deleted unread.
    None without the brokers' offsets."""
    waiting: list[int] = []
    read: list[int] = []
    for p, (low, high) in (watermarks or {}).items():
        start = committed.get(p, low if from_earliest else high)
        (waiting if high > start else read).append(start - low)
    return min(waiting or read) if waiting or read else None


def offsets_consumer(settings: Settings, isolation_level: str | None = None) -> Consumer:
    """A librdkafka consumer that only asks for watermarks (joins no group, commits nothing).

    Its end offsets follow ``isolation_level`` (default: the service's): for
    ``read_committed`` the last stable offset, which a transaction left open holds back
    until it ends, so lag counts only what the ingest queries can read.
    """
    return Consumer(
        {
            **settings.kafka.librdkafka_config(),
            "group.id": "lakehouse-ingest-offsets",
            "enable.auto.commit": False,
            "isolation.level": isolation_level or settings.kafka_isolation_level,
        }
    )


def broker_offsets(
    consumer: Consumer, topics: Sequence[str], reach_seconds: float = KAFKA_TIMEOUT_SECONDS
) -> dict[str, Any]:
    """``{topic: {partition: (low, high)}}`` from the brokers; ``_error`` if unreachable.

    ``reach_seconds`` bounds the wait for the brokers' first answer, so an unreachable
    cluster costs that long; once they answered, each request has ``KAFKA_TIMEOUT_SECONDS``
    (a busy machine's broker answers, if slowly)."""
    result: dict[str, Any] = {}
    timeout = reach_seconds
    try:
        for topic in topics:
            metadata = consumer.list_topics(topic, timeout=timeout)
            timeout = KAFKA_TIMEOUT_SECONDS
            described = metadata.topics.get(topic)
            if described is None or described.error is not None:
                result[topic] = {}
                continue
            ends = {}
            for p in sorted(described.partitions):
                answer = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
                if answer is None:  # librdkafka's timeout
                    result["_error"] = f"Kafka did not answer for {topic}[{p}] within {timeout}s"
                    return result
                ends[p] = answer
            result[topic] = ends
    except KafkaException as e:
        result["_error"] = f"Kafka unreachable: {e}"
    return result
