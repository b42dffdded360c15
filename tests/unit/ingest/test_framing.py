"""Values framed by a schema registry serializer (``x-lakehouse.framing``): Confluent's wire
format, magic byte 0 and a 4-byte big-endian schema id before the JSON. Bronze keeps the
exact bytes; validation reads the JSON after the header; silver keeps the schema id."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from service.contracts.loading import parse_contract
from service.contracts.model import Contract
from service.ingest.modes import parse_records
from service.ingest.modes.entities import Entities
from service.ingest.modes.events import Events
from service.ingest.validation import split_valid_invalid
from service.lake.delta import ensure_table
from service.lake.merge import merge_once
from service.lake.tables import contract_tables
from tests.support.contracts import orders, shipped
from tests.support.lake import LOCAL_FILES
from tests.support.payloads import profile
from tests.support.records import HEX, bronze_frame

ORDER = {"order_id": "o-1", "placed_at": "2024-05-01T00:00:00Z", "amount": 5}


def framed(schema_id: int, payload: bytes) -> str:
    """``payload`` behind Confluent's header, as `bronze_frame`'s hex value."""
    return HEX + (b"\x00" + schema_id.to_bytes(4, "big", signed=True) + payload).hex()


def contract(document: dict[str, Any], framing: str | None) -> Contract:
    extension = document["x-lakehouse"]
    if framing is not None:
        extension["framing"] = framing
    return parse_contract(document, f"/contracts/{extension['name']}.json", "c", {})


RECORDS = {
    "plain": json.dumps(ORDER),
    "framed": framed(17, json.dumps(ORDER).encode()),
    "framed-negative-id": framed(-2, json.dumps(ORDER).encode()),
    "framed-not-json": framed(17, b"{oops"),
    "framed-empty": framed(17, b""),
    "framed-not-utf8": framed(17, b'{"order_id": "\xff"}'),
    "short": HEX + "00000011",
}
NOT_FRAMED = (
    "malformed_json",
    "value: not framed by a schema registry serializer (magic byte 0 and a 4-byte schema id"
    " before the JSON), as the contract's framing confluent says",
)
WHOLE = "value: not a single well-formed JSON document"
FRAMED_17 = (
    "malformed_json",
    "value: framed by a schema registry serializer (magic byte 0, schema id 17) where the"
    " contract's framing is none (x-lakehouse.framing)",
)
OK_17, OK_MINUS_2 = (None, None, 17), (None, None, -2)
EXPECTED: dict[str, dict[str, tuple[Any, ...]]] = {
    "none": {
        "plain": (None, None),
        "framed": FRAMED_17,
        "framed-negative-id": (FRAMED_17[0], FRAMED_17[1].replace("id 17", "id -2")),
        "framed-not-json": FRAMED_17,
        "framed-empty": FRAMED_17,
        "framed-not-utf8": FRAMED_17,
        "short": ("malformed_json", WHOLE),
    },
    "confluent": {
        "plain": (*NOT_FRAMED, None),
        "framed": OK_17,
        "framed-negative-id": OK_MINUS_2,
        "framed-not-json": ("malformed_json", WHOLE, None),
        "framed-empty": ("empty_payload", "value: empty", None),
        "framed-not-utf8": ("malformed_json", "value: not valid UTF-8", None),
        "short": (*NOT_FRAMED, None),
    },
    "auto": {
        "plain": (None, None, None),
        "framed": OK_17,
        "framed-negative-id": OK_MINUS_2,
        "framed-not-json": ("malformed_json", WHOLE, None),
        "framed-empty": ("empty_payload", "value: empty", None),
        "framed-not-utf8": ("malformed_json", "value: not valid UTF-8", None),
        "short": ("malformed_json", WHOLE, None),
    },
}


@pytest.mark.parametrize("framing", ["none", "confluent", "auto"])
def test_each_framing_reads_the_json_after_the_header_or_says_why_not(
    spark: SparkSession, framing: str
) -> None:
    orders_contract = contract(orders(), None if framing == "none" else framing)
    bronze = bronze_frame(spark, [(name, value) for name, value in RECORDS.items()], "orders")

    parsed = parse_records(orders_contract, bronze, 4096, None)
    valid, _ = split_valid_invalid(parsed)
    silver = {
        r["kafka_offset"]: r.asDict() for r in Events(orders_contract).to_silver(
            valid.withColumn("ingested_at", valid["kafka_timestamp"])).collect()
    }  # fmt: skip

    rows = {r["key_text"]: r for r in parsed.collect()}
    got = {
        name: (r["error_code"], r["error_detail"])
        + (
            ()
            if framing == "none"
            else (r["record"]["_schema_id"] if r["error_code"] is None else None,)
        )
        for name, r in rows.items()
    }
    assert EXPECTED[framing] == got
    # Bronze's bytes are the record's, header and all; silver has the payload's columns.
    assert {name: value for name, value in RECORDS.items()} == {
        name: HEX + r["value"].hex() if r["value"][:1] == b"\x00" else r["value"].decode()
        for name, r in rows.items()
    }
    assert {("o-1", 5.0)} == {(s["order_id"], s["amount"]) for s in silver.values()}
    assert all(("_schema_id" in row) == (framing != "none") for row in silver.values())
    if framing != "none":
        kept = [v[2] for v in EXPECTED[framing].values() if v[0] is None]
        assert sorted(kept, key=str) == sorted((s["_schema_id"] for s in silver.values()), key=str)


def test_a_framed_entity_keeps_the_schema_id_of_its_newest_change(
    spark: SparkSession, tmp_path: Path
) -> None:
    users = contract(shipped("users"), "auto")
    uri = f"file:{tmp_path}/silver/users"
    ensure_table(LOCAL_FILES, uri, contract_tables(users).silver)
    older = framed(3, profile(first_name="Ada", updated_at="2024-04-01T00:00:00Z").encode())
    newer = framed(4, profile(first_name="Augusta", updated_at="2024-04-02T00:00:00Z").encode())
    bronze = bronze_frame(spark, [("1", newer), ("1", older), ("2", profile(user_id=2))], "users")
    valid, invalid = split_valid_invalid(parse_records(users, bronze, 4096, None))
    mode = Entities(users)

    merge_once(mode.latest_changes(valid), uri, "framing-test", 1, mode.merge_clauses())

    assert 0 == invalid.count()
    rows = {r["user_id"]: r for r in spark.read.format("delta").load(uri).collect()}
    assert ("Augusta", 4) == (rows[1]["first_name"], rows[1]["_schema_id"])
    assert rows[2]["_schema_id"] is None  # unframed, read whole under auto


def test_framing_is_one_of_none_confluent_auto() -> None:
    with pytest.raises(Exception, match="/x-lakehouse/framing: 'avro' is not one of"):
        contract(orders(), "avro")
    assert "none" == contract(orders(), None).framing
