"""What the contract loader refuses beyond the keywords: a required name that is not a
property, the events-only extension keys in an entities contract, a contract name that is a
key of `reconcile --json`, and table names outside their layer or of the lake's own tables;
and the loader's copies of the report's keys and the shared tables, which must not drift
from the modules that own them (service.contracts imports neither)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from service.contracts.loading import (
    REPORT_KEYS,
    SHARED_TABLES,
    load_contracts,
    parse_contract,
)
from service.errors import ContractError
from tests.support.contracts import changed, orders, shipped
from tests.support.contracts import refusal as contract_refusal


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
    from service.verbs.reconcile import Reconciliation

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
