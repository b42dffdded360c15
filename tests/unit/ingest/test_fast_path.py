"""The typed fast path: which contracts take it, which records it decides, and that it
decides them as the exact checks do (verdict, code, detail and every typed value)."""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from service.contracts.loading import parse_contract
from service.contracts.model import Contract
from service.ingest.batch import summarize
from service.ingest.fast_path import FAST, FastPath
from service.ingest.modes import DECIDED, OUTCOME, Validation, parse_records
from service.ingest.modes.dedup import id_hash
from service.ingest.modes.events import Events
from service.ingest.validation import split_valid_invalid
from tests.support.contracts import DRAFT, changed, orders, shipped
from tests.support.records import HEX, bronze_frame

MAX_PAYLOAD_BYTES = 4096
SKEW = 300


def contract_of(document: dict[str, Any]) -> Contract:
    """``document`` as a contract."""
    return parse_contract(document, "probes.json", "probes", {})


# A contract with every feature the fast path decides: bounds of each kind, an enumeration,
# a pattern, lengths, unions, a date bounded by today, a
# nested object with a required property, a conditional, an event time with a future bound.
PROBES = {
    "$schema": DRAFT,
    "type": "object",
    "required": ["id", "at", "count"],
    "properties": {
        "id": {"type": "string", "minLength": 1, "maxLength": 8},
        "at": {"type": ["string", "integer"], "format": "date-time"},
        "count": {"type": "integer", "minimum": 1, "exclusiveMaximum": 100},
        "ratio": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1},
        "kind": {"type": "string", "enum": ["a", "b"]},
        "code": {"type": ["string", "null"], "pattern": "^[A-Z]{2}$"},
        "flag": {"type": ["boolean", "null"]},
        "born": {
            "type": ["string", "null"],
            "format": "date",
            "x-lakehouse": {"minimum": "1900-01-01", "maximum": "today"},
        },
        "both": {"type": ["integer", "number", "null"]},
        "place": {
            "type": ["object", "null"],
            "required": ["city"],
            "properties": {"city": {"type": ["string", "null"]}, "zip": {"type": "string"}},
        },
    },
    "allOf": [
        {
            "if": {"required": ["kind"], "properties": {"kind": {"const": "a"}}},
            "then": {
                "required": ["ratio"],
                "properties": {"ratio": {"type": "number", "minimum": 0.5}},
            },
        }
    ],
    "x-lakehouse": {
        "name": "probes",
        "mode": "events",
        "id": "id",
        "event_time": "at",
        "max_future_seconds": SKEW,
    },
}
BASE = (
    '{"id": "x1", "at": "2024-05-01T10:00:00Z", "count": 5, "ratio": 0.7, "kind": "a",'
    ' "code": "FR", "flag": true, "both": 2,'
    ' "place": {"city": "Paris", "zip": "75001"}}'
)


def with_and_without_fast_path(contract: Contract, bronze: DataFrame) -> list[list[Row]]:
    """``bronze``'s outcome with the typed fast path and with the exact checks alone, by
    offset; asserts they are the same (repr tells -0.0 from 0.0, which compare equal)."""
    both = [
        parse_records(contract, bronze, MAX_PAYLOAD_BYTES, SKEW, fast=f)
        .select("kafka_offset", "error_code", "error_detail", "record")
        .orderBy("kafka_offset")
        .collect()
        for f in (True, False)
    ]
    assert [repr(r) for r in both[0]] == [repr(r) for r in both[1]]
    return both


def edited(**members: str) -> str:
    """`BASE` with ``members`` (JSON texts) replacing or adding its members."""
    text = BASE
    for name, value in members.items():
        document = json.loads(text)
        if name in document:
            old = json.dumps(document[name], ensure_ascii=False)
            text = text.replace(f'"{name}": {old}', f'"{name}": {value}', 1)
        else:
            text = text[:-1] + f', "{name}": {value}' + "}"
    return text


