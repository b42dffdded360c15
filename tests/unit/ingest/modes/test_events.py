"""Sensor records → validated readings: one batch of cases, parsed once, checked per case."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from service.ingest.modes import parse_records
from service.ingest.modes.events import Events
from service.ingest.validation import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    ERROR_CODES,
    split_valid_invalid,
    to_quarantine,
)
from service.lake.delta import scala_items
from service.lake.schemas import QUARANTINE, SILVER_SENSOR_READINGS
from service.lake.tables import SHIPPED
from tests.support.payloads import profile, reading
from tests.support.records import HEX, bronze_frame

MAX_PAYLOAD_BYTES = 4096
MAX_FUTURE_SECONDS = 300
SENSORS = SHIPPED.contracts["sensors"]


def accelerometer(**overrides: Any) -> dict[str, Any]:
    """A valid accelerometer reading with ``overrides``."""
    base = {"sensor_type": "accelerometer", "value": None, "x": 3, "y": 4.0, "z": 0, **overrides}
    return reading(**base)


def text(fields: dict[str, Any]) -> str:
    """``fields`` as a JSON document."""
    return json.dumps(fields)


LARGE = text(reading(padding="x" * MAX_PAYLOAD_BYTES))
# Fewer characters than the limit, more bytes (é is two bytes in UTF-8).
LARGE_IN_BYTES = json.dumps(reading(padding="é" * 2000), ensure_ascii=False)

# case name → (value, expected error_code, expected error_detail)
CASES: dict[str, tuple[str | None, str | None, str | None]] = {
    "valid heart rate": (text(reading()), None, None),
    "valid temperature": (
        text(reading(sensor_type="temperature", value=-12, unit="C", danger_level="LOW")),
        None,
        None,
    ),
    "valid accelerometer": (text(accelerometer(activity="walk")), None, None),
    "valid with byte-order mark": ("\ufeff" + text(reading()), None, None),
    "valid without user": (text(reading(user_id=None)), None, None),
    "valid with null user": (
        text(reading()).replace('"user_id": 7', '"user_id": null'),
        None,
        None,
    ),
    "valid far past event": (text(reading(event_time="1999-01-01T00:00:00Z")), None, None),
    "valid exactly 300 s ahead": (text(reading(event_time="2024-05-01T12:05:00Z")), None, None),
    "null value": (None, "empty_payload", "value: empty"),
    "empty string": ("", "empty_payload", "value: empty"),
    "whitespace only": (" \n\t", "empty_payload", "value: empty"),
    "too large": (
        LARGE,
        "payload_too_large",
        f"value: {len(LARGE.encode())} bytes exceeds the limit of 4096",
    ),
    "too large in bytes not characters": (
        LARGE_IN_BYTES,
        "payload_too_large",
        f"value: {len(LARGE_IN_BYTES.encode())} bytes exceeds the limit of 4096",
    ),
    "too large and malformed": ("{" * 5000, "payload_too_large", None),
    "invalid utf-8": (
        HEX + text(reading(unit="XX")).encode().hex().replace("5858", "c328"),
        "malformed_json",
        "value: not valid UTF-8",
    ),
    "trailing content": (
        text(reading()) + " {}",
        "malformed_json",
        "value: not a single well-formed JSON document",
    ),
    "bare NaN": (text(reading()).replace("72.5", "NaN"), "malformed_json", None),
    "duplicate keys": (text(reading()).replace("{", '{"value": 1, ', 1), "malformed_json", None),
    "single quotes": ("{'event_id': 'e-1'}", "malformed_json", None),
    "truncated": (text(reading())[:-1], "malformed_json", None),
    "nested deeper than 1000": (
        text(reading()).replace("{", '{"deep": ' + "[" * 1100 + "]" * 1100 + ", ", 1),
        "malformed_json",
        None,
    ),
    "array": ("[1, 2]", "not_an_object", "value: expected a JSON object, got array"),
    "string": ('"hello"', "not_an_object", "value: expected a JSON object, got string"),
    "number": ("42", "not_an_object", "value: expected a JSON object, got integer"),
    "missing event_id": (text(reading(event_id=None)), "missing_field", "event_id: required"),
    "null device_id": (
        text(reading()).replace('"watch-1"', "null"),
        "missing_field",
        "device_id: required",
    ),
    "heart rate without value": (
        text(reading(value=None)),
        "missing_field",
        "value: required for heart_rate readings",
    ),
    "accelerometer without y": (
        text(accelerometer(y=None)),
        "missing_field",
        "y: required for accelerometer readings",
    ),
    "quoted number": (
        text(reading(value="72")),
        "type_mismatch",
        "value: expected a JSON number, got string",
    ),
    "NaN string": (
        text(reading(value="NaN")),
        "type_mismatch",
        "value: expected a JSON number, got string",
    ),
    "boolean value": (
        text(reading(value=True)),
        "type_mismatch",
        "value: expected a JSON number, got boolean",
    ),
    "fractional user_id": (
        text(reading(user_id=7.0)),
        "type_mismatch",
        "user_id: expected a JSON integer, got number",
    ),
    "quoted user_id": (
        text(reading(user_id="7")),
        "type_mismatch",
        "user_id: expected a JSON integer, got string",
    ),
    "numeric event_id": (
        text(reading(event_id=12)),
        "type_mismatch",
        "event_id: expected a JSON string, got integer",
    ),
    "garbage event_time": (
        text(reading(event_time="yesterday")),
        "type_mismatch",
        "event_time: not an ISO-8601 timestamp: 'yesterday'",
    ),
    "impossible event_time": (
        text(reading(event_time="2024-02-30T00:00:00Z")),
        "type_mismatch",
        "event_time: not an ISO-8601 timestamp: '2024-02-30T00:00:00Z'",
    ),
    "event_time in year 0000": (
        text(reading(event_time="0000-06-01T00:00:00Z")),
        "out_of_range",
        "event_time: outside years 1-9999 (UTC): '0000-06-01T00:00:00Z'",
    ),
    "event_time moved before year 1 by its offset": (
        text(reading(event_time="0001-01-01T00:30:00+01:00")),
        "out_of_range",
        "event_time: outside years 1-9999 (UTC): '0001-01-01T00:30:00+01:00'",
    ),
    "event_time with a trailing line feed": (
        text(reading(event_time="2024-05-01T12:00:00Z\n")),
        "type_mismatch",
        "event_time: not an ISO-8601 timestamp: '2024-05-01T12:00:00Z\n'",
    ),
    "fractional epoch event_time": (
        text(reading(event_time=1714564740000.5)),
        "type_mismatch",
        "event_time: expected an ISO-8601 string or integer epoch milliseconds, got number",
    ),
    "geolocation not an object": (
        text(reading(geolocation="Paris")),
        "type_mismatch",
        "geolocation: expected a JSON object, got string",
    ),
    "numeric city": (
        text(reading(geolocation={"city": 75, "country": "FR"})),
        "type_mismatch",
        "geolocation.city: expected a JSON string, got integer",
    ),
    "unknown sensor type": (
        text(reading(sensor_type="humidity")),
        "invalid_value",
        "sensor_type: 'humidity' is not one of heart_rate, temperature, accelerometer",
    ),
    "empty event_id": (text(reading(event_id="")), "invalid_value", "event_id: empty string"),
    "unknown danger level": (
        text(reading(sensor_type="temperature", value=20, danger_level="EXTREME")),
        "invalid_value",
        "danger_level: 'EXTREME' is not one of LOW, MEDIUM, HIGH",
    ),
    "heart rate too high": (
        text(reading(value=300)),
        "out_of_range",
        "value: 300.0 is outside 20..250 for heart_rate",
    ),
    "temperature too low": (
        text(reading(sensor_type="temperature", value=-60.5)),
        "out_of_range",
        "value: -60.5 is outside -50..150 for temperature",
    ),
    "user_id zero": (text(reading(user_id=0)), "out_of_range", "user_id: 0 is below 1"),
    "user_id beyond 64 bits": (
        text(reading(user_id=2**64)),
        "out_of_range",
        "user_id: integer beyond 64 bits",
    ),
    "infinite x": (
        text(accelerometer()).replace('"x": 3', '"x": 1e400'),
        "out_of_range",
        "x: not a finite number",
    ),
    "epoch millis beyond year 9999": (
        text(reading(event_time=300_000_000_000_000)),
        "out_of_range",
        "event_time: epoch milliseconds outside years 1-9999",
    ),
    "event time 301 s ahead": (
        text(reading(event_time="2024-05-01T12:05:01Z")),
        "event_time_in_future",
        "event_time: 301.000 s after arrival exceeds 300 s",
    ),
    "missing field wins over type mismatch": (
        text(reading(event_id=None, value="72")),
        "missing_field",
        "event_id: required",
    ),
    "first field in schema order wins": (
        text(reading(value="72", device_id=5)),
        "type_mismatch",
        "device_id: expected a JSON string, got integer",
    ),
    "type mismatch wins over invalid value": (
        text(reading(sensor_type="humidity", user_id="7")),
        "type_mismatch",
        "user_id: expected a JSON integer, got string",
    ),
    "out of range wins over future": (
        text(reading(value=10, event_time="2030-01-01T00:00:00Z")),
        "out_of_range",
        "value: 10.0 is outside 20..250 for heart_rate",
    ),
}

# case name → (event_time in the payload, expected UTC timestamp)
TIMESTAMPS = {
    "Z suffix": ("2024-05-01T10:15:30Z", "2024-05-01 10:15:30"),
    "+02:00 offset": ("2024-05-01T10:15:30+02:00", "2024-05-01 08:15:30"),
    "-0530 offset": ("2024-05-01T04:45:30-0530", "2024-05-01 10:15:30"),
    "zone-less is UTC": ("2024-05-01T10:15:30", "2024-05-01 10:15:30"),
    "space separator": ("2024-05-01 10:15:30Z", "2024-05-01 10:15:30"),
    "fractional seconds": ("2024-05-01T10:15:30.123Z", "2024-05-01 10:15:30.123"),
    "nanoseconds truncated": ("2024-05-01T10:15:30.123456789Z", "2024-05-01 10:15:30.123456"),
    "epoch milliseconds": (1714558530123, "2024-05-01 10:15:30.123"),
}


@pytest.fixture(scope="module")
def parsed(spark: SparkSession) -> DataFrame:
    """Every case and timestamp case in one bronze batch, parsed (keys name the cases)."""
    records: list[tuple[str | None, str | None]] = [(name, v) for name, (v, _, _) in CASES.items()]
    records += [(name, text(reading(event_time=t))) for name, (t, _) in TIMESTAMPS.items()]
    bronze = bronze_frame(spark, records, "sensors")
    return parse_records(SENSORS, bronze, MAX_PAYLOAD_BYTES, MAX_FUTURE_SECONDS).cache()


@pytest.fixture(scope="module")
def outcomes(parsed: DataFrame) -> dict[str, dict[str, Any]]:
    """Each case's error and a few typed fields, by case name."""
    rows = parsed.select(
        F.col("key_text").alias("key"),
        "error_code",
        "error_detail",
        F.col("record.event_time").cast("string").alias("event_time"),
        "record._rescued",
    ).collect()
    return {row["key"]: row.asDict() for row in rows}


