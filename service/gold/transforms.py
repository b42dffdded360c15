"""Gold aggregates and joins over silver readings, as pure DataFrame functions.

Each works the same on a static DataFrame (tests, batch oracles) and on a
streaming one (the gold queries), where the event-time watermark bounds the
state and makes every appended window or join row final.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

# percentile_approx accuracy: relative rank error is 1/accuracy (documented bound).
P95_ACCURACY = 10_000
AGE_BANDS = ((18, "<18"), (30, "18-29"), (45, "30-44"), (65, "45-64"))
# Event-time bucket of the heart-rate/activity join's state key (see heart_rate_with_activity).
JOIN_BUCKET_SECONDS = 60


def reading_metric() -> Column:
    """The aggregated quantity of a reading: the magnitude for accelerometers, else value."""
    return F.when(F.col("sensor_type") == "accelerometer", F.col("magnitude")).otherwise(
        F.col("value")
    )


def sensor_stats(readings: DataFrame, window: str, watermark: str) -> DataFrame:
    """Tumbling ``window`` statistics per (device_id, sensor_type), final after ``watermark``."""
    return (
        readings.withWatermark("event_time", watermark)
        .groupBy(F.window("event_time", window).alias("w"), "device_id", "sensor_type")
        .agg(
            F.count(F.lit(1)).alias("count"),
            F.avg(reading_metric()).alias("avg"),
            F.min(reading_metric()).alias("min"),
            F.max(reading_metric()).alias("max"),
            F.stddev_samp(reading_metric()).alias("stddev"),
        )
        .select(
            F.col("w.start").alias("window_start"),
            F.col("w.end").alias("window_end"),
            "device_id",
            "sensor_type",
            "count",
            "avg",
            "min",
            "max",
            "stddev",
        )
    )


def heart_rate_stats(readings: DataFrame, size: str, slide: str, watermark: str) -> DataFrame:
    """Sliding ``size`` windows every ``slide`` of each user's bpm, final after ``watermark``."""
    bpm = F.col("value")
    return (
        readings.where((F.col("sensor_type") == "heart_rate") & F.col("user_id").isNotNull())
        .withWatermark("event_time", watermark)
        .groupBy(F.window("event_time", size, slide).alias("w"), "user_id")
        .agg(
            F.count(F.lit(1)).alias("count"),
            F.avg(bpm).alias("avg_bpm"),
            F.min(bpm).alias("min_bpm"),
            F.max(bpm).alias("max_bpm"),
            F.percentile_approx(bpm, 0.95, P95_ACCURACY).alias("p95_bpm"),
        )
        .select(
            F.col("w.start").alias("window_start"),
            F.col("w.end").alias("window_end"),
            "user_id",
            "count",
            "avg_bpm",
            "min_bpm",
            "max_bpm",
            "p95_bpm",
        )
    )


def _age_band(age: Column) -> Column:
    band = F.when(age.isNull(), F.lit(None).cast("string"))
    for upper, label in AGE_BANDS:
        band = band.when(age < upper, label)
    return band.otherwise("65+")


def enrich_readings(readings: DataFrame, users: DataFrame) -> DataFrame:
    """Readings joined with a users snapshot; unknown or deleted users kept (``user_known``
    false) with no profile columns."""
    profile = users.select(
        F.col("user_id").alias("_uid"),
        F.col("dob").alias("_dob"),
        F.col("gender").alias("_gender"),
        F.col("country").alias("_country"),
        F.col("is_deleted").alias("_deleted"),
    )
    joined = readings.join(profile, readings["user_id"] == profile["_uid"], "left")
    known = F.col("_uid").isNotNull() & ~F.coalesce(F.col("_deleted"), F.lit(False))
    age = F.when(
        known, F.floor(F.months_between(F.to_date("event_time"), F.col("_dob")) / 12)
    ).cast("int")
    return joined.select(
        *readings.columns,
        known.alias("user_known"),
        age.alias("age"),
        _age_band(age).alias("age_band"),
        F.when(known, F.col("_gender")).alias("gender"),
        F.when(known, F.col("_country")).alias("country"),
    )


