"""Silver readings as gold's queries read them: the fields a test names, the rest null."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from service.lake.schemas import SILVER_SENSOR_READINGS

T0 = datetime(2026, 11, 21, 12, 0, 0)


def readings(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    """silver/sensor_readings rows: given fields, the rest null."""
    names = SILVER_SENSOR_READINGS.fieldNames()
    lineage = {"kafka_topic": "s", "kafka_partition": 0, "kafka_offset": 0, "ingested_at": T0}
    full = [
        tuple({**lineage, "event_date": row["event_time"].date(), **row}.get(n) for n in names)
        for row in rows
    ]
    return spark.createDataFrame(full, SILVER_SENSOR_READINGS)


def hr(event_id: str, user_id: int, at: datetime, bpm: float) -> dict[str, Any]:
    """A heart-rate reading from ``user_id``'s watch."""
    return {"event_id": event_id, "device_id": f"w{user_id}", "user_id": user_id,
            "sensor_type": "heart_rate", "event_time": at, "value": bpm}  # fmt: skip


def acc(
    event_id: str, user_id: int, at: datetime, magnitude: float, activity: str
) -> dict[str, Any]:
    """An accelerometer reading from ``user_id``'s watch, with its magnitude and activity."""
    return {"event_id": event_id, "device_id": f"w{user_id}", "user_id": user_id,
            "sensor_type": "accelerometer", "event_time": at, "magnitude": magnitude,
            "activity": activity}  # fmt: skip


def final_watermark(readings: DataFrame, watermark: timedelta) -> datetime:
    """The watermark gold ends at after reading ``readings``: their latest event time less
    ``watermark`` (the windows ending by then are closed)."""
    latest = readings.agg(F.max("event_time")).first()
    assert latest is not None
    moment: datetime = latest[0] - watermark
    return moment