@pytest.mark.parametrize("case", list(CASES))
def test_each_case_gets_its_error_code_and_detail(
    outcomes: dict[str, dict[str, Any]], case: str
) -> None:
    _, code, detail = CASES[case]
    actual = outcomes[case]
    assert code == actual["error_code"]
    if detail is not None or code is None:
        assert detail == actual["error_detail"]


@pytest.mark.parametrize("case", list(TIMESTAMPS))
def test_timestamp_formats_parse_to_the_same_utc_instant(
    outcomes: dict[str, dict[str, Any]], case: str
) -> None:
    expected = TIMESTAMPS[case][1]
    assert (None, expected) == (outcomes[case]["error_code"], outcomes[case]["event_time"])


def test_every_error_code_is_exercised() -> None:
    assert len(LARGE_IN_BYTES) < MAX_PAYLOAD_BYTES
    assert set(ERROR_CODES) == {code for _, code, _ in CASES.values() if code is not None}


def test_unknown_fields_are_rescued_with_their_json_types(spark: SparkSession) -> None:
    extra = {"firmware": "1.2", "battery": 87, "ratio": 0.5, "ok": True, "tags": ["a", 1]}
    document = text(reading(**extra)).replace("}", ', "nothing": null}')
    bronze = bronze_frame(spark, [("k", document), ("plain", text(reading()))], "sensors")
    rows = {
        r["key"]: r
        for r in parse_records(SENSORS, bronze, DEFAULT_MAX_PAYLOAD_BYTES, MAX_FUTURE_SECONDS)
        .select(F.col("key_text").alias("key"), "record._rescued")
        .collect()
    }
    expected = {**extra, "nothing": None}
    assert expected == json.loads(rows["k"]["_rescued"])
    assert None is rows["plain"]["_rescued"]


