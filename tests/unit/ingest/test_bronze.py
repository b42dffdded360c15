"""to_records: Kafka source rows become bronze rows, bytes and coordinates intact."""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import SparkSession

from service.ingest.bronze import to_records
from service.lake.schemas import KAFKA_RECORD
from tests.support.records import KAFKA_SOURCE

AT = datetime(2026, 11, 21, 12, 0, 0)


def test_to_records_keeps_every_record_with_its_coordinates(spark: SparkSession) -> None:
    source = spark.createDataFrame(
        [
            (b"7", b'{"user_id": 7}', "users", 2, 41, AT, [("trace", b"abc")]),
            (b"7", None, "users", 2, 42, AT, None),
            (None, b"\xff\xfe not utf-8", "users", 0, 5, AT, []),
        ],
        KAFKA_SOURCE,
    )
    rows = to_records(source).orderBy("kafka_partition", "kafka_offset").collect()
    assert [
        (None, 0, 5, []),
        (bytearray(b"7"), 2, 41, [("trace", bytearray(b"abc"))]),
        (bytearray(b"7"), 2, 42, None),
    ] == [(r.key, r.kafka_partition, r.kafka_offset, r.headers) for r in rows]
    assert [bytearray(b"\xff\xfe not utf-8"), bytearray(b'{"user_id": 7}'), None] == [
        r.value for r in rows
    ]
    assert [(None, None), ("7", '{"user_id": 7}'), ("7", None)] == [
        (r.key_text, r.value_text) for r in rows
    ]
    assert {"users"} == {r.kafka_topic for r in rows}
    assert {AT} == {r.kafka_timestamp for r in rows}


def test_to_records_has_exactly_the_bronze_columns_but_the_stamp(spark: SparkSession) -> None:
    source = spark.createDataFrame([], KAFKA_SOURCE)
    assert [(f.name, f.dataType) for f in KAFKA_RECORD.fields] == [
        (f.name, f.dataType) for f in to_records(source).schema.fields
    ]


def test_invalid_utf8_keeps_its_bytes_and_has_no_text(spark: SparkSession) -> None:
    raw = b'{"a": "\xff"}'
    key = b"\xc3\x28"  # an invalid two-byte sequence
    source = spark.createDataFrame([(key, raw, "s", 0, 0, AT, None)], KAFKA_SOURCE)
    [row] = to_records(source).collect()
    assert (bytes(row.key), bytes(row.value)) == (key, raw)
    assert (row.key_text, row.value_text) == (None, None)
