"""Schema evolution: which contract changes a silver table can follow (pure: `table_changes`,
`refusal`), and how the compatible ones are applied to a real local Delta table
(`plan_evolution` with delta-rs, `apply_evolution` with Spark) and recorded with it."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from service.config import Location, Settings
from service.contracts.evolution import RUNBOOK, Change, refusal, table_changes
from service.contracts.loading import Contracts, parse_contract
from service.contracts.model import Contract
from service.errors import ContractChangeRefusedError
from service.lake.delta import ensure_table
from service.lake.evolution import apply_evolution, plan_evolution, recorded_contract
from service.lake.tables import (
    DOCUMENT_PROPERTY,
    FINGERPRINT_PROPERTY,
    VERSION_PROPERTY,
    contract_tables,
)
from tests.support.contracts import DRAFT, shipped
from tests.support.lake import LOCAL_FILES

REFUSED = "changed in a way its tables cannot follow"

Edit = Callable[[dict[str, Any]], object]


def orders() -> dict[str, Any]:
    """An events contract with a required plain field (``currency``: a NOT NULL column)."""
    return {
        "$schema": DRAFT,
        "type": "object",
        "required": ["order_id", "placed_at", "currency"],
        "properties": {
            "order_id": {"type": "string", "minLength": 1},
            "placed_at": {"type": "string", "format": "date-time"},
            "currency": {"type": "string", "enum": ["EUR", "USD"]},
            "quantity": {"type": ["integer", "null"], "minimum": 1},
            "amount": {"type": ["number", "null"], "minimum": 0, "maximum": 1000},
        },
        "x-lakehouse": {
            "name": "orders",
            "topic": "orders",
            "mode": "events",
            "id": "order_id",
            "event_time": "placed_at",
            "version": 1,
        },
    }


def devices() -> dict[str, Any]:
    """An entities contract with two fields that could be its key, and a nested object."""
    return {
        "$schema": DRAFT,
        "type": "object",
        "required": ["device_id", "serial", "updated_at"],
        "properties": {
            "device_id": {"type": "string", "minLength": 1},
            "serial": {"type": "string", "minLength": 1},
            "site": {"type": ["object", "null"], "properties": {"city": {"type": "string"}}},
            "updated_at": {"type": "string", "format": "date-time"},
        },
        "x-lakehouse": {
            "name": "devices",
            "mode": "entities",
            "key": "device_id",
            "order_by": "updated_at",
        },
    }


def contract(document: dict[str, Any]) -> Contract:
    name = document["x-lakehouse"]["name"]
    return parse_contract(document, f"/contracts/{name}.json", name, {})


def edited(document: dict[str, Any], *edits: Edit) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    for edit in edits:
        edit(changed)
    return changed


def silver(c: Contract) -> StructType:
    schema = contract_tables(c).silver.schema
    assert schema is not None
    return schema


def compare(before: dict[str, Any], after: dict[str, Any]) -> tuple[list[Change], str | None]:
    """The changes from a table written by ``before`` (recorded with it) to ``after``."""
    old, new = contract(before), contract(after)
    changes = table_changes(new, silver(new), silver(old), before)
    return changes, refusal(new, changes)


def refused(name: str, what: str) -> str:
    return (
        f"contract {name} (/contracts/{name}.json) {REFUSED}: {what}. Restore the previous"
        f" contract, or give the change a new field or table; see {RUNBOOK}."
    )


def add(name: str, schema: dict[str, Any], required: bool = False) -> Edit:
    def edit(d: dict[str, Any]) -> None:
        d["properties"][name] = schema
        if required:
            d["required"].append(name)

    return edit


def remove(name: str) -> Edit:
    def edit(d: dict[str, Any]) -> None:
        d["properties"].pop(name)
        if name in d["required"]:
            d["required"].remove(name)

    return edit


def retype(name: str, kind: Any) -> Edit:
    return lambda d: d["properties"][name].update(type=kind)


# --- compatible ------------------------------------------------------------------------------


def test_an_unchanged_contract_has_no_changes() -> None:
    for document in (orders(), shipped("users"), shipped("sensors")):
        assert ([], None) == compare(document, copy.deepcopy(document))


def test_a_new_optional_field_is_a_new_nullable_column() -> None:
    for document in (orders(), shipped("users")):
        changes, why = compare(
            document, edited(document, add("note", {"type": ["string", "null"]}))
        )
        column = StructField("note", StringType(), nullable=True)
        assert [Change("note", "a new optional field", False, add_column=column)] == changes
        assert why is None


def test_a_required_field_made_optional_drops_not_null() -> None:
    before = orders()
    after = edited(before, lambda d: d["required"].remove("currency"))

    changes, why = compare(before, after)

    assert [
        Change("currency", "made optional: accepts null from now on", False,
               drop_not_null="currency"),
        Change("required", "rules changed (applied to new records)", False),
    ] == changes  # fmt: skip
    assert why is None


@pytest.mark.parametrize(
    ("document", "field", "edit"),
    [
        (shipped("users"), "gender", lambda d: d["properties"]["gender"]["enum"].insert(3, "U")),
        (orders(), "amount", lambda d: d["properties"]["amount"].update(maximum=5000)),
        (orders(), "quantity", lambda d: d["properties"]["quantity"].pop("minimum")),
        (shipped("users"), "country", lambda d: d["properties"]["country"].update(
            pattern="^[A-Z]{2,3}$")),
    ],
    ids=["wider-enum", "bigger-maximum", "no-minimum", "looser-pattern"],
)  # fmt: skip
def test_a_relaxed_rule_is_compatible_and_changes_no_column(
    document: dict[str, Any], field: str, edit: Edit
) -> None:
    after = edited(document, edit)

    changes, why = compare(document, after)

    assert [Change(field, "value rules changed (applied to new records)", False)] == changes
    assert why is None
    assert silver(contract(document)) == silver(contract(after))


def reordered(value: Any) -> Any:
    """``value`` with every object's keys in reverse order (the same JSON value)."""
    if isinstance(value, dict):
        return {k: reordered(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reordered(v) for v in value]
    return value


@pytest.mark.parametrize(
    ("document", "edit"),
    [
        (orders(), lambda d: d["x-lakehouse"].update(tables={
            "bronze": "bronze/orders", "silver": "silver/orders",
            "duplicates": "silver/orders_duplicates"})),
        (devices(), lambda d: d["x-lakehouse"].update(tables={"silver": "silver/devices"})),
        (devices(), lambda d: d["x-lakehouse"].update(flatten={"site": "site_"})),
        (shipped("sensors"), lambda d: d["x-lakehouse"].update(
            tables={"silver": "silver/sensor_readings", "duplicates": "silver/sensor_duplicates",
                    "bronze": "bronze/sensors"},
            partition_by={"day_of": "event_time", "column": "event_date"})),
        (orders(), lambda d: d["x-lakehouse"].update(key="order_id")),
        (shipped("sensors"), lambda d: d["x-lakehouse"].update(key="event_id")),
        (shipped("sensors"), lambda d: d.update(reordered(d))),
    ],
    ids=["events-tables-written-out", "entities-tables-written-out", "default-flatten-prefix",
         "keys-reordered", "events-key-added", "events-key-changed", "document-reordered"],
)  # fmt: skip
def test_the_same_meaning_spelled_otherwise_is_no_structural_change(
    document: dict[str, Any], edit: Edit
) -> None:
    changes, why = compare(document, edited(document, edit))

    assert [] == [c for c in changes if c.field.startswith("x-lakehouse/")]
    assert why is None


def test_a_field_written_as_a_definition_is_no_change_either_way() -> None:
    written_out = orders()
    defined = edited(
        written_out,
        lambda d: d.update({"$defs": {"Money": d["properties"]["amount"]}}),
        lambda d: d["properties"].update(amount={"$ref": "#/$defs/Money"}),
    )
    for before, after in ((written_out, defined), (defined, written_out)):
        old, new = contract(before), contract(after)

        # The lake records the contract's document: the definitions resolved.
        changes = table_changes(new, silver(new), silver(old), old.document)

        assert ([], None) == (changes, refusal(new, changes))


def test_an_object_without_properties_kept_since_is_a_new_column_of_a_lake_written_before() -> None:
    # A release before kept none of its members, and made no column of it.
    document = edited(orders(), add("attributes", {"type": ["object", "null"]}))
    new = contract(document)
    before = StructType([c for c in silver(new).fields if c.name != "attributes"])

    changes = table_changes(new, silver(new), before, document)

    column = StructField("attributes", StringType(), nullable=True)
    assert [Change("attributes", "a new optional field", False, add_column=column)] == changes
    assert refusal(new, changes) is None


def test_a_nested_objects_other_members_kept_since_are_a_new_column_of_a_lake_written_before() -> (
    None
):
    # A release before checked them with the additionalProperties schema and kept none.
    shipping = {
        "type": ["object", "null"],
        "properties": {"city": {"type": ["string", "null"]}},
        "additionalProperties": {"type": "integer"},
    }
    document = edited(orders(), add("shipping", shipping))
    new = contract(document)
    assert [c.name for c in silver(new).fields][5:7] == ["shipping_city", "shipping_others"]
    before = StructType([c for c in silver(new).fields if c.name != "shipping_others"])

    changes = table_changes(new, silver(new), before, document)

    column = StructField("shipping_others", MapType(StringType(), LongType()), nullable=True)
    assert [Change("shipping_others", "a new optional field", False, add_column=column)] == (
        changes
    )
    assert refusal(new, changes) is None


def test_an_array_is_a_new_column_its_elements_rules_apply_and_its_items_type_is_kept() -> None:
    tags = {"type": ["array", "null"], "items": {"type": "string"}}
    before = edited(orders(), add("tags", tags))
    column = StructField("tags", ArrayType(StringType(), containsNull=True), nullable=True)
    assert [Change("tags", "a new optional field", False, add_column=column)] == compare(
        orders(), before
    )[0]

    # Elements allowed null, bounded, unique: rules, not columns.
    items = {"type": ["string", "null"], "maxLength": 8}
    relaxed = edited(
        before, lambda d: d["properties"]["tags"].update(items=items, maxItems=4, uniqueItems=True)
    )
    assert ([Change("tags", "value rules changed (applied to new records)", False)], None) == (
        compare(before, relaxed)
    )
    retyped = edited(before, lambda d: d["properties"]["tags"].update(items={"type": "integer"}))
    assert (
        refused("orders", "tags: type changed from array<string> to array<bigint>")
        == (compare(before, retyped)[1])
    )


GIFT = {"type": ["boolean", "null"]}


def lines(**item: Any) -> dict[str, Any]:
    """An array of order lines: objects with a required ``sku`` (``item`` added to theirs)."""
    properties = {"sku": {"type": "string"}, **item}
    return {"type": ["array", "null"],
            "items": {"type": "object", "required": ["sku"], "properties": properties}}  # fmt: skip


def test_a_field_added_inside_an_arrays_objects_after_the_others_is_compatible() -> None:
    before = edited(orders(), add("lines", lines()))

    def with_item(**item: Any) -> Edit:
        return lambda d: d["properties"].update(lines=lines(**item))

    changes, why = compare(before, edited(before, with_item(gift=GIFT)))
    added = (StructField("gift", BooleanType(), True),)
    assert ([
        Change("lines", "new optional fields inside its objects: gift", False, add_inside=added),
        Change("lines", "value rules changed (applied to new records)", False),
    ], None) == (changes, why)  # fmt: skip
    required = edited(before, with_item(gift=GIFT), lambda d: d["properties"]["lines"][
        "items"]["required"].append("gift"))  # fmt: skip
    assert refused("orders", "lines: a new required field inside its objects (gift): rows"
                   " already stored lack it") == compare(before, required)[1]  # fmt: skip
    # Before sku: the column's objects keep their fields' order, so it is a type change.
    first = edited(before, lambda d: d["properties"].update(lines={**lines(), "items": {
        **lines()["items"], "properties": {"gift": GIFT, "sku": {"type": "string"}}}}))  # fmt: skip
    retyped = "array<struct<sku:string>> to array<struct<gift:boolean,sku:string>>"
    assert refused("orders", f"lines: type changed from {retyped}") == compare(before, first)[1]


def test_framing_turned_on_adds_the_schema_id_column_and_turned_off_is_refused() -> None:
    plain = orders()
    framed = edited(plain, lambda d: d["x-lakehouse"].update(framing="confluent"))

    changes, why = compare(plain, framed)
    column = StructField("_schema_id", IntegerType(), nullable=True)
    assert ([Change("_schema_id", "a new optional field", False, add_column=column)], None) == (
        changes,
        why,
    )
    changes, why = compare(framed, plain)
    assert [Change("_schema_id", "removed or renamed: silver holds its column and rows", True)] == (
        changes
    )
    assert why is not None


# --- refused ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d["x-lakehouse"].update(key="serial"),
         Change("x-lakehouse/key", "changed from 'device_id' to 'serial': the tables were"
                " written by the other", True)),
        (lambda d: d["x-lakehouse"].update(flatten={"site": "location_"}),
         Change("x-lakehouse/flatten", "changed from None to {'site': 'location_'}: the tables"
                " were written by the other", True)),
    ],
    ids=["entity-key", "flatten-prefix"],
)  # fmt: skip
def test_an_entity_key_or_a_prefix_changed_in_meaning_is_refused(
    edit: Edit, expected: Change
) -> None:
    changes, why = compare(devices(), edited(devices(), edit))

    assert [expected] == [c for c in changes if c.field.startswith("x-lakehouse/")]
    assert why is not None