def test_magnitude_is_the_euclidean_norm_for_accelerometer_only(parsed: DataFrame) -> None:
    """The sensors contract's derived column, computed as silver receives the readings."""
    valid, _ = split_valid_invalid(parsed)
    silver = Events(SENSORS).to_silver(valid)
    magnitude = {r["kafka_offset"]: r["magnitude"] for r in silver.collect()}
    offsets = {r["key_text"]: r["kafka_offset"] for r in parsed.collect()}
    expected = (5.0, None)
    assert expected == (
        magnitude[offsets["valid accelerometer"]],
        magnitude[offsets["valid heart rate"]],
    )


def test_valid_rows_become_silver_readings_and_invalid_rows_quarantine(parsed: DataFrame) -> None:
    valid, invalid = split_valid_invalid(parsed)
    readings = Events(SENSORS).to_silver(valid)
    quarantine = to_quarantine(invalid, F.lit("2024-05-01 12:00:01").cast("timestamp"))
    expected_valid = {n for n, (_, code, _) in CASES.items() if code is None} | set(TIMESTAMPS)
    actual = {
        "readings_schema": [(f.name, f.dataType) for f in readings.schema.fields],
        "quarantine_schema": [(f.name, f.dataType) for f in quarantine.schema.fields],
        "quarantined": quarantine.count(),
        "valid_offsets": {r["kafka_offset"] for r in readings.select("kafka_offset").collect()},
    }
    offsets = {
        r["key"]: r["kafka_offset"]
        for r in parsed.select(F.col("key_text").alias("key"), "kafka_offset").collect()
    }
    assert {
        "readings_schema": [(f.name, f.dataType) for f in SILVER_SENSOR_READINGS.fields],
        "quarantine_schema": [(f.name, f.dataType) for f in QUARANTINE.fields],
        "quarantined": len(offsets) - len(expected_valid),
        "valid_offsets": {offsets[n] for n in expected_valid},
    } == actual


