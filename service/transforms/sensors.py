"""Bronze sensor records → validated, typed readings and their silver row shape.

Rules are DESIGN.md §2 (sensors) with the edge cases decided in
`service.transforms.validation`. Sensor-specific decisions: an unknown
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

from service.schemas import SENSOR_READING_PAYLOAD, SILVER_SENSOR_READINGS
from service.transforms.validation import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    JsonField,
    Violation,
    payload_violations,
    rescued_fields,
    stage_fields,
    with_error,
    with_parsed_payload,
)

DEFAULT_MAX_FUTURE_SECONDS = 300
SENSOR_TYPES = ("heart_rate", "temperature", "accelerometer")
DANGER_LEVELS = ("LOW", "MEDIUM", "HIGH")
# Plausible physical ranges of ``value`` per sensor type (bpm, °C).
VALUE_RANGES = {"heart_rate": (20.0, 250.0), "temperature": (-50.0, 150.0)}

_EVENT_ID = JsonField("event_id")
_DEVICE_ID = JsonField("device_id")
_USER_ID = JsonField("user_id")
_SENSOR_TYPE = JsonField("sensor_type")
_EVENT_TIME = JsonField("event_time")
_VALUE = JsonField("value")
_UNIT = JsonField("unit")
_DANGER_LEVEL = JsonField("danger_level")
_X, _Y, _Z = JsonField("x"), JsonField("y"), JsonField("z")
_ACTIVITY = JsonField("activity")
_MODEL = JsonField("model")
_GEOLOCATION = JsonField("geolocation")
_GEO_CITY = JsonField("geolocation.city")
_GEO_COUNTRY = JsonField("geolocation.country")
_FIELDS = (
    _EVENT_ID,
    _DEVICE_ID,
    _USER_ID,
    _SENSOR_TYPE,
    _EVENT_TIME,
    _VALUE,
    _UNIT,
    _DANGER_LEVEL,
    _X,
    _Y,
    _Z,
    _ACTIVITY,
    _MODEL,
    _GEOLOCATION,
    _GEO_CITY,
    _GEO_COUNTRY,
)
_MICROS_PER_DAY = 86_400_000_000


def _field_violations(max_future_seconds: int) -> list[Violation]:
    sensor_type = _SENSOR_TYPE.as_string()
    accelerometer = sensor_type == "accelerometer"
    arrival = F.coalesce(F.col("kafka_timestamp"), F.col("ingested_at"))
    ahead_micros = F.unix_micros(_EVENT_TIME.as_timestamp()) - F.unix_micros(arrival)
    rules = [
        *_EVENT_ID.required(),
        *_EVENT_ID.string(non_empty=True),
        *_DEVICE_ID.required(),
        *_DEVICE_ID.string(non_empty=True),
        *_USER_ID.integer(minimum=1),
        *_SENSOR_TYPE.required(),
        *_SENSOR_TYPE.string(one_of=SENSOR_TYPES),
        *_EVENT_TIME.required(),
        *_EVENT_TIME.timestamp(),
    ]
    for name in VALUE_RANGES:
        rules += _VALUE.required(when=sensor_type == name, why=f" for {name} readings")
    rules += _VALUE.number()
    for name, (low, high) in VALUE_RANGES.items():
        rules += _VALUE.between(low, high, when=sensor_type == name, why=f" for {name}")
    rules += [*_UNIT.string(), *_DANGER_LEVEL.string(one_of=DANGER_LEVELS)]
    for axis in (_X, _Y, _Z):
        rules += [
            *axis.required(when=accelerometer, why=" for accelerometer readings"),
            *axis.number(),
        ]
    return [
        *rules,
        *_ACTIVITY.string(),
        *_MODEL.string(),
        *_GEOLOCATION.object(),
        *_GEO_CITY.string(),
        *_GEO_COUNTRY.string(),
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
    staged = stage_fields(with_parsed_payload(bronze, max_payload_bytes), _FIELDS)
    checked = with_error(
        staged,
        [
            *payload_violations(max_payload_bytes, null_allowed=F.lit(False)),
            *_field_violations(max_future_seconds),
        ],
    )
    x, y, z = _X.as_double(), _Y.as_double(), _Z.as_double()
    reading = F.struct(
        _EVENT_ID.as_string().alias("event_id"),
        _DEVICE_ID.as_string().alias("device_id"),
        _USER_ID.as_long().alias("user_id"),
        _SENSOR_TYPE.as_string().alias("sensor_type"),
        _EVENT_TIME.as_timestamp().alias("event_time"),
        _VALUE.as_double().alias("value"),
        _UNIT.as_string().alias("unit"),
        _DANGER_LEVEL.as_string().alias("danger_level"),
        x.alias("x"),
        y.alias("y"),
        z.alias("z"),
        # hypot avoids overflow in the squares of large finite components.
        F.when(_SENSOR_TYPE.as_string() == "accelerometer", F.hypot(F.hypot(x, y), z)).alias(
            "magnitude"
        ),
        _ACTIVITY.as_string().alias("activity"),
        _MODEL.as_string().alias("model"),
        _GEO_CITY.as_string().alias("geo_city"),
        _GEO_COUNTRY.as_string().alias("geo_country"),
        rescued_fields(F.col("_json"), SENSOR_READING_PAYLOAD.fieldNames()).alias("_rescued"),
    )
    return checked.select(*bronze.columns, "error_code", "error_detail", reading.alias("reading"))


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
