"""Bronze rows for unit tests: Kafka records as the bronze table holds them."""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from service.schemas import BRONZE

ARRIVAL = datetime.datetime(2024, 5, 1, 12, 0, 0, tzinfo=datetime.UTC)
# Prefix of a value given as hex bytes (to carry invalid UTF-8 through createDataFrame).
HEX = "hex:"


def bronze_frame(
    spark: SparkSession,
    records: Sequence[tuple[str | None, str | None]],
    topic: str,
    arrival: datetime.datetime = ARRIVAL,
    partition: int = 0,
    first_offset: int = 0,
) -> DataFrame:
    """Bronze rows of (key, value) records at consecutive offsets, all arriving at ``arrival``."""
    rows = [
        (key, value, topic, partition, first_offset + i, arrival, None, arrival)
        for i, (key, value) in enumerate(records)
    ]
    frame = spark.createDataFrame(rows, BRONZE)
    raw_bytes = F.unhex(F.substring("value", len(HEX) + 1, 1 << 20)).cast("string")
    return frame.withColumn(
        "value", F.when(F.col("value").startswith(HEX), raw_bytes).otherwise(F.col("value"))
    )