@pytest.mark.parametrize(
    ("document", "edit", "expected"),
    [
        (
            orders(),
            remove("amount"),
            "amount: removed or renamed: silver holds its column and rows",
        ),
        (
            shipped("users"),
            remove("gender"),
            "gender: removed or renamed: silver holds its column and rows",
        ),
        (
            shipped("users"),
            lambda d: d["properties"].update(sex=d["properties"].pop("gender")),
            "gender: removed or renamed: silver holds its column and rows",
        ),
        (
            orders(),
            add("channel", {"type": "string"}, required=True),
            "channel: a new required field: rows already stored lack it",
        ),
        (
            shipped("users"),
            add("email", {"type": "string"}, required=True),
            "email: a new required field: rows already stored lack it",
        ),
        (
            orders(),
            lambda d: d["required"].append("quantity") or retype("quantity", "integer")(d),
            "quantity: made required: rows already stored may lack it",
        ),
        (
            shipped("users"),
            lambda d: d["required"].append("last_name") or retype("last_name", "string")(d),
            "last_name: made required: rows already stored may lack it",
        ),
        (
            shipped("users"),
            lambda d: d["properties"].update(country={"type": ["integer", "null"]}),
            "country: type changed from string to bigint",
        ),
        (
            orders(),
            retype("quantity", ["number", "null"]),
            "quantity: integer widened to number: Delta cannot widen a bigint column to double"
            " for every reader of the lake (Spark, delta-rs)",
        ),
        (
            orders(),
            retype("amount", ["integer", "null"]),
            "amount: type changed from double to bigint",
        ),
    ],
    ids=[
        "removed",
        "removed-entities",
        "renamed",
        "new-required",
        "new-required-entities",
        "made-required",
        "made-required-entities",
        "string-to-integer",
        "integer-to-number",
        "number-to-integer",
    ],
)
def test_a_breaking_change_is_refused_with_one_line_naming_contract_field_and_rule(
    document: dict[str, Any], edit: Edit, expected: str
) -> None:
    name = document["x-lakehouse"]["name"]

    changes, why = compare(document, edited(document, edit))

    assert refused(name, expected) == why
    assert why is not None and 1 == len(why.splitlines())
    assert any(c.breaking for c in changes)


