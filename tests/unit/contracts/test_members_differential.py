"""Arrays and maps against a JSON Schema validator: each generated record's verdict (silver
or quarantine) through `parse_records` equals ``jsonschema.Draft202012Validator``'s on the
contract's document.

The corpus, from a fixed seed: 100,000 records of a contract with arrays of strings (a pattern,
lengths, unique), of nullable numbers (bounds, unique), of date-times, of integers in a
nested object, and a map of integers; each member drawn from the right values, values of
other JSON types, nulls, nested objects and arrays, repeats, and sizes on both sides of
the bounds. It avoids what docs/contracts.md ("Differences from JSON Schema") says the
product decides otherwise and `test_contract_differential` covers: integers written with a
fraction (``-0.0`` among integers), integers beyond 64 bits, and strings a ``date-time``
only notes (the validator asserts no format). An array of objects (required, unknown and
mistyped properties, null elements) is among them, and ``additionalProperties`` schemas
checking the other members of the document and of a nested object, whose valid records'
other members silver keeps (``shipping_others``).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

from jsonschema import Draft202012Validator
from pyspark.sql import SparkSession

from service.contracts.loading import parse_contract
from service.ingest.modes import parse_records
from tests.support.contracts import orders
from tests.support.records import bronze_frame

SEED = 20261127
RECORDS = 100_000
MEMBERS: dict[str, Any] = {
    "tags": {"type": ["array", "null"], "minItems": 1, "maxItems": 3, "uniqueItems": True,
             "items": {"type": "string", "minLength": 1, "maxLength": 2,
                       "pattern": "^[a-z]+$"}},
    "scores": {"type": "array", "uniqueItems": True,
               "items": {"type": ["number", "null"], "minimum": 0, "maximum": 10}},
    "seen": {"type": ["array", "null"], "maxItems": 2,
             "items": {"type": ["string", "integer"], "format": "date-time"}},
    "shipping": {"type": ["object", "null"], "additionalProperties": {
        "type": ["integer", "null"], "minimum": 0}, "properties": {
        "steps": {"type": ["array", "null"], "items": {"type": "integer",
                                                       "exclusiveMinimum": 0}}}},
    "counts": {"type": ["object", "null"], "minProperties": 1, "maxProperties": 2,
               "additionalProperties": {"type": ["integer", "null"], "enum": [1, 2, 3, None]}},
    "lines": {"type": ["array", "null"], "minItems": 1, "items": {
        "type": ["object", "null"], "required": ["sku"], "additionalProperties": False,
        "properties": {"sku": {"type": "string", "pattern": "^[A-Z]-[0-9]$"},
                       "qty": {"type": ["integer", "null"], "minimum": 1},
                       "gift": {"type": "boolean"}}}},
}  # fmt: skip
PLACED = {"order_id": "o-1", "placed_at": "2024-05-01T00:00:00Z"}


def contract_document() -> dict[str, Any]:
    document = orders()
    document["properties"].update(MEMBERS)
    document["required"].append("scores")
    # The other top-level fields: short texts.
    document["additionalProperties"] = {"type": ["string", "null"], "maxLength": 2}
    return document


OTHERS = ["a", "", 7, 2.5, True, None, {"a": 1}, [1]]


def other(rng: random.Random) -> Any:
    """A value of any JSON type, nested ones included."""
    return rng.choice(OTHERS)


def listed(
    rng: random.Random, right: list[Any], wrong: list[Any], others: list[Any] = OTHERS
) -> list[Any]:
    """Mostly 1 to 2 distinct members of ``right``; else 0 to 4 of ``right`` and ``wrong``,
    now and then one of ``others``."""
    if rng.random() < 0.6:
        return rng.sample(right, rng.randint(1, 2))
    mixed = right + wrong
    return [
        rng.choice(mixed) if rng.random() < 0.9 else rng.choice(others)
        for _ in range(rng.randint(0, 4))
    ]


def member_value(rng: random.Random, name: str) -> Any:
    """A value for property ``name``: usually an array (a map), now and then anything."""
    if rng.random() < 0.04:
        return other(rng)
    if name == "tags":
        return listed(rng, ["a", "b", "ab", "zz"], ["", "abc", "A", "a1"])
    if name == "scores":
        return listed(rng, [0, 1, 2.5, 10, None], [1.0, -0.0, 10.5, -1])
    if name == "seen":
        # No other string: the validator notes a date-time's format and asserts nothing.
        others = [v for v in OTHERS if not isinstance(v, str)]
        return listed(rng, ["2024-05-01T00:00:00Z", "2024-05-01T02:00:00+02:00", 0,
                            1714521600000], [], others)  # fmt: skip
    if name == "shipping":
        shipping: dict[str, Any] = {"steps": listed(rng, [1, 2, 3], [0, -2, 1.5, "1"])}
        if rng.random() < 0.3:
            shipping[rng.choice(["floor", "door"])] = rng.choice([0, 4, None, -1, "4", 2.5])
        return shipping
    if name == "lines":
        right = [{"sku": "A-1"}, {"sku": "B-2", "qty": 3}, {"sku": "C-3", "gift": True}, None]
        wrong = [{"sku": "a-1"}, {"qty": 2}, {"sku": "A-1", "qty": 0}, {"sku": "A-1", "x": 1},
                 {"sku": "A-1", "gift": None}, {"sku": 1}, "A-1"]  # fmt: skip
        return listed(rng, right, wrong)
    if rng.random() < 0.6:
        return {k: rng.choice([1, 2, 3, None]) for k in rng.sample("abcd", rng.randint(1, 2))}
    keys = rng.sample("abcd", rng.randint(0, 3))
    return {k: rng.choice([1, 2, 3, None, 0, 4, "1", 1.5]) for k in keys}


def shipping_others(shipping: Any) -> dict[str, Any] | None:
    """The members of a valid record's ``shipping`` beyond its properties, as silver keeps
    them (an empty map where there are none, null where the object is)."""
    if shipping is None:
        return None
    return {k: v for k, v in shipping.items() if k != "steps"}


def corpus(rng: random.Random) -> list[dict[str, Any]]:
    documents = []
    for _ in range(RECORDS):
        document: dict[str, Any] = dict(PLACED)
        for name in MEMBERS:
            if rng.random() < 0.85:
                document[name] = member_value(rng, name)
        if rng.random() < 0.2:
            document[rng.choice(["note", "memo"])] = rng.choice(["ab", "", None, "abc", 3])
        documents.append(document)
    return documents


def test_arrays_and_maps_judge_records_as_a_json_schema_validator_does(
    spark: SparkSession,
) -> None:
    document = contract_document()
    contract = parse_contract(document, "/contracts/orders.json", "orders", {})
    documents = corpus(random.Random(SEED))
    records = [(str(i), json.dumps(d)) for i, d in enumerate(documents)]

    parsed = parse_records(contract, bronze_frame(spark, records, "orders"), 4096, None)
    rows = parsed.select(
        "key_text", "error_code", "error_detail", "record.shipping_others"
    ).collect()

    validator = Draft202012Validator(document)
    expected = {str(i): validator.is_valid(d) for i, d in enumerate(documents)}
    found = {r["key_text"]: r["error_code"] is None for r in rows}
    details = {r["key_text"]: r["error_detail"] for r in rows}
    disagree = {k: (records[int(k)][1], details[k]) for k in expected if expected[k] != found[k]}
    assert {} == dict(list(disagree.items())[:5]), f"{len(disagree)} records disagree"
    # The corpus reaches every kind of verdict, and each member's rules.
    codes = Counter(r["error_code"] for r in rows)
    assert min(codes[c] for c in (None, "missing_field", "type_mismatch", "invalid_value",
                                  "out_of_range")) >= 50, codes  # fmt: skip
    named = {r["error_detail"].split(":")[0].split("[")[0].split(".")[0] for r in rows
             if r["error_code"] is not None}  # fmt: skip
    assert set(MEMBERS) <= named
    # A valid record's shipping keeps the members its additionalProperties schema checks.
    kept = {r["key_text"]: r["shipping_others"] for r in rows if r["error_code"] is None}
    others = {k: shipping_others(documents[int(k)].get("shipping")) for k in kept}
    assert others == kept
    assert sum(1 for v in kept.values() if v) >= 50