# (payload, whether the fast path decides it): every fast one is valid; the others are
# the cases a typed parse gets wrong (numbers as strings, 1.0 and 1e2 as integers, -0,
# huge exponents, duplicate and case-changed keys, nested nulls, ...), valid or not.
CASES: list[tuple[str, bool]] = [
    (BASE, True),
    (edited(at="1714557600000"), True),
    (edited(at='"2024-05-01 10:00:00"'), True),
    (edited(at='"2024-05-01T10:00:00.123456789+01:00"'), True),
    (edited(at='"2024-05-01T10:00:00+0130"'), True),
    (edited(at='"2024-05-01T06:00:00-05"'), True),
    (edited(at='"2024-05-01T10:00:00"'), True),
    (edited(at='"2024-05-01T12:04:00Z"'), True),
    (edited(at='"2024-02-29T10:00:00.5-00:00"'), True),
    (edited(born='"2000-02-29"'), True),
    (edited(born='"1900-01-01"'), True),
    (edited(born="null"), True),
    (edited(born='"1899-12-31"'), False),
    (edited(born='"2999-01-01"'), False),
    (edited(born='"2001-02-29"'), False),
    (edited(born='"2000-1-01"'), False),
    (edited(born='"0000-01-01"'), False),
    (edited(born='"2000-01-01T00:00:00Z"'), False),
    (edited(born="20000101"), False),
    (edited(at='"2026-13-01T00:00:00Z"'), False),
    (edited(at='"2023-02-29T10:00:00Z"'), False),
    (edited(at='"2024-05-01T24:00:00Z"'), False),
    (edited(at='"2024-05-01T10:00:60Z"'), False),
    (edited(at='"2024-05-01T10:00:00+18:30"'), False),
    (edited(at='"2024-05-01T10:00:00+01:"'), False),
    (edited(at='"2024-05-01T10:00:00.1234567890Z"'), False),
    (edited(at='"0001-01-01T00:30:00+01:00"'), False),
    (edited(at='"9999-12-31T23:59:59-01:00"'), False),
    (edited(at='"2024-05-01t10:00:00z"'), False),
    (edited(at='"2024-05-01T12:10:00Z"'), False),
    (edited(at='"1714557600000"'), False),
    (edited(at="-62135596800001"), False),
    (edited(at="1.5"), False),
    (edited(count='"5"'), False),
    (edited(count="5.0"), False),
    (edited(count="1e2"), False),
    (edited(count="-0"), False),
    (edited(count="99"), True),
    (edited(count="100"), False),
    (edited(count="9223372036854775808"), False),
    (edited(count="1e400"), False),
    (edited(ratio="-0.0"), False),
    (edited(ratio="1e-400"), False),
    (edited(ratio="1e400"), False),
    (edited(ratio="0.5"), True),
    (edited(ratio="5e-1"), True),
    (edited(ratio="0.49"), False),
    (edited(ratio="0.6000000000000000001"), False),
    (edited(ratio="null"), False),
    (edited(ratio='"0.7"'), False),
    (edited(kind='"A"'), False),
    (edited(kind='"b"', ratio="null"), True),
    (edited(kind="null"), False),
    (edited(code='"fr"'), False),
    (edited(code='"FR\\n"'), False),
    (edited(flag='"true"'), False),
    (edited(flag="1"), False),
    (edited(both="5.5"), True),
    # Zeros: without an exponent the exact validation reads an unsigned decimal zero.
    (edited(both="0.0"), True),
    (edited(both="-0.0"), True),
    (edited(both="-0.000"), True),
    (edited(both="-0e0"), True),
    (edited(both="0.0E3"), True),
    (edited(both='"5"'), False),
    (edited(place="null"), True),
    (edited(place='{"city": null}'), True),
    (edited(place="{}"), False),
    (edited(place='{"city": "P", "zip": null}'), False),
    (edited(place='{"city": "P", "extra": 1}'), False),
    (edited(place='{"City": "P"}'), False),
    (BASE.replace('"id": "x1"', '"id": "x1", "id": "x2"'), False),
    (BASE.replace('"id": "x1"', '"ID": "x1"'), False),
    (edited(extra="1"), False),
    (edited(id='"\\ud800"'), False),
    (edited(id='"\\ud83d\\ude00"'), False),
    (edited(id='"\\u0041"'), True),
    (edited(id='""'), False),
    (edited(id='"123456789"'), False),
    ("\ufeff" + BASE, False),
    # UTF-16 (valid UTF-8 holding NULs) and invalid UTF-8: the exact checks decide.
    (HEX + BASE.encode("utf-16-le").hex(), False),
    (HEX + BASE.encode("utf-16-be").hex(), False),
    (HEX + BASE.encode().replace(b"x1", b"x\xc3").hex(), False),
    (BASE + " {}", False),
    (BASE + " \n", True),
    ("[]", False),
    ("null", False),
    ("", False),
]