def test_a_refusal_counts_the_other_breaking_changes() -> None:
    before = orders()
    after = edited(before, remove("amount"), add("quantity", {"type": ["string", "null"]}))

    _, why = compare(before, after)

    assert refused(
        "orders", "quantity: type changed from bigint to string (and 1 more)"
    ) == why  # fmt: skip


def test_without_a_recorded_contract_the_table_alone_decides() -> None:
    before, new = orders(), contract(edited(orders(), add("note", {"type": ["string", "null"]})))
    old = contract(before)
    changes = table_changes(new, silver(new), silver(old), None)
    assert ["note"] == [c.field for c in changes]
    gone = contract(edited(before, remove("amount")))
    assert refused("orders", "amount: removed or renamed: silver holds its column and rows") == (
        refusal(gone, table_changes(gone, silver(gone), silver(old), None))
    )


# --- applied to a real table -----------------------------------------------------------------


def delta_table(settings: Settings, c: Contract) -> DeltaTable:
    root = Location(settings.storage_uri).for_delta_rs()
    return DeltaTable(f"{root}/{contract_tables(c).silver.name}")


def plan(settings: Settings, *contracts: Contract) -> list[Any]:
    root = Location(settings.storage_uri).for_delta_rs()
    return plan_evolution(
        Contracts({c.name: c for c in contracts}), root, settings.storage.delta_rs_options()
    )


