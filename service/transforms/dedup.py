"""Drop repeated readings: the same ``event_id`` seen again within the dedup horizon.

Arrival time is ``kafka_timestamp``. A reading is a duplicate when an earlier
reading with its ``event_id`` arrived at most ``horizon_seconds`` before it,
either earlier in the same micro-batch or in silver already. A silver row at the
reading's own Kafka coordinates is the reading itself (a micro-batch replayed
after a crash), never its duplicate, so replays classify every record the same way.

The search runs on the key columns only (event id, Kafka coordinates): its
shuffles move a few dozen bytes a reading, not whole readings, and the readings
themselves are filtered only when the batch has duplicates at all.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from service.schemas import SENSOR_DUPLICATES

_ORDER = ("kafka_timestamp", "kafka_partition", "kafka_offset")
_COORDINATES = ("kafka_partition", "kafka_offset")


def find_duplicates(
    readings: DataFrame, recent_silver: DataFrame, horizon_seconds: int
) -> DataFrame:
    """The silver/sensor_duplicates rows of ``readings``: each repeat and what it repeats.

    ``recent_silver`` is silver/sensor_readings, ideally pruned to the arrival window
    ``[min arrival - horizon, max arrival]`` of ``readings``. A repeat names the
    earliest silver reading it matches, else the previous one in the batch.
    """
    keys = readings.select("event_id", "kafka_topic", *_ORDER, "ingested_at")
    earlier_in_batch = Window.partitionBy("event_id").orderBy(*_ORDER)
    horizon = F.expr(f"INTERVAL {int(horizon_seconds)} SECONDS")
    ranked = keys.withColumn(
        "_previous", F.lag(F.struct(*_ORDER)).over(earlier_in_batch)
    ).withColumn(
        "_repeat_in_batch",
        F.col("_previous").isNotNull()
        & (F.col("kafka_timestamp") <= F.col("_previous.kafka_timestamp") + horizon),
    )
    seen = recent_silver.select(
        F.col("event_id").alias("_seen_event_id"),
        F.struct(*_ORDER).alias("_seen"),
    )
    matched = ranked.join(
        seen,
        (F.col("_seen_event_id") == F.col("event_id"))
        & (F.col("_seen.kafka_timestamp") <= F.col("kafka_timestamp"))
        & (F.col("_seen.kafka_timestamp") >= F.col("kafka_timestamp") - horizon)
        & (
            (F.col("_seen.kafka_partition") != F.col("kafka_partition"))
            | (F.col("_seen.kafka_offset") != F.col("kafka_offset"))
        ),
        "left",
    )
    # A reading may match several silver rows; keep one row per reading, the earliest match.
    first_match = Window.partitionBy(*_ORDER, "event_id").orderBy(F.col("_seen").asc_nulls_last())
    original = F.when(F.col("_seen").isNotNull(), F.col("_seen")).when(
        F.col("_repeat_in_batch"), F.col("_previous")
    )
    return (
        matched.withColumn("_n", F.row_number().over(first_match))
        .where(F.col("_n") == 1)
        .withColumn("_original", original)
        .where(F.col("_original").isNotNull())
        .select(
            "event_id",
            "kafka_topic",
            "kafka_partition",
            "kafka_offset",
            "kafka_timestamp",
            "ingested_at",
            F.col("_original.kafka_partition").alias("original_kafka_partition"),
            F.col("_original.kafka_offset").alias("original_kafka_offset"),
        )
        .select([F.col(f.name).cast(f.dataType) for f in SENSOR_DUPLICATES.fields])
    )


def without_duplicates(readings: DataFrame, duplicates: DataFrame) -> DataFrame:
    """``readings`` but the ones at the Kafka coordinates of ``duplicates`` (`find_duplicates`).

    ``duplicates`` is broadcast: it is at most one batch's key columns.
    """
    repeats = F.broadcast(duplicates.select(*[F.col(c).alias(f"_dup_{c}") for c in _COORDINATES]))
    same = [F.col(c) == F.col(f"_dup_{c}") for c in _COORDINATES]
    return readings.join(repeats, same[0] & same[1], "left_anti").select(*readings.columns)
