"""An adversarial corpus through real Kafka: each record lands where the contract says.

The long-running service keeps running throughout; every record is in bronze, and
in exactly one of silver or quarantine (with the expected error code and the
field named in the detail).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from devstack import KafkaBroker
from pyspark.sql import Row, SparkSession
from pyspark.sql import functions as F

from tests.support.lake import Lake
from tests.support.payloads import profile, reading
from tests.support.service_process import ServiceProcess

pytestmark = pytest.mark.integration

NOW = datetime.now(UTC)
Coordinates = tuple[str, int, int]
PROFILE = ("first_name", "last_name", "dob", "gender", "country", "updated_at")


def doc(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields).encode()


def nested(depth: int) -> bytes:
    return b'{"event_id": "deep", "extra": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}"


@dataclass(frozen=True)
class Case:
    """One corpus record and where it must land: error code (None = silver) and detail field."""

    name: str
    topic: str  # "users" or "sensors"
    key: bytes | None
    value: bytes | None
    code: str | None
    field: str | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


S, U = "sensors", "users"
HUGE = b"0" * 25
LIMIT = 1024 * 1024  # the service's default INGEST_MAX_PAYLOAD_BYTES
NOT_UTF8 = b"\xff\xfe\xfa"
BIG = 64 * 1024
HOSTILE = {"_rescued": "\u0000\"'<b>\\\n", "\u202e": "rtl", "": "empty key"}


def sized(event_id: str, size: int) -> bytes:
    """A valid reading of exactly ``size`` bytes (a rescued ``pad`` field fills it)."""
    base = len(doc(reading(event_id=event_id, pad="")))
    return doc(reading(event_id=event_id, pad="x" * (size - base)))


def timed(event_id: str, event_time: object) -> bytes:
    return doc(reading(event_id=event_id, event_time=event_time))


def with_extra(event_id: str, extra: bytes) -> bytes:
    """A valid reading with an unknown field ``extra`` holding raw JSON ``extra``."""
    return doc(reading(event_id=event_id))[:-1] + b', "extra": ' + extra + b"}"


DUP_KEYS = b'{"event_id": "a", "event_id": "b", "device_id": "d", "sensor_type": "heart_rate"}'
CORPUS = [
    Case("truncated json", S, b"d", doc(reading())[:30], "malformed_json"),
    Case("invalid utf-8", S, b"d", b'{"event_id": "\xff\xfe"}', "malformed_json"),
    Case("trailing garbage", S, b"d", doc(reading()) + b" trailing", "malformed_json"),
    Case("duplicate json keys", S, b"d", DUP_KEYS, "malformed_json"),
    Case("bare NaN", S, b"d", doc(reading()).replace(b"72.5", b"NaN"), "malformed_json"),
    Case("bare Infinity", S, b"d", doc(reading()).replace(b"72.5", b"Infinity"), "malformed_json"),
    Case("nested 5000 deep", S, b"d", nested(5000), "malformed_json"),
    Case("json array", S, b"d", b"[1, 2]", "not_an_object"),
    Case("json string", S, b"d", b'"hello"', "not_an_object"),
    Case("json number", S, b"d", b"42", "not_an_object"),
    Case("json null", S, b"d", b"null", "not_an_object"),
    Case("empty value", S, b"d", b"", "empty_payload"),
    Case("null value on sensors", S, b"d", None, "empty_payload"),
    Case("2 MiB value", S, b"d", doc(reading(pad="x" * (2 * 1024 * 1024))), "payload_too_large"),
    Case("missing event_id", S, b"d", doc(reading(event_id=None)), "missing_field", "event_id"),
    Case("missing device_id", S, b"d", doc(reading(device_id=None)), "missing_field", "device_id"),
    Case("missing sensor_type", S, b"d", doc(reading(sensor_type=None)), "missing_field",
         "sensor_type"),
    Case("missing event_time", S, b"d", doc(reading(event_time=None)), "missing_field",
         "event_time"),
    Case("missing heart rate value", S, b"d", doc(reading(value=None)), "missing_field", "value"),
    Case("accelerometer without z", S, b"d",
         doc(reading(sensor_type="accelerometer", value=None, x=1.0, y=2.0)), "missing_field", "z"),
    Case("quoted number", S, b"d", doc(reading(value="72")), "type_mismatch", "value"),
    Case("quoted NaN", S, b"d", doc(reading(value="NaN")), "type_mismatch", "value"),
    Case("boolean value", S, b"d", doc(reading(value=True)), "type_mismatch", "value"),
    Case("numeric event_id", S, b"d", doc(reading(event_id=12)), "type_mismatch", "event_id"),
    Case("string user_id", S, b"d", doc(reading(user_id="1")), "type_mismatch", "user_id"),
    Case("garbage timestamp", S, b"d", doc(reading(event_time="yesterday")), "type_mismatch",
         "event_time"),
    Case("unknown sensor_type", S, b"d", doc(reading(sensor_type="pressure")), "invalid_value",
         "sensor_type"),
    Case("empty event_id", S, b"d", doc(reading(event_id="")), "invalid_value", "event_id"),
    Case("unknown danger_level", S, b"d", doc(reading(danger_level="EXTREME")), "invalid_value",
         "danger_level"),
    Case("negative user_id", S, b"d", doc(reading(user_id=-5)), "out_of_range", "user_id"),
    Case("huge user_id", S, b"d", doc(reading()).replace(b'"user_id": 7', b'"user_id": 7' + HUGE),
         "out_of_range", "user_id"),
    Case("huge number", S, b"d", doc(reading()).replace(b"72.5", b"1e400"), "out_of_range",
         "value"),
    Case("heart rate 400", S, b"d", doc(reading(value=400.0)), "out_of_range", "value"),
    Case("temperature -80", S, b"d", doc(reading(sensor_type="temperature", value=-80.0)),
         "out_of_range", "value"),
    Case("far future", S, b"d", doc(reading(event_time="2999-01-01T00:00:00Z")),
         "event_time_in_future", "event_time"),
    Case("missing field and bad type: missing wins", S, b"d",
         doc(reading(event_id=None, value="x")), "missing_field", "event_id"),
    Case("far past is valid", S, b"d",
         doc(reading(event_id="past", event_time="1971-02-03T04:05:06Z")), None),
    Case("epoch millis is valid", S, b"d",
         doc(reading(event_id="millis", event_time=int(NOW.timestamp() * 1000))), None),
    Case("offset time is valid", S, b"d",
         doc(reading(event_id="offset",
                     event_time=(NOW + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%S+02:00"))),
         None),
    Case("byte-order mark is valid", S, b"d", b"\xef\xbb\xbf" + doc(reading(event_id="bom")), None),
    Case("extra fields are rescued", S, b"d",
         doc(reading(event_id="extra", firmware="1.2", battery={"pct": 80})), None),
    Case("tombstone of a user", U, b"7", None, None),
    Case("tombstone with a bad key", U, b"abc", None, "type_mismatch", "key"),
    Case("user without updated_at", U, b"8", profile(user_id=8, updated_at=None).encode(),
         "missing_field", "updated_at"),
    Case("user with unknown gender", U, b"8", profile(user_id=8, gender="Q").encode(),
         "invalid_value", "gender"),
    Case("user born 1800", U, b"8", profile(user_id=8, dob="1800-01-01").encode(),
         "out_of_range", "dob"),
    Case("user with 3-letter country", U, b"8", profile(user_id=8, country="FRA").encode(),
         "invalid_value", "country"),
    Case("user with a 300-char name", U, b"8", profile(user_id=8, first_name="n" * 300).encode(),
         "out_of_range", "first_name"),
    Case("valid user", U, b"9", profile(user_id=9).encode(), None),
    # Bytes that are not text, and sizes at the limits: bronze keeps them exactly.
    Case("key not utf-8", S, NOT_UTF8, doc(reading(event_id="key-bytes")), None),
    Case("header not utf-8", S, b"d", doc(reading(event_id="header-bytes")), None,
         headers=(("trace", NOT_UTF8), ("empty", b""))),
    Case("huge key", S, b"k" * BIG, doc(reading(event_id="huge-key")), None),
    Case("huge header", S, b"d", doc(reading(event_id="huge-header")), None,
         headers=(("blob", b"h" * BIG),)),
    Case("value exactly at the limit", S, b"d", sized("at-limit", LIMIT), None),
    Case("value one byte over the limit", S, b"d", sized("over-limit", LIMIT + 1),
         "payload_too_large"),
    Case("tombstone with a non-utf-8 key", U, NOT_UTF8, None, "type_mismatch", "key"),
    Case("upsert with a non-utf-8 key", U, NOT_UTF8, profile(user_id=10).encode(), None),
    # Shapes.
    Case("nested 200 deep is rescued", S, b"d",
         with_extra("deep-ok", b'{"a": ' * 200 + b"1" + b"}" * 200), None),
    Case("5000 unknown fields are rescued", S, b"d",
         doc(reading(event_id="wide", **{f"f{i}": i for i in range(5000)})), None),
    Case("hostile rescued content", S, b"d", doc(reading(event_id="hostile", **HOSTILE)), None),
    Case("minus huge number", S, b"d", doc(reading()).replace(b"72.5", b"-1e400"),
         "out_of_range", "value"),
    # Timestamps at the edges of every accepted format.
    Case("iso with nanoseconds", S, b"d", timed("nanos", "2024-01-02T03:04:05.123456789Z"), None),
    Case("iso with ten fraction digits", S, b"d", timed("t10", "2024-01-02T03:04:05.1234567891Z"),
         "type_mismatch", "event_time"),
    Case("iso with +hhmm", S, b"d", timed("hhmm", "2024-01-02T03:04:05+0530"), None),
    Case("iso with +hh", S, b"d", timed("hh", "2024-01-02T03:04:05-03"), None),
    Case("iso with a space and no zone", S, b"d", timed("space", "2024-01-02 03:04:05"), None),
    Case("iso month 13", S, b"d", timed("m13", "2024-13-02T03:04:05Z"), "type_mismatch",
         "event_time"),
    Case("iso year 1", S, b"d", timed("year1", "0001-01-01T00:00:00Z"), None),
    Case("iso year 9999", S, b"d", timed("year9999", "9999-12-31T23:59:59.999999Z"),
         "event_time_in_future", "event_time"),
    Case("epoch millis of year 1", S, b"d", timed("ms-min", -62_135_596_800_000), None),
    Case("epoch millis before year 1", S, b"d", timed("ms-below", -62_135_596_800_001),
         "out_of_range", "event_time"),
    Case("epoch millis of year 9999", S, b"d", timed("ms-max", 253_402_300_799_999),
         "event_time_in_future", "event_time"),
    Case("epoch millis after year 9999", S, b"d", timed("ms-above", 253_402_300_800_000),
         "out_of_range", "event_time"),
    Case("fractional epoch millis", S, b"d", timed("ms-float", 1.7e12), "type_mismatch",
         "event_time"),
]  # fmt: skip


def produce(lake: Lake) -> dict[Coordinates, Case]:
    """Produce the corpus; return each case by the Kafka coordinates it got."""
    landed: dict[Coordinates, Case] = {}
    errors: list[str] = []
    producer = Producer(
        {"bootstrap.servers": lake.bootstrap_servers, "message.max.bytes": 4 * 1024 * 1024}
    )
    topics = {S: lake.sensors_topic, U: lake.users_topic}
    for case in CORPUS:

        def delivered(err: KafkaError | None, msg: Message, case: Case = case) -> None:
            if err is not None:
                errors.append(f"{case.name}: {err}")
            else:
                landed[(str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0))] = case

        producer.produce(
            topics[case.topic],
            key=case.key,
            value=case.value,
            headers=list(case.headers),
            on_delivery=delivered,
        )
    assert 0 == producer.flush(30)
    assert [] == errors
    return landed


def allow_large_messages(broker: KafkaBroker, topic: str) -> None:
    admin: AdminClient = broker.admin()
    entry = ConfigEntry(
        "max.message.bytes", str(4 * 1024 * 1024), incremental_operation=AlterConfigOpType.SET
    )
    resource = ConfigResource("topic", topic, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def implied_user(case: Case, where: Coordinates) -> tuple[int, dict[str, Any]]:
    """The user id and silver/users state a valid users record implies as its user's only
    change: a tombstone, its key's user deleted without a profile; an upsert, its profile."""
    fields: dict[str, Any] = {}
    if case.value is None:
        assert case.key is not None
        user_id = int(case.key)
    else:
        fields = json.loads(case.value)
        user_id = fields["user_id"]
    dob, updated_at = fields.get("dob"), fields.get("updated_at")
    state = {
        **{name: fields.get(name) for name in PROFILE},
        "dob": dob and date.fromisoformat(dob),
        "updated_at": updated_at
        and datetime.fromisoformat(updated_at).astimezone(UTC).replace(tzinfo=None),
        "is_deleted": case.value is None,
        "has_deleted_at": case.value is None,
        "lineage": where,
    }
    return user_id, state