def test_compatible_changes_are_applied_to_the_silver_table_and_recorded_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    settings = Settings(storage_root=str(tmp_path))
    v1_document = edited(orders(), add("lines", lines()))
    v1 = contract(v1_document)
    v2_document = edited(
        v1_document,
        add("note", {"type": ["string", "null"], "maxLength": 100}),
        lambda d: d["required"].remove("currency"),
        lambda d: d["x-lakehouse"].update(version=2),
        lambda d: d["properties"]["lines"]["items"]["properties"].update(gift=GIFT),
    )
    v2 = contract(v2_document)
    table = contract_tables(v1).silver
    ensure_table(LOCAL_FILES, table.uri(settings.storage_uri), table)

    [first] = plan(settings, v2)
    assert (True, True) == (first.exists, first.record)
    # Nothing recorded yet (a table from before contracts were recorded): the columns decide.
    assert [
        Change("currency", "made optional: accepts null from now on", False,
               drop_not_null="currency"),
        Change("lines", "new optional fields inside its objects: gift", False,
               add_inside=(StructField("gift", BooleanType(), True),)),
        Change("note", "a new optional field", False,
               add_column=StructField("note", StringType(), True)),
    ] == first.changes  # fmt: skip
    fenced: list[str] = []
    apply_evolution(spark, settings.storage_uri, [first], lambda: fenced.append("fence"))

    delta = delta_table(settings, v2)
    schema = StructType.fromJson(json.loads(delta.schema().to_json()))
    properties = dict(delta.metadata().configuration)
    assert ["fence"] == fenced
    assert StructField("note", StringType(), True) == schema["note"]
    assert StructField("currency", StringType(), True) == schema["currency"]
    assert "array<struct<sku:string,gift:boolean>>" == schema["lines"].dataType.simpleString()
    assert schema.fieldNames()[-1] == "note"  # added at the end, existing columns unmoved
    assert (v2.fingerprint, "2") == (properties[FINGERPRINT_PROPERTY], properties[VERSION_PROPERTY])
    assert v2_document == json.loads(base64.b64decode(properties[DOCUMENT_PROPERTY]))
    assert v2_document == recorded_contract(properties)
    assert [] == contract_tables(v2).silver.layout_differences(schema)
    version = delta.version()

    [again] = plan(settings, v2)
    assert (True, False, []) == (again.exists, again.record, again.changes)
    apply_evolution(spark, settings.storage_uri, [again], lambda: fenced.append("fence"))
    assert ["fence"] == fenced  # nothing to do: no write, no fence
    assert version == delta_table(settings, v2).version()

    broken = contract(edited(v2_document, remove("amount")))
    with pytest.raises(ContractChangeRefusedError) as raised:
        plan(settings, broken)
    assert refused("orders", "amount: removed or renamed: silver holds its column and rows") == (
        str(raised.value)
    )

    # A rule the recorded document had and the contract relaxes: recorded, no schema change.
    v3 = contract(edited(v2_document, lambda d: d["properties"]["amount"].update(maximum=9999)))
    [relaxed] = plan(settings, v3)
    assert (True, [("amount", False)]) == (
        relaxed.record,
        [(c.field, c.breaking) for c in relaxed.changes],
    )
    apply_evolution(spark, settings.storage_uri, [relaxed], lambda: None)
    after = delta_table(settings, v3)
    assert schema == StructType.fromJson(json.loads(after.schema().to_json()))
    assert v3.fingerprint == dict(after.metadata().configuration)[FINGERPRINT_PROPERTY]


def test_a_table_not_created_yet_only_needs_its_contract_recorded(tmp_path: Path) -> None:
    settings = Settings(storage_root=str(tmp_path))
    users = contract(shipped("users"))

    [evolution] = plan(settings, users)

    assert (False, True, []) == (evolution.exists, evolution.record, evolution.changes)
    assert "silver/users" == evolution.table.name


def test_a_type_change_on_a_real_table_is_refused_before_any_write(
    spark: SparkSession, tmp_path: Path
) -> None:
    settings = Settings(storage_root=str(tmp_path))
    v1 = contract(orders())
    table = contract_tables(v1).silver
    ensure_table(LOCAL_FILES, table.uri(settings.storage_uri), table)
    widened = contract(edited(orders(), retype("quantity", ["number", "null"])))

    with pytest.raises(ContractChangeRefusedError) as raised:
        plan(settings, widened)

    assert str(raised.value).startswith(
        f"contract orders (/contracts/orders.json) {REFUSED}: quantity: integer widened to number"
    )
    delta = delta_table(settings, v1)
    assert (0, LongType()) == (
        delta.version(),
        StructType.fromJson(json.loads(delta.schema().to_json()))["quantity"].dataType,
    )