def test_a_contract_takes_the_fast_path_when_the_checker_knows_all_its_features() -> None:
    assert FastPath.of(contract_of(PROBES)) is not None
    assert FastPath.of(contract_of(shipped("sensors"))) is not None
    assert FastPath.of(contract_of(orders())) is not None
    assert FastPath.of(contract_of(shipped("users"))) is not None
    # Framing; an array; a number enumerated; a date in a then; a condition on a nested
    # field: every record checked exactly.
    dated = {"type": "string", "format": "date"}
    assert FastPath.of(contract_of(changed(PROBES, lambda d: d["allOf"][0]["then"][
        "properties"].update(born=dated)))) is None  # fmt: skip
    assert FastPath.of(contract_of(orders(framing="confluent"))) is None
    tags = {"type": "array", "items": {"type": "string"}}
    assert FastPath.of(contract_of(changed(orders(), lambda d: d["properties"].update(
        tags=tags)))) is None  # fmt: skip
    assert FastPath.of(contract_of(changed(orders(), lambda d: d["properties"]["amount"].update(
        enum=[1, 2])))) is None  # fmt: skip


def test_the_fast_path_decides_as_the_exact_checks(spark: SparkSession) -> None:
    contract = contract_of(PROBES)
    path = FastPath.of(contract)
    assert path is not None
    payloads = [payload for payload, _ in CASES]
    bronze = bronze_frame(spark, [(None, p) for p in payloads], "probes").cache()

    marked = path.mark(bronze, MAX_PAYLOAD_BYTES, SKEW, F.current_date())
    fast = {r.kafka_offset for r in marked.where(FAST).select("kafka_offset").collect()}
    expected = {offset for offset, (_, takes) in enumerate(CASES) if takes}
    shown = {payloads[o] for o in fast ^ expected}
    assert fast == expected, shown

    both = with_and_without_fast_path(contract, bronze)
    # The ids a small batch's summary and its exact checks collect (the driver's recent
    # ids) are those of its silver rows, whichever path decided each row.
    validation = Validation.of(contract, MAX_PAYLOAD_BYTES, SKEW)
    marked = validation.mark(bronze)
    ids = Events(contract).valid_id_hash()
    summary = summarize(marked, ids)
    assert summary.ids is not None
    checked = validation.exact(marked.where(~F.col(DECIDED)).drop(DECIDED, *OUTCOME))
    exact_ids = [r.h for r in checked.select(ids.alias("h")).collect() if r.h is not None]
    valid, _ = split_valid_invalid(validation.complete(marked))
    silver = Events(contract).to_silver(valid).select(id_hash("id").alias("h"))
    assert sorted(r.h for r in silver.collect()) == sorted([*summary.ids, *exact_ids])
    assert exact_ids and (len(expected), valid.count()) == (
        len(summary.ids),
        len(summary.ids) + len(exact_ids),
    )
    assert all(both[0][o].error_code is None for o in expected)
    base = both[0][0].record
    assert (base["id"], base["count"], base["ratio"], base["code"], base["both"]) == (
        "x1",
        5,
        0.7,
        "FR",
        2.0,
    )
    assert (base.place_city, base.place_zip) == ("Paris", "75001")
    # The same instant as epoch milliseconds, with a space, without a zone.
    for same in (edited(at="1714557600000"), edited(at='"2024-05-01 10:00:00"')):
        assert both[0][payloads.index(same)].record.at == base.at


def test_a_tombstone_whose_key_names_an_entity_is_decided_as_the_exact_checks_decide(
    spark: SparkSession,
) -> None:
    contract = contract_of(shipped("users"))
    upsert = '{"user_id": 7, "updated_at": "2024-05-01T10:00:00Z", "dob": "1990-02-01"}'
    records: list[tuple[str | None, str | None]] = [
        ("7", None),
        ("7", upsert),
        ("0", None),
        ("-3", None),
        ("9223372036854775808", None),
        ("abc", None),
        ("", None),
        (HEX + "ff", None),
        (None, None),
    ]
    bronze = bronze_frame(spark, records, "users").cache()
    marked = Validation.of(contract, MAX_PAYLOAD_BYTES, SKEW).mark(bronze)
    decided = {r.kafka_offset for r in marked.where(DECIDED).select("kafka_offset").collect()}
    assert {0, 1} == decided
    both = with_and_without_fast_path(contract, bronze)
    tombstone = both[0][0]
    assert (None, True, 7) == (
        tombstone.error_code,
        tombstone.record.is_tombstone,
        tombstone.record.user_id,
    )
    assert all(r.error_code is not None for r in both[0][2:])
    bronze.unpersist()
