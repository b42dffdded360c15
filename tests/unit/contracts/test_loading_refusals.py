"""What the contract loader refuses beyond the keywords: a required name that is not a
property, the events-only extension keys in an entities contract, a contract name that is a
key of `reconcile --json`, and table names outside their layer or of the lake's own tables;
and the loader's copies of the report's keys and the shared tables, which must not drift
from the modules that own them (service.contracts imports neither)."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from pyspark.sql import SparkSession
from pyspark.sql.types import StringType

from service.contracts.loading import (
    REPORT_KEYS,
    SHARED_TABLES,
    load_contracts,
    parse_contract,
)
from service.errors import ContractError
from service.ingest.modes import parse_records
from tests.support.contracts import Edit, changed, orders, shipped
from tests.support.contracts import refusal as contract_refusal
from tests.support.payloads import reading
from tests.support.records import bronze_frame


def refusal(document: dict[str, Any], source: str = "/contracts/c.json") -> str:
    """The one line `parse_contract` refuses ``document`` with, without its file prefix."""
    message = contract_refusal(document, source)
    assert message.startswith(f"{source}: "), message
    return message.removeprefix(f"{source}: ")


# --- required names that are not properties ------------------------------------------------


def test_a_required_name_that_is_not_a_property_is_refused_at_the_root() -> None:
    document = changed(shipped("users"), lambda d: d["required"].append("nickname"))
    # What a producer's validator does with it: a profile without "nickname" is invalid.
    profile = {"user_id": 1, "updated_at": "2026-01-01T00:00:00Z"}
    assert not Draft202012Validator(document).is_valid(profile)

    assert (
        "/required/2: 'nickname' is required but not a property (declare it under properties)"
        == refusal(document)
    )


def test_a_required_name_that_is_not_a_property_is_refused_in_a_nested_object() -> None:
    document = changed(
        shipped("sensors"), lambda d: d["properties"]["geolocation"].update(required=["zip"])
    )
    assert (
        "/properties/geolocation/required/0: 'zip' is required but not a property"
        " (declare it under properties)"
    ) == refusal(document)


def test_a_declared_nested_required_name_loads() -> None:
    document = changed(
        shipped("sensors"), lambda d: d["properties"]["geolocation"].update(required=["city"])
    )
    contract = parse_contract(document, "sensors.json", "sensors", {})
    assert contract.field("geolocation.city").required


def test_a_branch_requires_top_level_properties_only() -> None:
    undeclared = changed(
        shipped("sensors"), lambda d: d["allOf"][0]["then"]["required"].append("pulse")
    )
    # JSON Schema reads "geolocation.city" in a then as a top-level name with a dot.
    nested = changed(
        shipped("sensors"), lambda d: d["allOf"][2]["then"]["required"].append("geolocation.city")
    )
    condition = changed(
        shipped("sensors"), lambda d: d["allOf"][1]["if"]["required"].append("geolocation.country")
    )

    assert "/allOf/0/then/required: 'pulse' is not a top-level property of the contract" == refusal(
        undeclared
    )
    assert (
        "/allOf/2/then/required: 'geolocation.city' is not a top-level property of the contract"
        == refusal(nested)
    )
    assert (
        "/allOf/1/if: 'geolocation.country' is not a top-level property of the contract"
        == refusal(condition)
    )


# --- one mode's keys in a contract of the other ---------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("partition_by", {"column": "updated_date", "day_of": "updated_at"},
         "an entities contract's silver table has no partition"),
        ("derived", [{"column": "initials", "type": "string", "sql": "left(first_name, 1)"}],
         "an entities contract's silver table has no derived columns"),
        ("derived", [], "an entities contract's silver table has no derived columns"),
        ("id", "email", "an entities contract has no event id (its key names the entity)"),
        ("dedup_horizon_seconds", 60,
         "an entities contract keeps the newest change per key, it drops no duplicates by id"),
    ],
    ids=["partition_by", "derived", "derived-empty", "id", "dedup_horizon_seconds"],
)  # fmt: skip
def test_events_keys_are_refused_in_an_entities_contract(key: str, value: Any, why: str) -> None:
    document = changed(shipped("users"), lambda d: d["x-lakehouse"].update({key: value}))
    assert f"/x-lakehouse/{key}: {key} is for events contracts: {why}" == refusal(document)


def test_order_by_is_refused_in_an_events_contract() -> None:
    document = changed(
        shipped("sensors"), lambda d: d["x-lakehouse"].update({"order_by": "event_time"})
    )
    assert (
        "/x-lakehouse/order_by: order_by is for entities contracts: an events contract"
        " appends every record, it orders no changes"
    ) == refusal(document)


def test_an_events_contract_keeps_its_partition_and_derived_columns() -> None:
    sensors = parse_contract(shipped("sensors"), "sensors.json", "sensors", {})
    assert ("event_date", "event_time") == sensors.partition
    assert ["magnitude"] == [d.column for d in sensors.derived]


# --- names reserved by reconcile --json -----------------------------------------------------


@pytest.mark.parametrize("name", REPORT_KEYS)
def test_a_contract_named_after_a_key_of_the_reconcile_report_is_refused(name: str) -> None:
    document = changed(orders(), lambda d: d["x-lakehouse"].update(name=name))
    assert (
        f"/x-lakehouse/name: {name!r} is reserved: `reconcile --json` reports each contract"
        f" under its name beside its own keys ({', '.join(REPORT_KEYS)})"
    ) == refusal(document)


def test_a_contract_file_named_after_a_key_of_the_reconcile_report_is_refused(
    tmp_path: Path,
) -> None:
    document = orders()
    del document["x-lakehouse"]["name"]  # the name is the file's
    (tmp_path / "problems.json").write_text(json.dumps(document))
    with pytest.raises(ContractError, match="'problems' is reserved"):
        load_contracts(str(tmp_path), {})


def test_the_reserved_names_are_every_top_level_key_of_the_reconcile_report() -> None:
    from service.lake.invariants import Reconciliation

    keys = {f.name for f in dataclasses.fields(Reconciliation)} | {"ok"}
    assert keys == set(REPORT_KEYS)
    report = Reconciliation(
        storage_root="s3a://lake",
        since=None,
        generated_at="2026-01-01T00:00:00Z",
        duration_seconds=0.0,
        tables={},
        bronze=[],
        checks={},
        gold=[],
        problems=[],
    )
    assert set(json.loads(report.to_json())) <= set(REPORT_KEYS)


# --- table names ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "table", "expected"),
    [
        ("duplicates", "gold/orders_duplicates", "'gold/orders_duplicates' is not silver/<name>"),
        (
            "duplicates",
            "bronze/orders_duplicates",
            "'bronze/orders_duplicates' is not silver/<name>",
        ),
        ("duplicates", "orders_duplicates", "'orders_duplicates' is not silver/<name>"),
        ("duplicates", "silver/", "'silver/' is not silver/<name>"),
        ("silver", "gold/alerts", "'gold/alerts' is not silver/<name>"),
        ("bronze", "gold/alerts", "'gold/alerts' is not bronze/<name>"),
        ("silver", "silver/quarantine/", "'silver/quarantine/' is not silver/<name>"),
        ("silver", "silver/a/../quarantine", "'silver/a/../quarantine' is not silver/<name>"),
        ("bronze", "bronze/..", "'bronze/..' is not bronze/<name>"),
        ("silver", 7, "7 is not silver/<name>"),
    ],
)
def test_a_table_outside_its_layer_is_refused(kind: str, table: Any, expected: str) -> None:
    document = changed(orders(), lambda d: d["x-lakehouse"].update(tables={kind: table}))
    assert f"/x-lakehouse/tables/{kind}: {expected}" == refusal(document)


@pytest.mark.parametrize("table", SHARED_TABLES)
@pytest.mark.parametrize("kind", ["bronze", "silver", "duplicates"])
def test_a_contract_may_not_name_a_table_of_the_lake_as_its_own(kind: str, table: str) -> None:
    layer = "bronze" if kind == "bronze" else "silver"
    document = changed(orders(), lambda d: d["x-lakehouse"].update(tables={kind: table}))
    message = refusal(document)
    if table.startswith(f"{layer}/"):
        assert (
            f"/x-lakehouse/tables/{kind}: {table} is one of the lake's own tables"
            f" ({', '.join(SHARED_TABLES)}), not a contract's"
        ) == message
    else:
        assert f"/x-lakehouse/tables/{kind}: {table!r} is not {layer}/<name>" == message


def test_an_events_contracts_duplicates_table_in_silver_loads() -> None:
    document = changed(
        orders(), lambda d: d["x-lakehouse"].update(tables={"duplicates": "silver/order_repeats"})
    )
    assert "silver/order_repeats" == parse_contract(document, "o.json", "o", {}).tables.duplicates


def test_the_shared_tables_are_the_lakes_shared_and_operator_tables() -> None:
    from service.lake.tables import (
        GOLD_TABLES,
        OFFSET_GAPS_TABLE,
        OPERATOR_TABLES,
        QUARANTINE_TABLE,
        SHIPPED,
    )

    lake = {QUARANTINE_TABLE.name, OFFSET_GAPS_TABLE.name, *(t.name for t in OPERATOR_TABLES)}
    assert lake == set(SHARED_TABLES)
    # The catalogue agrees: every table that is neither a contract's nor gold's.
    contracts = {
        t.name
        for c in SHIPPED.contracts
        for t in (
            SHIPPED.of(c.name).bronze,
            SHIPPED.of(c.name).silver,
            SHIPPED.of(c.name).duplicates,
        )
        if t is not None
    }
    gold = {t.name for t in GOLD_TABLES}
    assert {t.name for t in SHIPPED.tables} - contracts - gold == set(SHARED_TABLES)
    # Gold's tables are never a contract's: a contract's tables are in bronze or silver.
    assert all(t.startswith("gold/") for t in gold)


# --- every mistake in the extension block: one line, never a crash, never ignored -----------


def sensors_with(change: Edit) -> dict[str, Any]:
    return changed(shipped("sensors"), change)


def users_with(change: Edit) -> dict[str, Any]:
    return changed(shipped("users"), change)


def orders_with(change: Edit, **extension: Any) -> dict[str, Any]:
    return changed(orders(**extension), change)


def set_property(name: str, schema: Any) -> Edit:
    return lambda d: d["properties"].update({name: schema})


def annotate(name: str, **annotations: Any) -> Edit:
    return lambda d: d["properties"][name].update({"x-lakehouse": annotations})


ENTITIES_LAKE = (
    "is_deleted, deleted_at, _schema_id, _rescued, kafka_topic, kafka_partition, kafka_offset,"
    " kafka_timestamp, ingested_at"
)
EVENTS_LAKE = (
    "_schema_id, _rescued, kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, ingested_at"
)


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        # Crashed on a KeyError, a TypeError or a ValueError (exit 1).
        (orders(partition_by={"day_of": "placed_at"}),
         "/x-lakehouse/partition_by: 'column' is a required property"),
        (orders(partition_by="order_date"),
         "/x-lakehouse/partition_by: 'order_date' is not of type 'object'"),
        (sensors_with(lambda d: d["x-lakehouse"].update(flatten="geo_")),
         "/x-lakehouse/flatten: 'geo_' is not of type 'object'"),
        (orders(tables="silver/orders"),
         "/x-lakehouse/tables: 'silver/orders' is not of type 'object'"),
        (orders(derived=["round(amount)"]),
         "/x-lakehouse/derived/0: 'round(amount)' is not of type 'object'"),
        (orders_with(lambda d: d.update({"x-lakehouse": ["events"]})),
         "/x-lakehouse: the extension block is a JSON object"),
        (sensors_with(lambda d: d["allOf"][0]["if"]["properties"].update(sensor_type={})),
         "/allOf/0/if/properties/sensor_type: an if names the values it holds for: const or"
         " enum"),
        (orders(mode=["events"]),
         '/x-lakehouse/mode: "events" (append) or "entities" (upsert by key)'),
        (users_with(lambda d: d["properties"]["country"].update({"\n": 1})),
         "/properties/country/\\n: keyword '\\n' is not supported by the engine"
         " (docs/contracts.md lists the keywords it compiles)"),
        # Wrong value types and ranges.
        (orders(max_future_seconds="60"),
         "/x-lakehouse/max_future_seconds: '60' is not of type 'integer'"),
        (orders(max_future_seconds=-5),
         "/x-lakehouse/max_future_seconds: -5 is less than the minimum of 0"),
        (orders(dedup_horizon_seconds=1.5),
         "/x-lakehouse/dedup_horizon_seconds: 1.5 is not of type 'integer'"),
        (orders(dedup_horizon_seconds=10**13),
         "/x-lakehouse/dedup_horizon_seconds: 10000000000000 is greater than the maximum of"
         " 9223372036854"),
        (orders(version="1.0.0"), "/x-lakehouse/version: '1.0.0' is not of type 'integer'"),
        (orders(topic=""), "/x-lakehouse/topic: '' should be non-empty"),
        (orders(stats_columns="amount"),
         "/x-lakehouse/stats_columns: 'amount' is not of type 'array'"),
        (orders(derived=[{"column": "cents", "type": "decimal", "sql": "amount * 100"}]),
         "/x-lakehouse/derived/0/type: 'decimal' is not one of ['string', 'long', 'double',"
         " 'boolean', 'date', 'timestamp']"),
        # Names that point at nothing.
        (orders(flatten={"shipping": "ship_"}),
         "/x-lakehouse/flatten/shipping: 'shipping' is not a nested object of the contract"
         " (those: none)"),
        (orders(stats_columns=["amount", "customer_id"]),
         "/x-lakehouse/stats_columns/1: 'customer_id' is not a column the contract makes"
         " (a field's, a derived one)"),
        (orders(key="customer_id"),
         "/x-lakehouse/key: 'customer_id' is not a top-level property of the contract"),
        (orders(partition_by={"column": "order_date", "day_of": "amount"}),
         "/x-lakehouse/partition_by/day_of: 'amount' must be a required, non-null date-time"
         " property"),
        (users_with(lambda d: d["x-lakehouse"].update(tables={"duplicates": "silver/user_dups"})),
         "/x-lakehouse/tables/duplicates: an entities contract has no duplicates table: it keeps"
         " the newest change per key"),
        # Annotations where they have no effect.
        (sensors_with(lambda d: d["properties"]["geolocation"].update(
            {"x-lakehouse": {"flatten": "geo_"}})),
         "/properties/geolocation/x-lakehouse: a nested object has no x-lakehouse block: its"
         " columns' prefix is the contract's x-lakehouse.flatten, its fields' annotations go on"
         " each field"),
        (orders_with(annotate("placed_at", minimum="2020-01-01")),
         '/properties/placed_at/x-lakehouse/minimum: x-lakehouse minimum bounds a "format":'
         ' "date" property, and this one is not'),
        (orders_with(annotate("order_id", mismatch="is not an order id")),
         "/properties/order_id/x-lakehouse/mismatch: mismatch words the detail of the"
         " property's pattern, and it has none"),
        (orders_with(annotate("amount", **{"for": "large orders"})),
         "/properties/amount/x-lakehouse/for: for labels the rules of a then/else; a"
         " property's own rules have no label"),
        (sensors_with(lambda d: d["allOf"][0]["then"]["x-lakehouse"].update(label="hr")),
         "/allOf/0/then/x-lakehouse/label: keyword 'label' is not supported by the engine: a"
         " then/else's x-lakehouse holds only its label, for (docs/contracts.md lists the"
         " keywords it compiles)"),
        (sensors_with(lambda d: d["allOf"][0]["then"].update({"x-lakehouse": {"for": 7}})),
         "/allOf/0/then/x-lakehouse/for: the label is a non-empty string"),
        (users_with(annotate("dob", minimum="1900-02-30")),
         "/properties/dob/x-lakehouse/minimum: '1900-02-30' is not a day of years 1-9999"
         " (YYYY-MM-DD) nor today"),
        (users_with(annotate("dob", minimum="tomorrow")),
         "/properties/dob/x-lakehouse/minimum: 'tomorrow' does not match"
         " '^(today|[0-9]{4}-[0-9]{2}-[0-9]{2})$'"),
        (users_with(annotate("dob", minimum="2000-01-01", maximum="1999-12-31")),
         "/properties/dob/x-lakehouse: minimum 2000-01-01 is after maximum 1999-12-31: every"
         " value would be out of range"),
        # Values no field holds, keywords no value of the field meets.
        (orders_with(set_property("order_id", {"type": "string", "enum": ["o-1", {"id": 1}]})),
         '/properties/order_id/enum/1: {"id": 1} is not a string, number, boolean or null: no'
         " field of the contract holds it"),
        (sensors_with(lambda d: d["allOf"][0]["if"]["properties"]["sensor_type"].update(
            const=["heart_rate"])),
         '/allOf/0/if/properties/sensor_type/const: ["heart_rate"] is not a string, number,'
         " boolean or null: no field of the contract holds it"),
        (orders_with(set_property("order_id", {"type": "string", "minimum": 1})),
         "/properties/order_id/minimum: minimum bounds a number without a format, and this"
         " property is string: it would never apply"),
        (orders_with(set_property("placed_at", {"type": ["string", "integer"],
                                                "format": "date-time", "minimum": 0})),
         '/properties/placed_at/minimum: minimum bounds a number without a format, and this'
         ' property is string or integer ("format": "date-time"): it would never apply'),
        (orders_with(set_property("amount", {"type": ["number", "null"], "maxLength": 9})),
         "/properties/amount/maxLength: maxLength applies to strings, and this property is"
         " number: it would never apply"),
        (orders_with(set_property("note", True)),
         "/properties/note: a boolean schema is not supported by the engine: write an object"
         " with the keywords docs/contracts.md lists"),
        (sensors_with(lambda d: d["allOf"][0]["then"]["properties"].update(geolocation={})),
         "/allOf/0/then/properties/geolocation: 'geolocation' is an object: a then/else has no"
         " rules for one"),
    ],
)  # fmt: skip
def test_an_extension_or_annotation_mistake_is_refused_with_one_line(
    document: dict[str, Any], expected: str
) -> None:
    assert expected == refusal(document)


# --- the columns the lake adds to silver ----------------------------------------------------


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (orders_with(set_property("_rescued", {"type": ["string", "null"]})),
         f"/properties/_rescued: column '_rescued' is one the lake adds to silver/orders"
         f" ({EVENTS_LAKE})"),
        (orders_with(set_property("_schema_id", {"type": ["integer", "null"]})),
         f"/properties/_schema_id: column '_schema_id' is one the lake adds to silver/orders"
         f" ({EVENTS_LAKE})"),
        (orders_with(set_property("kafka_topic", {"type": ["string", "null"]})),
         f"/properties/kafka_topic: column 'kafka_topic' is one the lake adds to silver/orders"
         f" ({EVENTS_LAKE})"),
        (orders_with(set_property("Ingested_At", {"type": ["string", "null"]})),
         f"/properties/Ingested_At: column 'Ingested_At' is one the lake adds to silver/orders"
         f" ({EVENTS_LAKE})"),
        (users_with(set_property("is_deleted", {"type": ["boolean", "null"]})),
         f"/properties/is_deleted: column 'is_deleted' is one the lake adds to silver/users"
         f" ({ENTITIES_LAKE})"),
        (users_with(set_property("deleted_at", {"type": ["string", "null"]})),
         f"/properties/deleted_at: column 'deleted_at' is one the lake adds to silver/users"
         f" ({ENTITIES_LAKE})"),
        (orders(partition_by={"column": "ingested_at", "day_of": "placed_at"}),
         f"/x-lakehouse/partition_by/column: column 'ingested_at' is one the lake adds to"
         f" silver/orders ({EVENTS_LAKE})"),
        (orders(derived=[{"column": "kafka_offset", "type": "long", "sql": "1"}]),
         f"/x-lakehouse/derived/0/column: column 'kafka_offset' is one the lake adds to"
         f" silver/orders ({EVENTS_LAKE})"),
        (orders(partition_by={"column": "order_date", "day_of": "placed_at"},
                derived=[{"column": "order_date", "type": "date", "sql": "to_date(placed_at)"}]),
         "/x-lakehouse/partition_by/column: column 'order_date' is also made by"
         " /x-lakehouse/derived/0/column"),
        (orders(partition_by={"column": "amount", "day_of": "placed_at"}),
         "/x-lakehouse/partition_by/column: column 'amount' is also made by /properties/amount"),
        (orders_with(lambda d: d["properties"].update(
            ship_city={"type": ["string", "null"]},
            shipping={"type": ["object", "null"], "properties": {"city": {"type": "string"}}}),
            flatten={"shipping": "ship_"}),
         "/properties/shipping/properties/city: column 'ship_city' is also made by"
         " /properties/ship_city"),
        (orders_with(lambda d: d["properties"].update(
            shipping={"type": ["object", "null"], "properties": {"others": {"type": "string"}},
                      "additionalProperties": {"type": "integer"}})),
         "/properties/shipping/additionalProperties: column 'shipping_others' is also made by"
         " /properties/shipping/properties/others"),
        (orders_with(set_property("order.note", {"type": ["string", "null"]})),
         "/properties/order.note: 'order.note' cannot name a column: Delta refuses spaces and"
         " ,;{}()=, tabs and newlines, a dot would read as a nested field"),
        (orders_with(lambda d: d["properties"].update(
            original_kafka_offset=d["properties"].pop("order_id")) or d.update(
            required=["original_kafka_offset", "placed_at"]), id="original_kafka_offset"),
         "/x-lakehouse/id: 'original_kafka_offset' is a column the lake adds to"
         " silver/orders_duplicates (kafka_topic, kafka_partition, kafka_offset,"
         " kafka_timestamp, ingested_at, original_kafka_partition, original_kafka_offset)"),
    ],
    ids=["_rescued", "_schema_id", "kafka_topic", "ingested_at-any-case", "is_deleted",
         "deleted_at", "partition-ingested_at", "derived-kafka_offset", "derived-partition",
         "partition-a-field", "flatten", "others", "dot", "duplicates-id"],
)  # fmt: skip
def test_a_column_the_lake_adds_or_another_makes_is_refused(
    document: dict[str, Any], expected: str
) -> None:
    assert expected == refusal(document)


def test_an_entitys_deletion_columns_are_free_names_in_an_events_contract() -> None:
    document = orders_with(
        lambda d: d["properties"].update(
            is_deleted={"type": ["boolean", "null"]}, deleted_at={"type": ["string", "null"]}
        )
    )
    contract = parse_contract(document, "orders.json", "orders", {})
    assert ("is_deleted", "deleted_at") == contract.top_level[-2:]


# --- a then/else property without a type ----------------------------------------------------


def test_a_then_property_without_a_type_narrows_its_base_propertys_type() -> None:
    # Ordinary JSON Schema: the record's value already is the base property's number.
    document = sensors_with(
        lambda d: d["allOf"][0]["then"]["properties"].update(value={"maximum": 1000})
    )
    contract = parse_contract(document, "sensors.json", "sensors", {})
    then = contract.conditionals[0].then
    assert then is not None
    assert {"type": ["number", "null"], "maximum": 1000} == then.properties["value"]
    assert {"maximum": 1000} == document["allOf"][0]["then"]["properties"]["value"]


def test_a_then_property_without_a_type_is_checked_as_its_base_type(spark: SparkSession) -> None:
    document = sensors_with(
        lambda d: d["allOf"][0]["then"]["properties"].update(value={"maximum": 200})
    )
    contract = parse_contract(document, "sensors.json", "sensors", {})
    records = [
        (name, json.dumps(reading(sensor_type="heart_rate", value=value)))
        for name, value in (("fast", 210), ("calm", 60), ("text", "60"))
    ]

    rows = parse_records(contract, bronze_frame(spark, records, "sensors"), 4096, None).collect()

    assert {
        "fast": ("out_of_range", "value: 210.0 is above 200 for heart_rate readings"),
        "calm": (None, None),
        "text": ("type_mismatch", "value: expected a JSON number, got string"),
    } == {r["key_text"]: (r["error_code"], r["error_detail"]) for r in rows}


def test_a_then_property_without_a_type_takes_the_base_format_too() -> None:
    document = users_with(
        lambda d: d.update(
            allOf=[
                {
                    "if": {"required": ["gender"]},
                    "then": {"properties": {"dob": {"x-lakehouse": {"maximum": "2000-01-01"}}}},
                }
            ]
        )
    )
    then = parse_contract(document, "users.json", "users", {}).conditionals[0].then
    assert then is not None
    assert {
        "type": ["string", "null"],
        "format": "date",
        "x-lakehouse": {"maximum": "2000-01-01"},
    } == then.properties["dob"]


def test_a_then_property_without_a_type_is_checked_against_its_base_type() -> None:
    document = sensors_with(
        lambda d: d["allOf"][0]["then"]["properties"].update(value={"maxLength": 3})
    )
    assert (
        "/allOf/0/then/properties/value/maxLength: maxLength applies to strings, and this"
        " property is number: it would never apply"
    ) == refusal(document)


# --- shared definitions ($defs and $ref) ----------------------------------------------------


def with_definitions(document: dict[str, Any]) -> dict[str, Any]:
    """The shipped sensors contract with its geolocation and axes written as definitions (a
    reference inside a definition, a reference used three times, an annotation beside one)."""
    defined = copy.deepcopy(document)
    place = defined["properties"]["geolocation"]
    defined["$defs"] = {
        "Text": {"type": ["string", "null"]},
        "Place": {
            **place,
            "properties": {name: {"$ref": "#/$defs/Text"} for name in place["properties"]},
        },
        "Axis": {"type": ["number", "null"]},
    }
    defined["properties"]["geolocation"] = {"$ref": "#/$defs/Place"}
    for axis in "xyz":
        defined["properties"][axis] = {"$ref": "#/$defs/Axis"}
    defined["properties"]["unit"] = {"$ref": "#/$defs/Text", "description": "bpm, C or m/s2"}
    return defined


def test_a_reference_reads_as_its_definition_written_where_it_stands() -> None:
    document = shipped("sensors")
    contract = parse_contract(with_definitions(document), "/contracts/s.json", "sensors", {})
    written_out = changed(document, lambda d: d["properties"]["unit"].update(
        description="bpm, C or m/s2"))  # fmt: skip

    # The contract (and the document the lake records) is the one written out in full.
    assert written_out == contract.document
    inline = parse_contract(written_out, "/contracts/s.json", "sensors", {})
    assert inline.fields == contract.fields
    assert inline.payload_columns() == contract.payload_columns()
    assert inline.fingerprint == contract.fingerprint


def test_a_keyword_beside_a_reference_applies_with_its_definition() -> None:
    document = changed(shipped("sensors"), lambda d: d.update({"$defs": {"Reading": {
        "type": ["number", "null"]}}}) or d["properties"].update(
        value={"$ref": "#/$defs/Reading", "minimum": -100}))  # fmt: skip

    contract = parse_contract(document, "/contracts/s.json", "sensors", {})

    assert {"type": ["number", "null"], "minimum": -100} == contract.field("value").schema


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (set_property("x", {"$ref": "#/$defs/Nope"}),
         '/properties/x/$ref: "#/$defs/Nope": no definition \'Nope\' under /$defs'),
        (set_property("x", {"$ref": "common.json#/$defs/Axis"}),
         '/properties/x/$ref: "common.json#/$defs/Axis" is not a definition of this document:'
         ' a $ref names one of its $defs ("#/$defs/Name")'),
        (set_property("x", {"$ref": "#/properties/y"}),
         '/properties/x/$ref: "#/properties/y" is not a definition of this document: a $ref'
         ' names one of its $defs ("#/$defs/Name")'),
        (set_property("x", {"$ref": "#/$defs/Axis", "type": "number"}),
         "/properties/x/type: 'type' is set here and, to another value, in the definition"
         " #/$defs/Axis: say it in one place"),
        (lambda d: d["$defs"].update(Place={"type": ["object", "null"], "properties": {
            "city": {"$ref": "#/$defs/Place"}}}),
         "/$defs/Place/properties/city/$ref: the definitions refer to themselves (Place ->"
         " Place): a contract's fields are finite, a recursive type has no column"),
        (lambda d: d["$defs"].update(Unused={"type": "string"}),
         "/$defs/Unused: no $ref of the contract names this definition: remove it (never"
         " ignored)"),
        (lambda d: d["$defs"].update(Axis=True),
         "/$defs/Axis: a boolean schema is not supported by the engine: write an object with"
         " the keywords docs/contracts.md lists"),
        (lambda d: d["$defs"].update(Axis={"type": ["number", "null"], "multipleOf": 2}),
         "/properties/x/multipleOf: keyword 'multipleOf' is not supported by the engine"
         " (docs/contracts.md lists the keywords it compiles)"),
    ],
    ids=["missing", "another-file", "not-a-definition", "conflict", "cycle", "unused",
         "boolean", "unsupported-inside"],
)  # fmt: skip
def test_a_reference_mistake_is_refused_with_one_line(edit: Edit, expected: str) -> None:
    assert expected == refusal(changed(with_definitions(shipped("sensors")), edit))


# --- free-form objects ----------------------------------------------------------------------


def test_an_object_without_properties_is_kept_whole_as_its_json_text(spark: SparkSession) -> None:
    document = orders_with(lambda d: d["properties"].update(
        attributes={"type": ["object", "null"]},
        shipping={"type": ["object", "null"], "properties": {
            "city": {"type": ["string", "null"]}, "notes": {"type": "object"}}}))  # fmt: skip
    contract = parse_contract(document, "/contracts/orders.json", "orders", {})
    placed = {"order_id": "o-1", "placed_at": "2024-05-01T00:00:00Z"}
    records = [
        ("object", json.dumps({**placed, "attributes": {"b": 1.50, "a": [1, {"z": None}]},
                               "shipping": {"city": "Lyon", "notes": {"gift": True}}})),
        ("spelt", '{"order_id":"o-2","placed_at":"2024-05-01T00:00:00Z",'
                  '"attributes":{"n":1e2,"s":"caf\\u00e9"}}'),
        ("null", json.dumps({**placed, "attributes": None})),
        ("absent", json.dumps(placed)),
        ("text", json.dumps({**placed, "attributes": "x"})),
        ("nested-array", json.dumps({**placed, "shipping": {"notes": []}})),
    ]  # fmt: skip

    rows = parse_records(contract, bronze_frame(spark, records, "orders"), 4096, None).collect()

    assert ["attributes", "shipping_city", "shipping_notes"] == [
        c.name for c in contract.payload_columns() if c.dataType == StringType()
    ][1:]
    # Keys sorted, values re-serialised with their JSON types (as `_rescued` is).
    assert {
        "object": (None, None, '{"a":[1,{"z":null}],"b":1.5}', '{"gift":true}'),
        "spelt": (None, None, '{"n":100.0,"s":"café"}', None),
        "null": (None, None, None, None),
        "absent": (None, None, None, None),
        "text": ("type_mismatch", "attributes: expected a JSON object, got string", None, None),
        "nested-array": ("type_mismatch", "shipping.notes: expected a JSON object, got array",
                         None, None),
    } == {
        r["key_text"]: (r["error_code"], r["error_detail"], r["record"]["attributes"],
                        r["record"]["shipping_notes"])
        for r in rows
    }  # fmt: skip


def test_an_object_without_properties_that_refuses_every_member_stays_an_empty_object() -> None:
    contract = parse_contract(
        orders_with(set_property("empty", {"type": "object", "additionalProperties": False})),
        "/contracts/orders.json", "orders", {},
    )  # fmt: skip

    assert contract.field("empty").is_object
    assert "empty" not in [c.name for c in contract.payload_columns()]


# --- oneOf and anyOf as unions of types -----------------------------------------------------


@pytest.mark.parametrize("keyword", ["oneOf", "anyOf"])
def test_alternatives_that_each_name_a_type_read_as_a_union_of_types(keyword: str) -> None:
    spelt = orders_with(set_property("note", {keyword: [
        {"type": "string", "description": "free text"}, {"type": "null"}]}))  # fmt: skip
    written = orders_with(set_property("note", {"type": ["string", "null"]}))

    contract = parse_contract(spelt, "/contracts/orders.json", "orders", {})

    assert ("string", "null") == contract.field("note").types
    assert parse_contract(written, "/contracts/orders.json", "orders", {}).document == (
        contract.document
    )


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf"),  # 1 matches both
        ({"anyOf": [{"type": "string", "minLength": 2}, {"type": "null"}]}, "anyOf"),
        ({"type": "string", "anyOf": [{"type": "string"}]}, "anyOf"),
    ],
    ids=["integer-or-number-exclusive", "a-rule-in-an-alternative", "beside-a-type"],
)
def test_other_alternatives_are_refused_saying_what_is_read(schema: Any, keyword: str) -> None:
    assert (
        f"/properties/note/{keyword}: keyword {keyword!r} is not supported by the engine: only"
        " alternatives that each name a type alone are read (as a union of types);"
        " alternatives of rules are written as if/then/else (docs/contracts.md lists the"
        " keywords it compiles)"
    ) == refusal(orders_with(set_property("note", schema)))


# --- arrays and maps -------------------------------------------------------------------------

MEMBERS: dict[str, Any] = {
    "tags": {"type": ["array", "null"], "minItems": 1, "maxItems": 3, "uniqueItems": True,
             "items": {"type": "string", "minLength": 1, "pattern": "^[a-z]+$",
                       "x-lakehouse": {"mismatch": "is not a lower-case word"}}},
    "scores": {"type": "array", "uniqueItems": True,
               "items": {"type": ["number", "null"], "minimum": 0, "maximum": 10}},
    "seen": {"type": ["array", "null"], "items": {"type": ["string", "integer"],
                                                  "format": "date-time"}},
    "shipping": {"type": ["object", "null"], "additionalProperties": {"type": "integer"},
                 "properties": {
        "steps": {"type": ["array", "null"], "items": {"$ref": "#/$defs/Step"}}}},
    "counts": {"type": ["object", "null"], "maxProperties": 2,
               "additionalProperties": {"type": "integer", "minimum": 0}},
    "lines": {"type": ["array", "null"], "maxItems": 3, "items": {
        "type": "object", "required": ["sku"], "additionalProperties": False, "properties": {
            "sku": {"type": "string", "pattern": "^[A-Z]-[0-9]+$"},
            "qty": {"type": ["integer", "null"], "minimum": 1}}}},
}  # fmt: skip


def with_members(document: dict[str, Any]) -> None:
    document["properties"].update(copy.deepcopy(MEMBERS))
    document["required"].append("scores")
    document["$defs"] = {"Step": {"type": "integer", "minimum": 1}}
    # Every other top-level field: a short text (kept in _rescued).
    document["additionalProperties"] = {"type": ["string", "null"], "maxLength": 3}


def members_with(**keywords: Any) -> Edit:
    """`with_members`, then ``keywords`` set on the document."""

    def edit(document: dict[str, Any]) -> None:
        with_members(document)
        document.update(keywords)

    return edit


def test_arrays_and_maps_of_scalars_are_columns_checked_member_by_member(
    spark: SparkSession,
) -> None:
    contract = parse_contract(orders_with(with_members), "/contracts/orders.json", "orders", {})
    placed = {"order_id": "o-1", "placed_at": "2024-05-01T00:00:00Z", "scores": [1, 2.5]}
    records = [
        ("valid", {**placed, "tags": ["a", "b"], "scores": [0, None, 9.5],
                   "seen": ["2024-05-01T00:00:00+02:00", 0], "shipping": {"steps": [1, 2]}}),
        ("empty-and-null", {**placed, "scores": [], "tags": None, "seen": []}),
        ("not-an-array", {**placed, "tags": "a"}),
        ("element-type", {**placed, "tags": ["a", 7, True]}),
        ("null-element", {**placed, "tags": ["a", None]}),
        ("pattern", {**placed, "tags": ["a", "b", "C"]}),
        ("empty-string", {**placed, "tags": ["a", ""]}),
        ("too-few", {**placed, "tags": []}),
        ("too-many", {**placed, "tags": ["a", "b", "c", "d"]}),
        ("repeat", {**placed, "tags": ["a", "b", "a"]}),
        ("number-repeat", {**placed, "scores": [1, 0, 1.0]}),
        ("zero-repeat", {**placed, "scores": [0, -0.0]}),
        ("null-repeat", {**placed, "scores": [None, 2, None]}),
        ("range", {**placed, "scores": [1, 11, -1]}),
        ("date-time", {**placed, "seen": ["2024-05-01", 1]}),
        ("nested", {**placed, "shipping": {"steps": [1, 0]}}),
        ("nested-type", {**placed, "shipping": {"steps": [1.5]}}),
        ("required", {k: v for k, v in placed.items() if k != "scores"}),
        ("map", {**placed, "counts": {"b": 0, "a": 7}}),
        ("map-not-object", {**placed, "counts": [1]}),
        ("map-type", {**placed, "counts": {"a": 1, "b": "2"}}),
        ("map-range", {**placed, "counts": {"a": -1}}),
        ("map-size", {**placed, "counts": {"a": 1, "b": 2, "c": 3}}),
        ("lines", {**placed, "lines": [{"sku": "A-1", "qty": 2}, {"sku": "B-2", "qty": None}]}),
        ("line-required", {**placed, "lines": [{"sku": "A-1"}, {"qty": 1}]}),
        ("line-type", {**placed, "lines": [{"sku": "A-1"}, "B-2"]}),
        ("line-value", {**placed, "lines": [{"sku": "A-1", "qty": 0}]}),
        ("line-unknown", {**placed, "lines": [{"sku": "A-1", "gift": True, "note": "x"}]}),
        ("others", {**placed, "note": "abc", "shipping": {"steps": [1], "floor": 3}}),
        ("other-length", {**placed, "note": "abcd"}),
        ("other-type", {**placed, "memo": None, "note": 5}),
        ("nested-other", {**placed, "shipping": {"floor": "3"}}),
    ]  # fmt: skip
    frame = bronze_frame(spark, [(k, json.dumps(v)) for k, v in records], "orders")

    rows = parse_records(contract, frame, 4096, None).collect()

    columns = {c.name: c.dataType.simpleString() for c in contract.payload_columns()}
    assert ("array<string>", "array<double>", "array<timestamp>", "array<bigint>") == (
        columns["tags"],
        columns["scores"],
        columns["seen"],
        columns["shipping_steps"],
    )
    assert "map<string,bigint>" == columns["counts"]
    assert "array<struct<sku:string,qty:bigint>>" == columns["lines"]
    assert {
        "valid": (None, None),
        "empty-and-null": (None, None),
        "not-an-array": ("type_mismatch", "tags: expected a JSON array, got string"),
        "element-type": ("type_mismatch", "tags[1]: expected a JSON string, got integer"),
        "null-element": ("type_mismatch", "tags[1]: expected a JSON string, got null"),
        "pattern": ("invalid_value", "tags[2]: 'C' is not a lower-case word"),
        "empty-string": ("invalid_value", "tags[1]: empty string"),
        "too-few": ("out_of_range", "tags: 0 items is below 1"),
        "too-many": ("out_of_range", "tags: 4 items exceeds 3"),
        "repeat": ("invalid_value", "tags[2]: repeats tags[0] (uniqueItems)"),
        "number-repeat": ("invalid_value", "scores[2]: repeats scores[0] (uniqueItems)"),
        "zero-repeat": ("invalid_value", "scores[1]: repeats scores[0] (uniqueItems)"),
        "null-repeat": ("invalid_value", "scores[2]: repeats scores[0] (uniqueItems)"),
        "range": ("out_of_range", "scores[1]: 11.0 is outside 0..10"),
        "date-time": ("type_mismatch", "seen[0]: not an ISO-8601 timestamp: '2024-05-01'"),
        "nested": ("out_of_range", "shipping.steps[1]: 0 is below 1"),
        "nested-type": ("type_mismatch", "shipping.steps[0]: expected a JSON integer, got number"),
        "required": ("missing_field", "scores: required"),
        "map": (None, None),
        "map-not-object": ("type_mismatch", "counts: expected a JSON object, got array"),
        "map-type": ("type_mismatch", "counts.b: expected a JSON integer, got string"),
        "map-range": ("out_of_range", "counts.a: -1 is below 0"),
        "map-size": ("out_of_range", "counts: 3 members exceeds 2"),
        "lines": (None, None),
        "line-required": ("missing_field", "lines[1].sku: required"),
        "line-type": ("type_mismatch", "lines[1]: expected a JSON object, got string"),
        "line-value": ("out_of_range", "lines[0].qty: 0 is below 1"),
        "line-unknown": (
            "invalid_value",
            "lines[0].gift, lines[0].note: not a property of the contract",
        ),
        "others": (None, None),
        "other-length": ("out_of_range", "note: 4 characters exceeds 3"),
        "other-type": ("type_mismatch", "note: expected a JSON string, got integer"),
        "nested-other": ("type_mismatch", "shipping.floor: expected a JSON integer, got string"),
    } == {r["key_text"]: (r["error_code"], r["error_detail"]) for r in rows}
    # A JSON Schema validator's verdicts agree (but on date-time, a format it only notes).
    validator = Draft202012Validator(contract.document)
    assert {k: validator.is_valid(v) for k, v in records if k != "date-time"} == {
        r["key_text"]: r["error_code"] is None for r in rows if r["key_text"] != "date-time"
    }
    valid = {r["key_text"]: r["record"] for r in rows if r["error_code"] is None}
    assert (["a", "b"], [0.0, None, 9.5], [1, 2]) == (
        valid["valid"]["tags"],
        valid["valid"]["scores"],
        valid["valid"]["shipping_steps"],
    )
    assert ["2024-04-30T22:00:00", "1970-01-01T00:00:00"] == [
        t.isoformat() for t in valid["valid"]["seen"]
    ]
    assert {"a": 7, "b": 0} == valid["map"]["counts"]
    assert '{"note":"abc"}' == valid["others"]["_rescued"]
    assert [("A-1", 2), ("B-2", None)] == [(r.sku, r.qty) for r in valid["lines"]["lines"]]
    assert (None, [], []) == (
        valid["empty-and-null"]["tags"], valid["empty-and-null"]["scores"],
        valid["empty-and-null"]["seen"],
    )  # fmt: skip


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (set_property("tags", {"type": "array"}),
         "/properties/tags: an array declares its elements' schema (items)"),
        (set_property("tags", {"type": "array", "items": {"type": "object"}}),
         "/properties/tags/items: an array's objects declare their properties (an array of"
         " free-form objects is not typed: leave the property undeclared, it is kept in"
         " _rescued)"),
        (set_property("tags", {"type": "array", "items": {"type": "array",
                                                          "items": {"type": "string"}}}),
         "/properties/tags/items/type: keyword 'type' is not supported by the engine: an"
         " array's elements are scalars (or null), or objects, not arrays: leave the property"
         " undeclared, it is kept in _rescued (docs/contracts.md lists the keywords it"
         " compiles)"),
        (set_property("lines", {"type": "array", "items": {"type": "object", "properties": {
            "sku": {"type": "object", "properties": {}}}}}),
         "/properties/lines/items/properties/sku/type: keyword 'type' is not supported by the"
         " engine: an array's objects hold scalars (or null), not objects: leave the property"
         " undeclared, it is kept in _rescued (docs/contracts.md lists the keywords it"
         " compiles)"),
        (set_property("lines", {"type": "array", "items": {"type": "object", "properties": {
            "sku code": {"type": "string"}}}}),
         "/properties/lines/items/properties/sku code: 'sku code' cannot name a field of an"
         " array's objects: letters, digits and _, not first a digit"),
        (set_property("lines", {"type": "array", "items": {"type": "object", "properties": {
            "sku": {"type": "string"}, "SKU": {"type": "string"}}}}),
         "/properties/lines/items/properties/SKU: 'SKU' and 'sku' name one field of an"
         " array's objects (Spark compares names ignoring case)"),
        (set_property("lines", {"type": "array", "uniqueItems": True, "items": {
            "type": "object", "properties": {"sku": {"type": "string"}}}}),
         "/properties/lines/uniqueItems: keyword 'uniqueItems' is not supported by the"
         " engine: it compares scalars, and this array's elements are objects"
         " (docs/contracts.md lists the keywords it compiles)"),
        (set_property("lines", {"type": "array", "items": {"type": "object", "properties": {
            "sku": {"type": "string"}}, "required": ["qty"]}}),
         "/properties/lines/items/required/0: 'qty' is required but not a property (declare"
         " it under properties)"),
        (set_property("tags", {"type": ["array", "string"], "items": {"type": "string"}}),
         "/properties/tags/type: keyword 'type' is not supported by the engine: an array or"
         " null, not both (docs/contracts.md lists the keywords it compiles)"),
        (set_property("tags", {"type": "array", "items": {"minLength": 1}}),
         "/properties/tags/items: items declares its elements' type"),
        (set_property("tags", {"type": "array", "items": {"type": "integer",
                                                          "minLength": 1}}),
         "/properties/tags/items/minLength: minLength applies to strings, and this property"
         " is integer: it would never apply"),
        (set_property("tags", {"type": "array", "minItems": 3, "maxItems": 2,
                               "items": {"type": "string"}}),
         "/properties/tags: minItems 3 is above maxItems 2: every value would be out of"
         " range"),
        (set_property("tags", {"type": "array", "items": {"type": "string"},
                               "x-lakehouse": {"mismatch": "x"}}),
         "/properties/tags/x-lakehouse: an array has no x-lakehouse block: its elements'"
         " annotations go in its items"),
        (set_property("tags", {"type": "array", "items": {"type": "string"},
                               "contains": {"const": "a"}}),
         "/properties/tags/contains: keyword 'contains' is not supported by the engine: an"
         " array's elements share one schema (items) (docs/contracts.md lists the keywords"
         " it compiles)"),
        (set_property("amount", {"type": "number", "items": {"type": "string"}}),
         "/properties/amount/items: keyword 'items' is not supported by the engine: items"
         " types the elements of a property of type array (docs/contracts.md lists the"
         " keywords it compiles)"),
        (members_with(allOf=[{
            "if": {"properties": {"tags": {"const": "a"}}}, "then": {"required": ["amount"]}}]),
         "/allOf/0/if/properties/tags: 'tags' is an array: an if compares a field with"
         " values, which no array is"),
        (members_with(allOf=[{
            "if": {"required": ["amount"]}, "then": {"properties": {"tags": {"maxItems": 1}}}}]),
         "/allOf/0/then/properties/tags: 'tags' is an array: a then/else has no rules for"
         " one"),
        (set_property("counts", {"type": "object", "additionalProperties": {"type": "object"}}),
         "/properties/counts/additionalProperties/type: keyword 'type' is not supported by the"
         " engine: a map's values are scalars (or null), not objects: leave the property"
         " undeclared, it is kept in _rescued (docs/contracts.md lists the keywords it"
         " compiles)"),
        (set_property("counts", {"type": "object", "properties": {"a": {"type": "integer"}},
                                 "additionalProperties": {"type": "object"}}),
         "/properties/counts/additionalProperties/type: keyword 'type' is not supported by the"
         " engine: the other members are scalars (or null), not objects: true keeps them"
         " unchecked (docs/contracts.md lists the keywords it compiles)"),
        (lambda d: d.update(additionalProperties={"maxLength": 3}),
         "/additionalProperties: additionalProperties declares the other members' type"),
        (lambda d: d.update(additionalProperties={"type": "integer", "maxLength": 3}),
         "/additionalProperties/maxLength: maxLength applies to strings, and this property is"
         " integer: it would never apply"),
        (set_property("lines", {"type": "array", "items": {"type": "object", "properties": {
            "sku": {"type": "string"}}, "additionalProperties": {"type": "string"}}}),
         "/properties/lines/items/additionalProperties: keyword 'additionalProperties' is not"
         " supported by the engine: an array's objects take true or false, not a schema"
         " (docs/contracts.md lists the keywords it compiles)"),
        (set_property("counts", {"type": "object", "x-lakehouse": {"mismatch": "x"},
                                 "additionalProperties": {"type": "integer"}}),
         "/properties/counts/x-lakehouse: a map has no x-lakehouse block: its values'"
         " annotations go in its additionalProperties"),
        (set_property("counts", {"type": "object", "minProperties": 2, "maxProperties": 1,
                                 "additionalProperties": {"type": "integer"}}),
         "/properties/counts: minProperties 2 is above maxProperties 1: every value would be"
         " out of range"),
        (members_with(allOf=[{
            "if": {"properties": {"counts": {"const": 1}}}, "then": {"required": ["amount"]}}]),
         "/allOf/0/if/properties/counts: 'counts' is a map: an if compares a field with"
         " values, which no map is"),
    ],
    ids=["no-items", "free-form-objects", "arrays", "object-in-object", "item-name", "item-case",
         "unique-objects", "item-required", "union", "untyped-items", "misplaced-keyword",
         "min-above-max", "extension", "contains", "items-elsewhere", "if", "then",
         "map-of-objects", "others-of-objects", "others-untyped", "others-misplaced-keyword",
         "others-in-array-objects", "map-extension", "map-min-above-max",
         "map-if"],
)  # fmt: skip
def test_an_array_or_map_mistake_is_refused_with_one_line(edit: Edit, expected: str) -> None:
    assert expected == refusal(orders_with(edit))


def test_an_array_or_a_map_keeps_no_file_statistics() -> None:
    for column, what in (("tags", "an array"), ("counts", "a map")):
        document = orders_with(with_members, stats_columns=[column])

        assert (
            f"/x-lakehouse/stats_columns/0: {column!r} is {what}: Delta keeps no file"
            " statistics of one"
        ) == refusal(document)
