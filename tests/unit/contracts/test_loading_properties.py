"""The contract loader on generated documents (hypothesis): a document is either a contract
whose silver tables build with unique column names, or refused with one
`ContractError` line (exit 2), whatever it holds; no other outcome.

The documents are the shipped contracts, a third one and a fourth made of shared
definitions with a free-form object, arrays (of objects too) and a map, mutated: a value anywhere
replaced, a key removed, or a key added (JSON Schema keywords, extension keys and the
contracts' own names are drawn more often than random text, so that most documents get
past the meta-schema and reach the extension block's checks).
"""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.contracts.loading import parse_contract
from service.contracts.model import Contract
from service.errors import ContractError
from service.lake.tables import contract_tables
from tests.support.contracts import orders, shipped

SOURCE = "/contracts/generated.json"
DEFINED = {
    **orders(event_time="placed_at"),
    "$defs": {
        "Money": {"type": ["number", "null"], "minimum": 0},
        "Place": {"type": ["object", "null"], "properties": {"city": {"$ref": "#/$defs/Text"}}},
        "Text": {"type": ["string", "null"], "maxLength": 40},
    },
}
DEFINED["properties"] = {
    **DEFINED["properties"],
    "amount": {"$ref": "#/$defs/Money", "maximum": 1000},
    "shipping": {"$ref": "#/$defs/Place", "description": "Where it goes."},
    "note": {"$ref": "#/$defs/Text"},
    "attributes": {"type": ["object", "null"]},
    "tags": {"type": ["array", "null"], "items": {"$ref": "#/$defs/Text"}, "uniqueItems": True},
    "counts": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 1}},
    "lines": {"type": ["array", "null"], "items": {"type": "object", "required": ["sku"],
              "properties": {"sku": {"$ref": "#/$defs/Text"}, "qty": {"type": "integer"}}}},
    "ports": {"type": ["object", "null"], "additionalProperties": {"type": "integer"}},
}  # fmt: skip
DEFINED["additionalProperties"] = {"type": ["string", "null"], "maxLength": 8}
SEEDS = (shipped("users"), shipped("sensors"), orders(event_time="placed_at"), DEFINED)
# Words a contract is made of: keywords, extension keys and values, the seeds' names.
WORDS = sorted(
    {
        "type", "properties", "required", "additionalProperties", "enum", "const", "format",
        "minimum", "maximum", "exclusiveMinimum", "minLength", "maxLength", "pattern", "allOf",
        "if", "then", "else", "dependentRequired", "x-lakehouse", "name", "topic", "key", "mode",
        "id", "order_by", "event_time", "max_future_seconds", "dedup_horizon_seconds",
        "partition_by", "column", "day_of", "flatten", "derived", "sql", "tables", "bronze",
        "silver", "duplicates", "version", "stats_columns", "for", "mismatch", "events",
        "entities", "string", "integer", "number", "boolean", "object", "null", "date",
        "date-time", "today", "2020-01-01", "_rescued", "kafka_topic", "kafka_offset",
        "ingested_at", "is_deleted", "deleted_at", "silver/orders", "bronze/orders", "long",
        *(name for seed in SEEDS for name in seed["properties"]),
        "geolocation.city", "$ref", "$defs", "#/$defs/Money", "#/$defs/Place", "#/$defs/Text",
        "Money", "Place", "Text", "oneOf", "anyOf", "array", "items", "minItems", "maxItems",
        "uniqueItems", "minProperties", "maxProperties", "sku", "qty",
    }
)  # fmt: skip
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**64), max_value=2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(WORDS)
    | st.text(max_size=6)
)
KEYS = st.sampled_from(WORDS) | st.text(max_size=6)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=6,
)


def paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path of every object and array in ``value``, itself first."""
    if isinstance(value, dict):
        inner = [p for k, v in value.items() for p in paths(v, (*at, k))]
    elif isinstance(value, list):
        inner = [p for i, v in enumerate(value) for p in paths(v, (*at, i))]
    else:
        return []
    return [at, *inner]


def at(document: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        document = document[step]
    return document


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    """A seed contract with a few mutations."""
    document: dict[str, Any] = copy.deepcopy(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        container = at(document, draw(st.sampled_from(paths(document))))
        operation = draw(st.sampled_from(["replace", "remove", "add"]))
        if isinstance(container, list):
            if operation == "add" or not container:
                container.append(draw(VALUES))
                continue
            index = draw(st.integers(min_value=0, max_value=len(container) - 1))
            if operation == "remove":
                del container[index]
            else:
                container[index] = draw(VALUES)
        elif operation == "add" or not container:
            container[draw(KEYS)] = draw(VALUES)
        else:
            key = draw(st.sampled_from(sorted(container)))
            if operation == "remove":
                del container[key]
            else:
                container[key] = draw(VALUES)
    return document


def test_a_document_is_a_contract_with_unique_columns_or_one_refusal_line() -> None:
    accepted: list[Contract] = []
    refused: list[str] = []

    @settings(
        max_examples=300,
        deadline=timedelta(seconds=2),
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(documents())
    def check(document: dict[str, Any]) -> None:
        try:
            contract = parse_contract(document, SOURCE, "generated", {})
        except ContractError as e:
            message = str(e)
            assert [message] == message.splitlines()
            assert message.startswith(f"{SOURCE}: ")
            refused.append(message)
            return
        tables = contract_tables(contract)
        for table in (tables.silver, tables.duplicates):
            if table is not None and table.schema is not None:
                names = [c.name.lower() for c in table.schema.fields]
                assert sorted(set(names)) == sorted(names)
        accepted.append(contract)

    check()

    # Kept honest: documents that all broke the meta-schema would test nothing.
    assert accepted
    assert [m for m in refused if "/x-lakehouse" in m and "valid JSON Schema" not in m]
