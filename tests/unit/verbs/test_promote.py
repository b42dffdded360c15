"""promote: which silver rows get a new field's column from their ``_rescued`` value
(`promoted_rows`, pure), which fields may be promoted, and a whole run on a local lake
(lease, evolution, MERGE, audit), exactly once."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from service.config import Location, Settings
from service.contracts.loading import SHIPPED_DIR, parse_contract
from service.contracts.model import Contract
from service.errors import ConfigError
from service.lake.delta import ensure_table
from service.lake.schemas import COORDINATES
from service.lake.tables import PROMOTIONS_TABLE, contract_tables
from service.verbs import promote as promote_verb
from service.verbs.promote import promotable, promoted_rows
from tests.support.contracts import DRAFT
from tests.support.lake import LOCAL_FILES

T0 = datetime(2026, 11, 1, 12, 0)
SHIPPED_AT = datetime(2026, 11, 2, 3, 4, 5)


def orders(*new_fields: str) -> dict[str, Any]:
    """An events contract; ``new_fields`` adds the fields producers already send: ``priority``
    (1 to 5), ``shipped_at`` (a date-time), ``meta`` (a free-form object) and ``tags`` (an
    array of unique strings)."""
    properties: dict[str, Any] = {
        "order_id": {"type": "string", "minLength": 1},
        "placed_at": {"type": "string", "format": "date-time"},
        "address": {"type": ["object", "null"], "properties": {"city": {"type": "string"}}},
    }
    known = {
        "priority": {"type": ["integer", "null"], "minimum": 1, "maximum": 5},
        "shipped_at": {"type": ["string", "null"], "format": "date-time"},
        "meta": {"type": ["object", "null"]},
        "tags": {"type": ["array", "null"], "uniqueItems": True, "items": {"type": "string"}},
    }
    properties |= {name: known[name] for name in new_fields}
    return {
        "$schema": DRAFT,
        "type": "object",
        "required": ["order_id", "placed_at"],
        "properties": properties,
        "x-lakehouse": {
            "name": "orders",
            "topic": "shop.orders",
            "mode": "events",
            "id": "order_id",
            "event_time": "placed_at",
            "version": 1 + len(new_fields),
        },
    }


def contract(document: dict[str, Any]) -> Contract:
    return parse_contract(document, "/contracts/orders.json", "orders", {})


# --- promoted_rows ---------------------------------------------------------------------------

SILVER = (
    "kafka_topic string, kafka_partition int, kafka_offset long, priority bigint,"
    " shipped_at timestamp, _rescued string"
)


def test_a_valid_rescued_value_becomes_the_column_and_leaves_rescued(
    spark: SparkSession,
) -> None:
    v3 = contract(orders("priority", "shipped_at"))
    fields = promotable(v3, ["priority", "shipped_at"])
    rows = [
        (1, '{"priority":3}'),
        (2, '{"coupon":"X","priority":4}'),
        (3, '{"priority":9}'),  # above its maximum
        (4, '{"priority":"high"}'),  # not an integer
        (5, '{"coupon":"Y"}'),  # not one of the fields
        (6, None),
        (7, '{"meta":{"priority":2}}'),  # the name, nested: not the field
        (8, '{"my_priority":2}'),
        (9, '{"priority":2,"shipped_at":"yesterday"}'),
        (10, '{"shipped_at":"2026-11-02T03:04:05Z"}'),
        (11, '{"priority":null}'),  # null is a valid value of the field
    ]
    silver = spark.createDataFrame(
        [("shop.orders", 0, offset, None, None, rescued) for offset, rescued in rows]
        # Invalid values: the row keeps the columns it already has.
        + [("shop.orders", 0, 12, 2, SHIPPED_AT, '{"priority":0,"shipped_at":"2026-13-01"}')],
        SILVER,
    )

    result = promoted_rows(silver, v3, fields, list(COORDINATES))

    assert [*COORDINATES, "priority", "shipped_at", "_rescued", "_promoted"] == result.columns
    got = {
        r.kafka_offset: (r.priority, r.shipped_at, r._rescued, r._promoted)
        for r in result.collect()
    }
    assert {
        1: (3, None, None, True),
        2: (4, None, '{"coupon":"X"}', True),
        3: (None, None, '{"priority":9}', False),
        4: (None, None, '{"priority":"high"}', False),
        9: (2, None, '{"shipped_at":"yesterday"}', True),
        10: (None, SHIPPED_AT, None, True),
        11: (None, None, None, True),
        12: (2, SHIPPED_AT, '{"priority":0,"shipped_at":"2026-13-01"}', False),
    } == got


def test_only_the_named_fields_are_promoted(spark: SparkSession) -> None:
    v3 = contract(orders("priority", "shipped_at"))
    silver = spark.createDataFrame(
        [("shop.orders", 0, 1, None, None, '{"priority":5,"shipped_at":"2026-11-02T03:04:05Z"}')],
        SILVER,
    ).drop("shipped_at")

    [row] = promoted_rows(silver, v3, promotable(v3, ["priority"]), list(COORDINATES)).collect()

    assert (5, '{"shipped_at":"2026-11-02T03:04:05Z"}', True) == (
        row.priority,
        row._rescued,
        row._promoted,
    )


def test_a_rescued_object_becomes_a_free_form_columns_json_text(spark: SparkSession) -> None:
    v2 = contract(orders("meta"))
    silver = spark.createDataFrame(
        [
            ("shop.orders", 0, 1, '{"coupon":"X","meta":{"b":[1.50],"a":null}}'),
            ("shop.orders", 0, 2, '{"meta":"gift"}'),  # not an object: stays rescued
        ],
        "kafka_topic string, kafka_partition int, kafka_offset long, _rescued string",
    ).withColumn("meta", F.lit(None).cast("string"))

    result = promoted_rows(silver, v2, promotable(v2, ["meta"]), list(COORDINATES))

    assert {
        1: ('{"a":null,"b":[1.5]}', '{"coupon":"X"}', True),
        2: (None, '{"meta":"gift"}', False),
    } == {r.kafka_offset: (r.meta, r._rescued, r._promoted) for r in result.collect()}


def test_a_rescued_array_becomes_an_array_column_where_its_elements_are_valid(
    spark: SparkSession,
) -> None:
    v2 = contract(orders("tags"))
    silver = spark.createDataFrame(
        [
            ("shop.orders", 0, 1, '{"tags":["gift","\\u00e9t\\u00e9"]}'),
            ("shop.orders", 0, 2, '{"tags":["a",1]}'),  # an element not a string: stays
            ("shop.orders", 0, 3, '{"tags":["a","a"]}'),  # not unique: stays
        ],
        "kafka_topic string, kafka_partition int, kafka_offset long, _rescued string",
    ).withColumn("tags", F.lit(None).cast("array<string>"))

    result = promoted_rows(silver, v2, promotable(v2, ["tags"]), list(COORDINATES))

    assert {
        1: (["gift", "été"], None, True),
        2: (None, '{"tags":["a",1]}', False),
        3: (None, '{"tags":["a","a"]}', False),
    } == {r.kafka_offset: (r.tags, r._rescued, r._promoted) for r in result.collect()}


# --- promotable ------------------------------------------------------------------------------


def test_only_top_level_leaf_fields_of_the_contract_are_promotable() -> None:
    v2 = contract(orders("priority"))
    assert ["priority"] == [f.path for f in promotable(v2, ["priority"])]
    listed = "(fields: order_id, placed_at, priority)"
    for name in ("nope", "address", "address.city"):
        with pytest.raises(ConfigError) as raised:
            promotable(v2, [name])
        assert f"promote: {name!r} is not a top-level field of contract orders {listed}" == str(
            raised.value
        )


def test_promotable_names_a_shipped_contracts_nested_object() -> None:
    sensors = parse_contract(
        json.loads((SHIPPED_DIR / "sensors.json").read_text()), "s.json", "sensors", {}
    )
    with pytest.raises(ConfigError, match=r"^promote: 'geolocation' is not a top-level field"):
        promotable(sensors, ["value", "geolocation"])


# --- a whole run on a local lake ------------------------------------------------------------


def rows_of(uri: str) -> list[dict[str, Any]]:
    """A table's rows, read with delta-rs (no Spark job)."""
    rows: list[dict[str, Any]] = DeltaTable(uri).to_pyarrow_table().to_pylist()
    return rows


