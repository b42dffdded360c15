"""Bronze sensor records → validated, typed readings and their silver row shape.

Rules are docs/contract.md's (sensors) with the edge cases decided in
`service.ingest.validation`. Sensor-specific decisions: an unknown
``sensor_type`` is ``invalid_value``; ``value`` is required and range-checked
for heart_rate and temperature, optional (any finite number) for accelerometer;
``x``/``y``/``z`` are required for accelerometer and must be finite wherever
present; ``danger_level`` is checked against its enumeration for every sensor
type; an ``event_time`` more than ``max_future_seconds`` after the record's Kafka
timestamp (its arrival) is ``event_time_in_future``, while event times in the
far past are valid (late data is never dropped in silver). A null value is
``empty_payload``: the sensors topic has no tombstones.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from service.ingest.validation import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Violation,
    payload_fields,
    payload_violations,
    rescued_fields,
    stage_fields,
    typed_columns,
    with_error,
    with_parsed_payload,
)
from service.lake.schemas import SENSOR_READING_PAYLOAD, SILVER_SENSOR_READINGS

DEFAULT_MAX_FUTURE_SECONDS = 300
SENSOR_TYPES = ("heart_rate", "temperature", "accelerometer")
DANGER_LEVELS = ("LOW", "MEDIUM", "HIGH")
# Plausible physical ranges of ``value`` per sensor type (bpm, °C).
VALUE_RANGES = {"heart_rate": (20.0, 250.0), "temperature": (-50.0, 150.0)}
ACCELEROMETER_AXES = ("x", "y", "z")

_FIELDS = payload_fields(SENSOR_READING_PAYLOAD)
_MICROS_PER_DAY = 86_400_000_000


def _field_violations(max_future_seconds: int) -> list[Violation]:
    f = _FIELDS
    sensor_type = f["sensor_type"].as_string()
    accelerometer = sensor_type == "accelerometer"
    ahead_micros = F.unix_micros(f["event_time"].as_timestamp()) - F.unix_micros(
        F.col("kafka_timestamp")
    )
    rules = [
        *f["event_id"].required(),
        *f["event_id"].string(non_empty=True),
        *f["device_id"].required(),
        *f["device_id"].string(non_empty=True),
        *f["user_id"].integer(minimum=1),
        *f["sensor_type"].required(),
        *f["sensor_type"].string(one_of=SENSOR_TYPES),
        *f["event_time"].required(),
        *f["event_time"].timestamp(),
    ]
    for name in VALUE_RANGES:
        rules += f["value"].required(when=sensor_type == name, why=f" for {name} readings")
    rules += f["value"].number()
    for name, (low, high) in VALUE_RANGES.items():
        rules += f["value"].between(low, high, when=sensor_type == name, why=f" for {name}")
    rules += [*f["unit"].string(), *f["danger_level"].string(one_of=DANGER_LEVELS)]
    for axis in ACCELEROMETER_AXES:
        rules += [
            *f[axis].required(when=accelerometer, why=" for accelerometer readings"),
            *f[axis].number(),
        ]
    return [
        *rules,
        *f["activity"].string(),
        *f["model"].string(),
        *f["geolocation"].object(),
        *f["geolocation.city"].string(),
        *f["geolocation.country"].string(),
        Violation(
            "event_time_in_future",
            ahead_micros > max_future_seconds * 1_000_000,
            F.concat(
                F.lit("event_time: "),
                (ahead_micros / 1_000_000).cast("decimal(20,3)").cast("string"),
                F.lit(f" s after arrival exceeds {max_future_seconds} s"),
            ),
        ),
    ]


def parse_sensor_readings(
    bronze: DataFrame,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    max_future_seconds: int = DEFAULT_MAX_FUTURE_SECONDS,
) -> DataFrame:
    """Validate bronze sensor rows: add ``error_code``/``error_detail`` and typed fields.

    Every input row comes out once, with the bronze columns, the error (null when
    valid) and ``reading``: a struct of the typed fields and ``_rescued``, complete
    on valid rows (the raw ``value`` and the reading's ``value`` would clash flat).
    """
    staged = stage_fields(with_parsed_payload(bronze, max_payload_bytes), _FIELDS.values())
    x, y, z = (_FIELDS[axis].as_double() for axis in ACCELEROMETER_AXES)
    accelerometer = _FIELDS["sensor_type"].as_string() == "accelerometer"
    reading = F.struct(
        *typed_columns(SENSOR_READING_PAYLOAD).values(),
        # hypot avoids overflow in the squares of large finite components.
        F.when(accelerometer, F.hypot(F.hypot(x, y), z)).alias("magnitude"),
        rescued_fields(F.col("_json"), SENSOR_READING_PAYLOAD.fieldNames()).alias("_rescued"),
    )
    checked = with_error(
        staged,
        [
            *payload_violations(max_payload_bytes, null_allowed=F.lit(False)),
            *_field_violations(max_future_seconds),
        ],
        [*bronze.columns, reading.alias("reading")],
    )
    return checked.select(*bronze.columns, "error_code", "error_detail", "reading")


def to_sensor_readings(valid: DataFrame) -> DataFrame:
    """Valid parsed readings in the silver/sensor_readings schema.

    ``event_date`` is the UTC day of ``event_time`` whatever the session time zone.
    """
    event_day = F.floor(F.unix_micros("event_time") / _MICROS_PER_DAY).cast("int")
    lineage = [c for c in valid.columns if c.startswith("kafka_")]
    flat = valid.select("reading.*", *lineage, "ingested_at")
    return flat.withColumn("event_date", F.date_from_unix_date(event_day)).select(
        [F.col(f.name).cast(f.dataType).alias(f.name) for f in SILVER_SENSOR_READINGS.fields]
    )