def heart_rate_with_activity(
    readings: DataFrame, watermark: str, tolerance_seconds: int, *, bucketed: bool = True
) -> DataFrame:
    """Each heart-rate reading paired with every accelerometer reading of the same user
    within ±``tolerance_seconds`` (inner join: one row per matching pair).

    ``bucketed`` also keys the join's state by a ``JOIN_BUCKET_SECONDS`` event-time
    bucket: a heart-rate reading is in one bucket, an accelerometer reading in every
    bucket its ±tolerance reaches, so each pair meets in exactly one bucket and a new
    reading is compared with a user's readings of one or two minutes instead of all
    the user's readings the state holds. The pairs are the same; the state layout is
    not, so a checkpoint started without buckets keeps running without them.
    """
    heart = _sensor_rows(readings, "heart_rate", "hr_", bpm="value")
    motion = _sensor_rows(
        readings, "accelerometer", "acc_", activity="activity", magnitude="magnitude"
    )
    tolerance = F.expr(f"INTERVAL {int(tolerance_seconds)} SECONDS")
    condition = (
        (F.col("hr_user_id") == F.col("acc_user_id"))
        & (F.col("acc_event_time") >= F.col("hr_event_time") - tolerance)
        & (F.col("acc_event_time") <= F.col("hr_event_time") + tolerance)
    )
    if bucketed:
        reach = int(tolerance_seconds) * 1_000_000
        heart = heart.withColumn("hr_bucket", _bucket(F.unix_micros("hr_event_time")))
        acc_micros = F.unix_micros("acc_event_time")
        motion = motion.withColumn(
            "acc_bucket",
            F.explode(F.sequence(_bucket(acc_micros - reach), _bucket(acc_micros + reach))),
        )
        condition = condition & (F.col("hr_bucket") == F.col("acc_bucket"))
    joined = heart.withWatermark("hr_event_time", watermark).join(
        motion.withWatermark("acc_event_time", watermark), condition, "inner"
    )
    return joined.select(
        F.col("hr_user_id").alias("user_id"),
        "hr_event_id",
        "hr_event_time",
        "bpm",
        "acc_event_id",
        "acc_event_time",
        "activity",
        "magnitude",
    )


def _sensor_rows(readings: DataFrame, sensor_type: str, prefix: str, **measures: str) -> DataFrame:
    """The readings of ``sensor_type`` that name a user: event id, user and event time
    renamed with ``prefix``, then each ``measures`` column under its keyword."""
    keys = [F.col(c).alias(prefix + c) for c in ("event_id", "user_id", "event_time")]
    values = [F.col(column).alias(name) for name, column in measures.items()]
    return readings.where(
        (F.col("sensor_type") == sensor_type) & F.col("user_id").isNotNull()
    ).select(*keys, *values)


def _bucket(micros: Column) -> Column:
    """The ``JOIN_BUCKET_SECONDS`` bucket of an epoch-microsecond time (integer division:
    monotonic, which is all the join needs, as an accelerometer reading takes every
    bucket from its earliest reach's to its latest's)."""
    return F.call_function("div", micros, F.lit(JOIN_BUCKET_SECONDS * 1_000_000))


def alerts(readings: DataFrame, heart_rate_threshold: float) -> DataFrame:
    """One row per reading with a heart rate above the threshold or a HIGH temperature."""
    high_heart_rate = (F.col("sensor_type") == "heart_rate") & (
        F.col("value") > heart_rate_threshold
    )
    hot = (F.col("sensor_type") == "temperature") & (F.col("danger_level") == "HIGH")
    return readings.where(high_heart_rate | hot).select(
        "event_id",
        "device_id",
        "user_id",
        "sensor_type",
        "event_time",
        "value",
        "danger_level",
        F.when(high_heart_rate, "heart_rate_high")
        .otherwise("temperature_high")
        .alias("alert_type"),
        F.when(high_heart_rate, F.lit(heart_rate_threshold)).alias("threshold"),
        "kafka_topic",
        "kafka_partition",
        "kafka_offset",
    )
