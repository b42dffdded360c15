"""Spark's Kafka source: its options and the streaming read of one topic."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from service.config import Settings

# How long the broker holds a fetch that finds no new records (`source_options`).
_FETCH_MAX_WAIT_MS = 10


def source_options(settings: Settings, topic: str, skip_lost: bool = False) -> dict[str, str]:
    """Options of Spark's Kafka source for ``topic`` (pure).

    ``skip_lost`` lets the source start past offsets the brokers no longer have (only
    once `service.kafka.lost_offsets` has recorded them).

    A read task covers at most ``kafka_max_records_per_task`` offsets: Spark splits a
    larger Kafka partition range into equal parts. A backlog batch of a 3-partition
    topic then runs as many tasks on 2 cores instead of 3, which leave a core idle
    for the last third of the batch (measured: validation 20-25 % slower); a small
    batch keeps one task per Kafka partition.

    After each poll, Spark's consumer asks for the partition's offset range
    (``InternalKafkaConsumer.fetch``) while the Kafka client's next fetch, sent at the
    end of the poll, is already at the broker. At the end of the log, where every task
    of a caught-up query reads, the broker holds that fetch for ``fetch.max.wait.ms``
    (500 ms by default) and answers the offset request only after it: 0.5 s a task,
    three tasks on two cores, about 1 s of every small batch (measured: a read of the
    last records of three partitions, 1.2 s; with 10 ms, 0.2 s).
    """
    return {
        **settings.kafka.spark_options(),
        "subscribe": topic,
        "startingOffsets": settings.kafka_starting_offsets,
        "maxOffsetsPerTrigger": str(settings.kafka_max_offsets_per_trigger),
        "maxRecordsPerPartition": str(settings.kafka_max_records_per_task),
        "includeHeaders": "true",
        "kafka.fetch.max.wait.ms": str(_FETCH_MAX_WAIT_MS),
        # Committed data only (the Java client reads uncommitted data by default): the
        # source then plans up to the last stable offset, and the offsets of transaction
        # markers and aborted records it skips are recorded per batch (`offset_gaps`).
        "kafka.isolation.level": settings.kafka_isolation_level,
        # Offsets that vanished (retention, topic recreated) must stop the query loudly.
        "failOnDataLoss": str(not skip_lost).lower(),
    }


def read_topic(
    spark: SparkSession, settings: Settings, topic: str, skip_lost: bool = False
) -> DataFrame:
    """The streaming DataFrame of every record of ``topic``."""
    options = source_options(settings, topic, skip_lost)
    return spark.readStream.format("kafka").options(**options).load()
