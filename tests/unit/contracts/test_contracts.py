"""The contract loader: the shipped contracts, INGEST_CONTRACTS_DIR's additions and
replacements, topic overrides, and the one-line refusal of every document the engine
cannot compile (unsupported keywords, invalid JSON Schema, a bad x-lakehouse block),
down to the command line's exit 2 before anything is contacted."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from service.config import Settings
from service.contracts.loading import SHIPPED_DIR, load_contracts, parse_contract, read_contract
from service.contracts.model import Tables
from service.errors import ContractError
from tests.support.contracts import DRAFT, orders, shipped
from tests.support.contracts import refusal as contract_refusal
from tests.support.repo import REPO

pytestmark = pytest.mark.usefixtures("clean_env")

SOURCE = "/contracts/users.json"


def write(directory: Path, name: str, document: dict[str, Any]) -> Path:
    directory.mkdir(exist_ok=True)
    path = directory / f"{name}.json"
    path.write_text(json.dumps(document))
    return path


def refusal(document: dict[str, Any], source: str = SOURCE) -> str:
    return contract_refusal(document, source)


def users_with(change: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    document = shipped("users")
    change(document)
    return document


# --- the shipped contracts ----------------------------------------------------------------


def test_the_shipped_contracts_load_with_their_topics_modes_keys_and_tables() -> None:
    contracts = load_contracts(None, {})

    assert ["users", "sensors"] == [c.name for c in contracts]
    users, sensors = contracts["users"], contracts["sensors"]
    assert ("users", "entities", "user_id", "updated_at", None) == (
        users.topic,
        users.mode,
        users.key,
        users.order_by,
        users.id_field,
    )
    assert Tables("bronze/users", "silver/users", None) == users.tables
    assert ("sensors", "events", "event_id", "event_time", ("event_date", "event_time")) == (
        sensors.topic,
        sensors.mode,
        sensors.id_field,
        sensors.event_time,
        sensors.partition,
    )
    assert (
        Tables("bronze/sensors", "silver/sensor_readings", "silver/sensor_duplicates")
        == sensors.tables
    )
    assert str(SHIPPED_DIR / "users.json") == users.source
    assert ("user_id", "first_name", "last_name", "dob", "gender", "country", "updated_at") == (
        users.top_level
    )
    assert ["geo_city", "geo_country"] == [
        f.column for f in sensors.leaves if f.path.startswith("geolocation.")
    ]
    assert ["magnitude"] == [d.column for d in sensors.derived]


def test_the_settings_read_the_shipped_contracts_when_no_directory_is_given() -> None:
    contracts = Settings().contracts
    assert ["users", "sensors"] == [c.name for c in contracts]
    assert 2 == len(contracts)


# --- INGEST_CONTRACTS_DIR and topic overrides -----------------------------------------------


def test_a_contracts_dir_adds_a_contract_and_replaces_a_shipped_one_by_name(
    tmp_path: Path,
) -> None:
    write(tmp_path, "orders", orders(topic="shop.orders", event_time="placed_at"))
    users = shipped("users")
    users["properties"]["nickname"] = {"type": ["string", "null"], "maxLength": 40}
    users_path = write(tmp_path, "users", users)

    contracts = load_contracts(str(tmp_path), {})

    assert ["users", "sensors", "orders"] == [c.name for c in contracts]
    assert str(users_path) == contracts["users"].source
    assert "nickname" in contracts["users"].top_level
    assert str(SHIPPED_DIR / "sensors.json") == contracts["sensors"].source
    extra = contracts["orders"]
    assert ("shop.orders", "events", "order_id", "placed_at") == (
        extra.topic,
        extra.mode,
        extra.id_field,
        extra.event_time,
    )
    assert Tables("bronze/orders", "silver/orders", "silver/orders_duplicates") == extra.tables
    assert "ingest_orders" == extra.query


def test_settings_take_the_contracts_dir_and_the_topic_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    write(tmp_path, "orders", orders(topic="shop.orders", event_time="placed_at"))
    monkeypatch.setenv("INGEST_CONTRACTS_DIR", str(tmp_path))
    monkeypatch.setenv("INGEST_ORDERS_TOPIC", "shop.orders.v2")
    monkeypatch.setenv("INGEST_USERS_TOPIC", "people")

    contracts = Settings().contracts

    assert {"users": "people", "sensors": "sensors", "orders": "shop.orders.v2"} == {
        c.name: c.topic for c in contracts
    }


def test_a_topic_override_names_the_contract_not_its_file() -> None:
    contracts = load_contracts(None, {"sensors": "readings.v1"})
    assert ("users", "readings.v1") == (contracts["users"].topic, contracts["sensors"].topic)


def test_a_contracts_dir_that_is_not_a_directory_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(ContractError) as raised:
        load_contracts(str(missing), {})
    assert f"INGEST_CONTRACTS_DIR: {missing} is not a directory" == str(raised.value)


def test_a_file_that_is_not_json_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "orders.json"
    path.write_text('{"type": "object",')
    with pytest.raises(ContractError) as raised:
        read_contract(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: not a readable JSON document: ")
    assert 1 == len(message.splitlines())


# --- unsupported keywords -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "pointer", "keyword", "why"),
    [
        (
            lambda d: d["properties"]["first_name"].update(oneOf=[{"type": "string"}]),
            "/properties/first_name/oneOf",
            "oneOf",
            ": only alternatives that each name a type alone are read (as a union of types);"
            " alternatives of rules are written as if/then/else",
        ),
        (
            lambda d: d["properties"]["country"].update({"$defs": {"c": {"type": "string"}}}),
            "/properties/country/$defs",
            "$defs",
            ": definitions stand under the document's root $defs",
        ),
        (
            lambda d: d.update(patternProperties={"^x_": {"type": "string"}}),
            "/patternProperties",
            "patternProperties",
            "",
        ),
        (
            lambda d: d["properties"]["last_name"].update(format="email"),
            "/properties/last_name/format",
            "format",
            ": 'email'",
        ),
        (
            lambda d: d["properties"].update(
                address={
                    "type": ["object", "null"],
                    "properties": {"city": {"type": "string", "anyOf": [{"minLength": 1}]}},
                }
            ),
            "/properties/address/properties/city/anyOf",
            "anyOf",
            ": only alternatives that each name a type alone are read (as a union of types);"
            " alternatives of rules are written as if/then/else",
        ),
        (
            lambda d: d["properties"].update(
                tags={"type": "array", "items": {"type": "string"}, "prefixItems": [{}]}
            ),
            "/properties/tags/prefixItems",
            "prefixItems",
            ": an array's elements share one schema (items); a tuple is not typed",
        ),
        (
            lambda d: d["x-lakehouse"].update(retention="7d"),
            "/x-lakehouse/retention",
            "retention",
            "",
        ),
    ],
    ids=[
        "oneOf",
        "nested-$defs",
        "patternProperties",
        "format-email",
        "nested-anyOf",
        "tuple",
        "ext",
    ],
)
def test_an_unsupported_keyword_is_refused_naming_the_file_pointer_and_keyword(
    change: Callable[[dict[str, Any]], object], pointer: str, keyword: str, why: str
) -> None:
    message = refusal(users_with(change))
    assert (
        f"{SOURCE}: {pointer}: keyword {keyword!r} is not supported by the engine{why}"
        " (docs/contracts.md lists the keywords it compiles)"
    ) == message


def test_annotations_are_kept_and_have_no_effect() -> None:
    plain = parse_contract(shipped("users"), SOURCE, "users", {})
    annotated = users_with(
        lambda d: d["properties"]["first_name"].update(
            title="Given name", examples=["Ada"], deprecated=False, **{"$comment": "free text"}
        )
    )
    contract = parse_contract(annotated, SOURCE, "users", {})
    assert plain.payload_columns() == contract.payload_columns()
    assert plain.fingerprint != contract.fingerprint  # the document is what it records


# --- invalid JSON Schema --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda d: d["properties"]["first_name"].update(type="strin"),
            "not a valid JSON Schema at /properties/first_name/type: 'strin' is not valid"
            " under any of the given schemas",
        ),
        (
            lambda d: d["properties"]["user_id"].update(minimum="x"),
            "not a valid JSON Schema at /properties/user_id/minimum: 'x' is not of type 'number'",
        ),
        (
            lambda d: d.update(required="user_id"),
            "not a valid JSON Schema at /required: 'user_id' is not of type 'array'",
        ),
    ],
    ids=["type-strin", "minimum-x", "required-string"],
)
def test_a_document_that_fails_the_meta_schema_is_refused_with_one_line(
    change: Callable[[dict[str, Any]], object], expected: str
) -> None:
    assert f"{SOURCE}: {expected}" == refusal(users_with(change))


def test_another_draft_is_refused() -> None:
    document = users_with(
        lambda d: d.update({"$schema": "http://json-schema.org/draft-07/schema#"})
    )
    assert (
        f"{SOURCE}: /$schema: keyword '$schema' is not supported by the engine: only {DRAFT} is"
        " supported (docs/contracts.md lists the keywords it compiles)"
    ) == refusal(document)


def test_a_contract_that_is_not_an_object_schema_is_refused() -> None:
    assert f"{SOURCE}: a contract is a JSON object (a JSON Schema document)" == refusal(
        [shipped("users")]  # type: ignore[arg-type]
    )
    assert f'{SOURCE}: /type: a contract describes a JSON object: "type": "object"' == refusal(
        users_with(lambda d: d.update(type="array"))
    )


# --- the x-lakehouse block ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda d: d["x-lakehouse"].update(mode="upsert"),
            '/x-lakehouse/mode: "events" (append) or "entities" (upsert by key)',
        ),
        (
            lambda d: d["x-lakehouse"].pop("mode"),
            '/x-lakehouse/mode: "events" (append) or "entities" (upsert by key)',
        ),
        (
            lambda d: d["x-lakehouse"].pop("key"),
            "/x-lakehouse/key: None is not a top-level property of the contract",
        ),
        (
            lambda d: d["x-lakehouse"].update(key="uid"),
            "/x-lakehouse/key: 'uid' is not a top-level property of the contract",
        ),
        (
            lambda d: d["x-lakehouse"].update(order_by="changed_at"),
            "/x-lakehouse/order_by: 'changed_at' is not a top-level property of the contract",
        ),
        (
            lambda d: d["x-lakehouse"].update(order_by="first_name"),
            "/x-lakehouse/order_by: 'first_name' must be a required, non-null date-time property",
        ),
        (
            lambda d: d["x-lakehouse"].update(name="Users"),
            "/x-lakehouse/name: 'Users' is not a lower-case identifier (nor one of alerts)",
        ),
        (
            lambda d: d["x-lakehouse"].update(tables={"silver": "gold/users"}),
            "/x-lakehouse/tables/silver: 'gold/users' is not silver/<name>",
        ),
    ],
    ids=[
        "unknown-mode",
        "no-mode",
        "no-key",
        "key-not-a-field",
        "order-by-not-a-field",
        "order-by-nullable",
        "name",
        "table-layer",
    ],
)
def test_a_bad_extension_block_is_refused_naming_its_pointer(
    change: Callable[[dict[str, Any]], object], expected: str
) -> None:
    assert f"{SOURCE}: {expected}" == refusal(users_with(change))


def test_an_events_contract_needs_a_string_id_among_its_fields() -> None:
    no_id = orders(topic="shop.orders", event_time="placed_at")
    no_id["x-lakehouse"]["id"] = "ref"
    optional_id = orders(topic="shop.orders", event_time="placed_at")
    optional_id["required"] = ["placed_at"]
    numeric_id = orders(topic="shop.orders", event_time="placed_at")
    numeric_id["properties"]["order_id"] = {"type": "integer"}

    source = "/contracts/orders.json"
    assert (
        f"{source}: /x-lakehouse/id: 'ref' is not a top-level property of the contract"
        == refusal(no_id, source)
    )
    assert (
        f"{source}: /x-lakehouse/id: 'order_id' must be a required, non-null plain property"
        == refusal(optional_id, source)
    )
    assert f"{source}: /x-lakehouse/id: the id of an events contract is a string" == refusal(
        numeric_id, source
    )


def test_two_contracts_writing_one_table_are_refused(tmp_path: Path) -> None:
    document = orders(topic="shop.orders", event_time="placed_at")
    document["x-lakehouse"]["tables"] = {"bronze": "bronze/orders", "silver": "silver/users"}
    path = write(tmp_path, "orders", document)

    with pytest.raises(ContractError) as raised:
        load_contracts(str(tmp_path), {})

    assert f"{path}: table silver/users is also written by contract users" == str(raised.value)


def test_two_contracts_named_alike_are_refused(tmp_path: Path) -> None:
    document = orders(topic="shop.orders", event_time="placed_at")
    document["x-lakehouse"]["name"] = "sensors"
    document["x-lakehouse"]["tables"] = {"bronze": "bronze/orders", "silver": "silver/orders"}
    path = write(tmp_path, "orders", document)

    with pytest.raises(ContractError) as raised:
        load_contracts(str(tmp_path), {})

    sensors = SHIPPED_DIR / "sensors.json"
    assert f"{path}: contract name 'sensors' is also that of {sensors}" == str(raised.value)


def test_two_contracts_reading_one_topic_are_refused(tmp_path: Path) -> None:
    document = orders(topic="shop.orders", event_time="placed_at")
    document["x-lakehouse"]["topic"] = "users"
    path = write(tmp_path, "orders", document)

    with pytest.raises(ContractError) as raised:
        load_contracts(str(tmp_path), {})

    assert f"{path}: topic users is also read by contract users" == str(raised.value)


def test_a_topic_override_onto_another_contracts_topic_is_refused() -> None:
    with pytest.raises(ContractError) as raised:
        load_contracts(None, {"sensors": "users"})
    sensors = SHIPPED_DIR / "sensors.json"
    assert f"{sensors}: topic users is also read by contract users" == str(raised.value)


# --- the fingerprint ------------------------------------------------------------------------


def reordered(value: Any) -> Any:
    """``value`` with every object's keys in reverse order (same JSON value)."""
    if isinstance(value, dict):
        return {k: reordered(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reordered(v) for v in value]
    return value


def test_the_fingerprint_ignores_key_order_and_follows_the_content() -> None:
    document = shipped("sensors")
    turned = reordered(document)
    assert list(turned) != list(document)
    changed = copy.deepcopy(document)
    changed["properties"]["value"]["maximum"] = 1000

    fingerprint = parse_contract(document, "a.json", "sensors", {}).fingerprint
    again = parse_contract(turned, "b.json", "sensors", {"sensors": "elsewhere"}).fingerprint
    other = parse_contract(changed, "a.json", "sensors", {}).fingerprint

    assert 16 == len(fingerprint)
    assert int(fingerprint, 16) >= 0  # hexadecimal
    assert fingerprint == again  # neither key order, the file nor the deployed topic count
    assert fingerprint != other


# --- the command line -----------------------------------------------------------------------


def service_command(tmp_path: Path, verb: str) -> subprocess.CompletedProcess[str]:
    """``python -m service <verb>`` with a bad contract in INGEST_CONTRACTS_DIR, a storage root
    that must stay untouched and a Kafka address nothing listens on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INGEST_", "AWS_"))}
    env |= {
        "INGEST_CONTRACTS_DIR": str(tmp_path / "contracts"),
        "INGEST_STORAGE_ROOT": str(tmp_path / "lake"),
        "INGEST_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9",
        "INGEST_KAFKA_CONNECT_TIMEOUT_SECONDS": "30",
        "INGEST_HTTP_PORT": "0",
    }
    return subprocess.run(
        [sys.executable, "-m", "service", verb],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def bad_contract_dir(tmp_path: Path) -> Path:
    document = shipped("users")
    document["properties"]["first_name"]["oneOf"] = [{"type": "string"}]
    return write(tmp_path / "contracts", "users", document)


def test_status_with_a_bad_contract_exits_2_with_one_line_before_touching_anything(
    tmp_path: Path,
) -> None:
    path = bad_contract_dir(tmp_path)
    started = time.monotonic()

    done = service_command(tmp_path, "status")

    assert 2 == done.returncode, done.stderr
    assert "" == done.stdout
    [line] = done.stderr.splitlines()
    logged = json.loads(line)
    assert ("invalid_configuration", "error") == (logged["event"], logged["level"])
    assert (
        f"{path}: /properties/first_name/oneOf: keyword 'oneOf' is not supported by the engine:"
        " only alternatives that each name a type alone are read (as a union of types);"
        " alternatives of rules are written as if/then/else (docs/contracts.md lists the"
        " keywords it compiles)"
    ) == logged["error"]
    assert not (tmp_path / "lake").exists()
    assert time.monotonic() - started < 20  # no Kafka connection was tried


def test_run_with_a_bad_contract_exits_2_with_one_line_before_spark_or_kafka(
    tmp_path: Path,
) -> None:
    path = bad_contract_dir(tmp_path)

    done = service_command(tmp_path, "run")

    assert 2 == done.returncode, done.stderr
    # One line in all (the driver logs to stdout, the report verbs to stderr).
    [line] = (done.stdout + done.stderr).splitlines()
    logged = json.loads(line)
    assert "invalid_configuration" == logged["event"]
    assert logged["error"].startswith(f"{path}: /properties/first_name/oneOf: keyword 'oneOf'")
    assert not (tmp_path / "lake").exists()


def test_an_extension_block_that_crashed_the_loader_exits_2_with_one_line(
    tmp_path: Path,
) -> None:
    # A partition_by without its column ended in a KeyError: `crashed`, exit 1.
    path = write(tmp_path / "contracts", "orders", orders(partition_by={"day_of": "placed_at"}))

    done = service_command(tmp_path, "status")

    assert 2 == done.returncode, done.stderr
    [line] = done.stderr.splitlines()
    logged = json.loads(line)
    assert ("invalid_configuration", f"{path}: /x-lakehouse/partition_by: 'column' is a required"
            " property") == (logged["event"], logged["error"])  # fmt: skip