def test_event_date_is_the_utc_day_whatever_the_session_time_zone(spark: SparkSession) -> None:
    late_evening = text(reading(event_time="2024-05-01T23:30:00Z"))
    bronze = bronze_frame(spark, [("k", late_evening)], "sensors")
    spark.conf.set("spark.sql.session.timeZone", "Asia/Tokyo")
    try:
        row = (
            Events(SENSORS)
            .to_silver(
                parse_records(SENSORS, bronze, DEFAULT_MAX_PAYLOAD_BYTES, MAX_FUTURE_SECONDS)
            )
            .select("event_date")
            .first()
        )
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
    assert row is not None
    assert "2024-05-01" == str(row["event_date"])


def test_streaming_and_static_parsing_agree(spark: SparkSession, tmp_path: Any) -> None:
    records = [(name, v) for name, (v, _, _) in list(CASES.items())[:12]]
    static = bronze_frame(spark, records, "sensors")
    static.write.parquet(str(tmp_path / "bronze"))
    stream = spark.readStream.schema(static.schema).parquet(str(tmp_path / "bronze"))
    query = (
        parse_records(SENSORS, stream, MAX_PAYLOAD_BYTES, MAX_FUTURE_SECONDS)
        .select(F.col("key_text").alias("key"), "error_code")
        .writeStream.format("memory")
        .queryName("parsed_sensors")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    streamed = {tuple(r) for r in spark.table("parsed_sensors").collect()}
    expected = {(name, CASES[name][1]) for name, _ in records}
    assert expected == streamed


def test_validation_runs_as_compiled_code(spark: SparkSession) -> None:
    """Validation's staged fields generate a method over HotSpot's 8,000-bytecode limit:
    the JVM must compile it, and Spark must keep that stage whole instead of splitting
    it per operator (which copies the wide staged row at every step). The rules run in
    a row projection of their own: inside the whole-stage code they made a method
    neither JIT compiler accepts (measured: 300,000 readings 6.0 s there, 3.8 s apart)."""
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory  # type: ignore[union-attr]
    assert "-XX:-DontCompileHugeMethods" in list(runtime.getRuntimeMXBean().getInputArguments())
    assert "65535" == spark.conf.get("spark.sql.codegen.hugeMethodLimit")
    for parsed in (
        parse_records(
            SENSORS,
            bronze_frame(spark, [("k", text(reading()))], "sensors"),
            DEFAULT_MAX_PAYLOAD_BYTES,
            MAX_FUTURE_SECONDS,
        ),
        parse_records(
            SHIPPED.contracts["users"],
            bronze_frame(spark, [("1", profile())], "users"),
            DEFAULT_MAX_PAYLOAD_BYTES,
            None,
        ),
    ):
        operators = list(_operators(parsed._jdf.queryExecution().executedPlan()))
        projects = [(compiled, out) for name, compiled, out in operators if name == "Project"]
        # The projection that adds the error, and those that stage the fields.
        assert [False] == [compiled for compiled, out in projects if "_error" in out]
        staged = [compiled for compiled, out in projects if "_type_user_id" in out]
        assert staged and all(staged)


def _operators(node: Any, in_stage: bool = False) -> Iterator[tuple[str, bool, set[str]]]:
    """Every physical operator of ``node``'s tree (py4j) but the adapters that feed a
    whole-stage unit: its name, whether it runs in generated whole-stage code, and its
    output columns."""
    name = node.nodeName()
    if name != "InputAdapter":
        yield name, in_stage, {column.name() for column in scala_items(node.output())}
    inside = name.startswith("WholeStageCodegen") or (in_stage and name != "InputAdapter")
    for child in scala_items(node.children()):
        yield from _operators(child, inside)
