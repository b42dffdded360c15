"""The benchmark's baseline: the least a Spark job must do to land the sensors topic in Delta.

Kafka source → ``from_json`` with the sensor payload's StructType → Delta append,
``availableNow``: no validation, quarantine, dedup or lineage. It runs in its own
process (a fresh JVM) with the service's Spark configuration and jars, those of a driver
that drains as `run --available-now` does (`service.streaming.session.build_spark`),
reads the same environment variables as the service, and prints one ``query_progress``
JSON line per micro-batch when it is done.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, LongType, StringType, StructType, TimestampType

from service.config import load_settings
from service.streaming.session import build_spark

SENSOR_PAYLOAD = (
    StructType()
    .add("event_id", StringType())
    .add("device_id", StringType())
    .add("user_id", LongType())
    .add("sensor_type", StringType())
    .add("event_time", TimestampType())
    .add("value", DoubleType())
    .add("unit", StringType())
    .add("danger_level", StringType())
    .add("x", DoubleType())
    .add("y", DoubleType())
    .add("z", DoubleType())
    .add("activity", StringType())
    .add("model", StringType())
    .add("geolocation", StructType().add("city", StringType()).add("country", StringType()))
)


def main(argv: Sequence[str] | None = None) -> int:
    """Drain the sensors topic into the Delta table ``--table``, then print its progress."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", required=True, help="Delta table path to append to")
    parser.add_argument("--checkpoint", required=True, help="streaming checkpoint path")
    args = parser.parse_args(argv)
    settings = load_settings()
    spark = build_spark(settings, drain=True)
    readings = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", settings.kafka_bootstrap_servers)
        .option("subscribe", settings.sensors_topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", settings.kafka_max_offsets_per_trigger)
        .load()
        .select(
            F.from_json(F.col("value").cast("string"), SENSOR_PAYLOAD).alias("reading"),
            F.col("partition").alias("kafka_partition"),
            F.col("offset").alias("kafka_offset"),
            F.col("timestamp").alias("kafka_timestamp"),
        )
        .select("reading.*", "kafka_partition", "kafka_offset", "kafka_timestamp")
    )
    query = (
        readings.writeStream.format("delta")
        .queryName("baseline")
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start(args.table)
    )
    query.awaitTermination()
    for progress in query.recentProgress:
        line = {
            "event": "query_progress",
            "query": "baseline",
            "batch_id": progress.batchId,
            "input_rows": progress.numInputRows,
            "batch_duration_ms": progress.batchDuration,
            "trigger_start": progress.timestamp,
        }
        print(json.dumps(line), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