def silver_rows(uri: str) -> dict[int, tuple[Any, str | None]]:
    return {r["kafka_offset"]: (r.get("priority"), r["_rescued"]) for r in rows_of(uri)}


def test_promote_fills_the_new_column_exactly_once_under_the_lease(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    contracts = tmp_path / "contracts"
    contracts.mkdir()
    (contracts / "orders.json").write_text(json.dumps(orders()))
    settings = Settings(storage_root=str(tmp_path / "lake"), contracts_dir=str(contracts))
    v1 = settings.contracts["orders"]
    table = contract_tables(v1).silver
    uri = table.uri(settings.storage_uri)
    schema = table.schema
    assert schema is not None
    ensure_table(LOCAL_FILES, uri, table)
    rescued = ['{"priority":3}', '{"coupon":"X","priority":1}', '{"priority":9}', None]
    spark.createDataFrame(
        [(f"o{i}", T0, None, r, "shop.orders", 0, i, T0, T0) for i, r in enumerate(rescued)],
        schema,
    ).write.format("delta").mode("append").save(uri)
    # The contract now names the field: promote applies it to silver, then promotes.
    (contracts / "orders.json").write_text(json.dumps(orders("priority")))
    settings = Settings(storage_root=str(tmp_path / "lake"), contracts_dir=str(contracts))
    monkeypatch.setattr(promote_verb, "build_spark", lambda *_a, **_k: spark)
    delta_uri = f"{Location(settings.storage_uri).for_delta_rs()}/{table.name}"

    first = promote_verb.promote(settings, "shop.orders", ["priority"])

    assert ("orders", "silver/orders", ["priority"], 2, 1, []) == (
        first.contract,
        first.table,
        first.fields,
        first.rows_promoted,
        first.rows_kept,
        first.unfinished,
    )
    assert {
        0: (3, None),
        1: (1, '{"coupon":"X"}'),
        2: (None, '{"priority":9}'),
        3: (None, None),
    } == silver_rows(delta_uri)
    delta = DeltaTable(delta_uri)
    operations = [h["operation"] for h in delta.history(3)]
    assert ["MERGE", "SET TBLPROPERTIES", "ADD COLUMNS"] == operations
    version = delta.version()

    second = promote_verb.promote(settings, "orders", ["priority"])

    assert (0, 1, []) == (second.rows_promoted, second.rows_kept, second.unfinished)
    assert version == DeltaTable(delta_uri).version()
    assert 3 == silver_rows(delta_uri)[0][0]
    audit = rows_of(f"{Location(settings.storage_uri).for_delta_rs()}/{PROMOTIONS_TABLE.name}")
    runs = sorted(
        (r["run_id"] == first.run_id, r["outcome"], r["rows_promoted"], r["rows_kept"],
         r["fields"], r["table"], r["contract"])
        for r in audit
    )  # fmt: skip
    assert [
        (False, "done", 0, 1, "priority", "silver/orders", "orders"),
        (False, "started", None, None, "priority", "silver/orders", "orders"),
        (True, "done", 2, 1, "priority", "silver/orders", "orders"),
        (True, "started", None, None, "priority", "silver/orders", "orders"),
    ] == runs
    assert {first.run_id, second.run_id} == {r["run_id"] for r in audit}
    lease = tmp_path / "lake" / "_checkpoints" / "_driver_lease.json"
    assert not lease.exists() or "" == lease.read_text()  # released


def test_promote_refuses_a_topic_no_contract_reads(tmp_path: Path) -> None:
    settings = Settings(storage_root=str(tmp_path / "lake"))
    with pytest.raises(ConfigError) as raised:
        promote_verb.promote(settings, "shop.orders", ["priority"])
    assert "promote: no contract reads topic 'shop.orders'" == str(raised.value)
    assert not (tmp_path / "lake").exists()