def user_state(row: Row) -> dict[str, Any]:
    """A silver/users row as `implied_user` states it (timestamps are UTC: tests/__init__)."""
    return {
        **{name: row[name] for name in PROFILE},
        "is_deleted": row.is_deleted,
        "has_deleted_at": row.deleted_at is not None,
        "lineage": (row.kafka_topic, row.kafka_partition, row.kafka_offset),
    }


def wait_for_rows(
    lake: Lake, table: str, rows: int, driver: ServiceProcess, timeout: float = 600
) -> None:
    """Until ``table`` holds ``rows`` rows (the counts are checked exactly afterwards): the
    bound is for a loaded machine, where a driver's first batches took over 4 minutes."""
    deadline = time.monotonic() + timeout
    count = 0
    while time.monotonic() < deadline:
        count = lake.rows(table)
        if count >= rows:
            return
        time.sleep(2)
    raise AssertionError(
        f"{table} has {count} of {rows} rows after {timeout}s:\n{driver.log_text()[-3000:]}"
    )


def test_every_corpus_record_lands_where_the_contract_says_and_the_service_keeps_running(
    spark: SparkSession, lake: Lake, kafka_broker: KafkaBroker
) -> None:
    assert len(CORPUS) >= 30 and len({c.name for c in CORPUS}) == len(CORPUS)
    allow_large_messages(kafka_broker, lake.sensors_topic)
    driver = lake.service("corpus").start()
    try:
        driver.wait_for_log('"event": "running"', timeout=180)
        by_coordinates = produce(lake)
        valid_readings = sum(1 for c in CORPUS if c.topic == S and c.code is None)
        valid_users = sum(1 for c in CORPUS if c.topic == U and c.code is None)
        # Quarantine and silver are written after bronze, in the same micro-batch.
        rejected = sum(1 for c in CORPUS if c.code)
        wait_for_rows(lake, "silver/quarantine", rejected, driver)
        wait_for_rows(lake, "silver/sensor_readings", valid_readings, driver)
        wait_for_rows(lake, "silver/users", valid_users, driver)
        assert driver.alive(), driver.log_text()[-3000:]
        driver.terminate()
        assert 0 == driver.wait(timeout=120), driver.log_text()[-3000:]
    finally:
        driver.cleanup()

    def coordinates(table: str) -> dict[Coordinates, Any]:
        df = spark.read.format("delta").load(lake.table(table))
        # Event times as microseconds: PySpark cannot turn year 1 into a datetime.
        times = [f.name for f in df.schema.fields if f.name == "event_time"]
        rows = df.withColumns({t: F.unix_micros(t) for t in times}).collect()
        return {(r.kafka_topic, r.kafka_partition, r.kafka_offset): r for r in rows}

    quarantine = coordinates("silver/quarantine")
    readings = coordinates("silver/sensor_readings")
    users = {
        r.user_id: user_state(r)
        for r in spark.read.format("delta").load(lake.table("silver/users")).collect()
    }
    expected_users = dict(
        implied_user(case, where)
        for where, case in by_coordinates.items()
        if case.topic == U and case.code is None
    )
    # One valid record per user, so that each record's effect is its user's whole row.
    assert valid_users == len(expected_users)
    user_lineage = {state["lineage"] for state in users.values()}
    wrong = []
    for where, case in by_coordinates.items():
        row = quarantine.get(where)
        actual_code = row.error_code if row is not None else None
        detail_ok = case.field is None or (
            row is not None and str(row.error_detail).startswith(case.field)
        )
        if case.topic == S:
            in_silver = where in readings
        elif case.code is None:
            user_id, state = implied_user(case, where)
            in_silver = state == users.get(user_id)
        else:
            in_silver = where in user_lineage
        if actual_code != case.code or not detail_ok or (case.code is None) != in_silver:
            wrong.append((case.name, case.code, actual_code, row and row.error_detail))
    assert [] == wrong
    # Every user of the corpus: a user with only invalid records (8) has no row at all.
    assert expected_users == users
    # Quarantine keeps each record's exact bytes, and their text only where they are UTF-8.
    kept = {
        case.name: (_bytes(quarantine[where].value), quarantine[where].value_text)
        for where, case in by_coordinates.items()
        if case.code is not None
    }
    assert {
        case.name: (case.value, _text(case.value))
        for case in by_coordinates.values()
        if case.code is not None
    } == kept
    assert DUP_KEYS in {raw for raw, _ in kept.values()}
    rescued = {r.event_id: json.loads(r._rescued) for r in readings.values() if r._rescued}
    assert {"battery": {"pct": 80}, "firmware": "1.2"} == rescued["extra"]
    assert HOSTILE == rescued["hostile"]
    assert {f"f{i}": i for i in range(5000)} == rescued["wide"]
    assert 200 == _depth(rescued["deep-ok"]["extra"])
    # Bronze keeps every record's key, value and headers exactly, and their text only
    # where they are UTF-8.
    bronze = {**coordinates("bronze/sensors"), **coordinates("bronze/users")}
    assert {
        where: (case.key, case.value, list(case.headers), _text(case.key), _text(case.value))
        for where, case in by_coordinates.items()
    } == {
        where: (
            _bytes(row.key),
            _bytes(row.value),
            [(h.key, bytes(h.value)) for h in row.headers or []],
            row.key_text,
            row.value_text,
        )
        for where, row in bronze.items()
    }
    # Every table reads whole, validated, with another Delta reader (delta-rs, Arrow).
    spark_rows = {
        name: spark.read.format("delta").load(lake.table(name)).count()
        for name in lake.delta_rs_rows()
    }
    assert spark_rows == lake.delta_rs_rows()
    assert len(CORPUS) == spark_rows["bronze/sensors"] + spark_rows["bronze/users"]


def _depth(value: Any) -> int:
    """How many objects are nested in ``value``, itself included."""
    return 1 + _depth(next(iter(value.values()))) if isinstance(value, dict) else 0


def _bytes(raw: bytearray | None) -> bytes | None:
    return bytes(raw) if raw is not None else None


def _text(raw: bytes | None) -> str | None:
    """The text view a table keeps of ``raw``: its UTF-8 text, or null."""
    try:
        return raw.decode() if raw is not None else None
    except UnicodeDecodeError:
        return None
