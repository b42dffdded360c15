"""Two topics the service has no code for, from contract files, and their evolution.

One story on the real broker and MinIO, with no Python file of the service changed: an
``events`` contract (orders: dedup by id, a day partition, a conditional rule) and an
``entities`` contract (devices: upsert by key, newest wins, tombstones, a flattened
object, its location and counts written as shared definitions, free-form labels kept as
JSON text, values framed by a schema registry serializer or not) written into a temporary
``INGEST_CONTRACTS_DIR``; the deployment runs only
them (``INGEST_CONTRACT_NAMES``). The driver ingests both into bronze, silver, the
quarantine and the duplicates; ``status``, ``show``, ``reconcile`` and the metrics know
them. Then the orders contract evolves as producers did: a field they already sent
(kept in ``_rescued``) becomes an optional column, an enum gains a value and a field
named by ``$ref`` is written out (no change). An invalid
contract and a breaking change are refused at start with one line; ``promote`` is
killed -9 after its MERGE and rerun; ``replay-quarantine`` moves what the relaxed rule
now accepts; a second driver applies nothing twice and fills the new column.
"""

from __future__ import annotations

import copy
import json
import re
import time
import urllib.request
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from devstack import KafkaBroker
from pyspark.sql import SparkSession

from service.config import Location
from service.contracts.loading import Contracts, read_contract
from service.lake.lakeview import LakeReader
from service.lake.tables import catalogue_of
from tests.support.kafka import end_offsets, group_offsets
from tests.support.lake import Lake
from tests.support.service_process import ServiceProcess

pytestmark = pytest.mark.integration

DRAFT = "https://json-schema.org/draft/2020-12/schema"
TIME = {"type": ["string", "integer"], "format": "date-time"}
ORDERS: dict[str, Any] = {
    "$schema": DRAFT,
    "title": "An order",
    "type": "object",
    "required": ["order_id", "customer_id", "status", "amount", "ordered_at"],
    "properties": {
        "order_id": {"type": "string", "minLength": 1},
        "customer_id": {"type": "integer", "minimum": 1},
        "status": {"type": "string", "enum": ["placed", "paid", "shipped"]},
        "amount": {"type": "number", "exclusiveMinimum": 0},
        "currency": {"type": ["string", "null"], "pattern": "^[A-Z]{3}$"},
        "coupon": {"type": ["string", "null"]},
        "ordered_at": {"$ref": "#/$defs/Instant", "description": "When the order was placed."},
        "lines": {"type": ["array", "null"], "items": {"$ref": "#/$defs/Line"}},
    },
    "$defs": {
        "Instant": TIME,
        "Line": {
            "type": "object",
            "required": ["sku"],
            "properties": {
                "sku": {"type": "string", "minLength": 1},
                "qty": {"type": "integer", "minimum": 1},
            },
        },
    },
    "dependentRequired": {"coupon": ["currency"]},
    # Fields the contract does not name yet: short texts, kept in _rescued.
    "additionalProperties": {"type": ["string", "null"], "maxLength": 16},
    "x-lakehouse": {
        "name": "orders",
        "topic": "orders",
        "key": "customer_id",
        "mode": "events",
        "id": "order_id",
        "event_time": "ordered_at",
        "partition_by": {"column": "order_date", "day_of": "ordered_at"},
        "version": 1,
    },
}
# What producers already send: priority (in _rescued until the contract names it), a
# status the contract does not know yet, and a gift flag on order lines. Its time and its
# lines are written out where version 1 named definitions: the same meaning, no change.
LINE_V2 = copy.deepcopy(ORDERS["$defs"]["Line"])
LINE_V2["properties"]["gift"] = {"type": ["boolean", "null"]}
ORDERS_V2: dict[str, Any] = {
    **{key: value for key, value in ORDERS.items() if key != "$defs"},
    "properties": {
        **ORDERS["properties"],
        "status": {"type": "string", "enum": ["placed", "paid", "shipped", "refunded"]},
        "priority": {"type": ["string", "null"], "enum": ["low", "high", None]},
        "ordered_at": {**TIME, "description": "When the order was placed."},
        "lines": {"type": ["array", "null"], "items": LINE_V2},
    },
    "x-lakehouse": {**ORDERS["x-lakehouse"], "version": 2},
}
DEVICES: dict[str, Any] = {
    "$schema": DRAFT,
    "title": "A device's registration",
    "type": "object",
    "required": ["device_id", "updated_at"],
    "properties": {
        "device_id": {"type": "string", "minLength": 1},
        "model": {"type": ["string", "null"], "maxLength": 40},
        "firmware": {"type": ["string", "null"], "pattern": "^[0-9]+[.][0-9]+$"},
        "location": {"$ref": "#/$defs/Location"},
        "labels": {"type": ["object", "null"], "description": "Free-form: kept as JSON text."},
        "ports": {
            "type": ["array", "null"],
            "uniqueItems": True,
            "items": {"type": "integer", "minimum": 1},
        },
        "calibration": {"type": ["object", "null"], "additionalProperties": {"type": "number"}},
        "updated_at": TIME,
    },
    "$defs": {
        "Location": {
            "type": ["object", "null"],
            "properties": {
                "site": {"type": ["string", "null"]},
                "rack": {"$ref": "#/$defs/Count"},
            },
            # Other members: short texts, kept in the map column location_others.
            "additionalProperties": {"type": "string", "maxLength": 8},
        },
        "Count": {"type": ["integer", "null"], "minimum": 0},
    },
    "x-lakehouse": {
        "name": "devices",
        "topic": "devices",
        "key": "device_id",
        "mode": "entities",
        "order_by": "updated_at",
        "flatten": {"location": "location_"},
        "framing": "auto",
        "version": 1,
    },
}

NOW = datetime.now(UTC).replace(microsecond=0)
VALID_ORDERS = 30
PRIORITIES = {f"o-{i}": "high" if i % 2 else "low" for i in range(1, 11)}


def at(minutes: int) -> str:
    return (
        (NOW - timedelta(hours=1) + timedelta(minutes=minutes)).isoformat().replace("+00:00", "Z")
    )


def order(i: int, **fields: Any) -> dict[str, Any]:
    base = {
        "order_id": f"o-{i}",
        "customer_id": 100 + i % 7,
        "status": ("placed", "paid", "shipped")[i % 3],
        "amount": round(9.5 + i, 2),
        "currency": "EUR",
        "ordered_at": at(i),
    }
    return {**base, **fields}


def _without(document: dict[str, Any], field: str) -> dict[str, Any]:
    return {k: v for k, v in document.items() if k != field}


# order id → (document or raw bytes, the code it is quarantined with under v1, or None)
def orders_corpus() -> list[tuple[str, bytes, str | None]]:
    corpus: list[tuple[str, bytes, str | None]] = []
    for i in range(1, VALID_ORDERS + 1):
        extra: dict[str, Any] = {"priority": PRIORITIES[f"o-{i}"]} if f"o-{i}" in PRIORITIES else {}
        if i == 11:
            extra = {"priority": "urgent"}  # not a priority v2 knows: stays in _rescued
        if i == 12:
            extra = {"coupon": "WELCOME"}  # with its currency: dependentRequired holds
        if i == 13:
            extra = {"lines": [{"sku": "A-1", "qty": 2}, {"sku": "B-7"}]}
        corpus.append((f"o-{i}", json.dumps(order(i, **extra)).encode(), None))
    for name, document, code in (
        ("refunded", order(40, status="refunded"), "invalid_value"),
        ("zero amount", order(41, amount=0), "out_of_range"),
        (
            "no customer",
            {k: v for k, v in order(42).items() if k != "customer_id"},
            "missing_field",
        ),
        # dependentRequired wants currency present (null would do, as in JSON Schema).
        (
            "coupon, no currency",
            {**_without(order(43), "currency"), "coupon": "X"},
            "missing_field",
        ),
        ("lower-case currency", order(44, currency="eur"), "invalid_value"),
        ("text customer", order(45, customer_id="7"), "type_mismatch"),
        ("line without sku", order(46, lines=[{"sku": "A-1"}, {"qty": 1}]), "missing_field"),
        ("unknown number", order(47, gift_note=5), "type_mismatch"),
    ):
        corpus.append((name, json.dumps(document).encode(), code))
    corpus.append(("truncated", json.dumps(order(46))[:25].encode(), "malformed_json"))
    return corpus


def devices_corpus() -> list[tuple[bytes | None, bytes | None, str | None]]:
    """(key, value, code): d-1 updated twice (the newer one sent first), d-2 deleted, d-3
    with a location, free-form labels, ports and a calibration map, framed by a schema
    registry serializer, d-4's firmware broken, d-5's rack, d-6's ports repeating one, d-7's
    location with another member of the wrong type, a tombstone without a key."""

    def device(device_id: str, minute: int, **fields: Any) -> bytes:
        body = {"device_id": device_id, "updated_at": at(minute), "model": "t-1000", **fields}
        return json.dumps(body).encode()

    return [
        (b"d-1", device("d-1", 20, firmware="2.0"), None),
        (b"d-1", device("d-1", 10, firmware="1.0"), None),
        (b"d-2", device("d-2", 10), None),
        (b"d-2", None, None),
        (
            b"d-3",
            # Framed as Confluent's serializer frames it: magic byte 0, schema id 7.
            b"\x00"
            + (7).to_bytes(4, "big")
            + device(
                "d-3",
                15,
                location={"site": "ams", "rack": 4, "row": "b", "room": "2.13"},
                labels={"tier": "gold", "ports": [1, 2]},
                ports=[8080, 443],
                calibration={"gain": 1.5, "offset": -2},
            ),
            None,
        ),
        (b"d-4", device("d-4", 15, firmware="latest"), "invalid_value"),
        (b"d-5", device("d-5", 15, location={"site": "fra", "rack": -1}), "out_of_range"),
        (b"d-6", device("d-6", 15, ports=[22, 80, 22]), "invalid_value"),
        (b"d-7", device("d-7", 15, location={"site": "ber", "row": 3}), "type_mismatch"),
        (b"", None, "type_mismatch"),
    ]


def produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes | None]]) -> None:
    """``records`` in order, each to partition 0, so that their offsets are their order."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for key, value in records:
        producer.produce(topic, key=key, value=value, partition=0)
    assert 0 == producer.flush(30)


def write_contract(directory: Path, document: dict[str, Any]) -> None:
    name = document["x-lakehouse"]["name"]
    (directory / f"{name}.json").write_text(json.dumps(document, indent=2))


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(1)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


def rows(spark: SparkSession, lake: Lake, table: str) -> list[Any]:
    return spark.read.format("delta").load(lake.table(table)).collect()


def scrape(driver: ServiceProcess) -> str:
    port = driver.events("running")[-1]["http_port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text: str = response.read().decode()
    return text


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` in the exposition ``text`` that have ``labels``."""
    values = []
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        if series.split("{")[0] == name:
            found = dict(re.findall(r'(\w+)="([^"]*)"', series))
            if labels.items() <= found.items():
                values.append(float(value))
    assert values, f"no sample of {name} with {labels}"
    return sum(values)


def test_topics_from_contract_files_ingest_evolve_and_promote_with_no_code(
    spark: SparkSession, lake: Lake, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    contracts_dir = tmp_path / "contracts"
    contracts_dir.mkdir()
    write_contract(contracts_dir, ORDERS)
    write_contract(contracts_dir, DEVICES)
    suffix = uuid.uuid4().hex[:8]
    orders_topic, devices_topic = f"orders-{suffix}", f"devices-{suffix}"
    kafka_broker.create_topics([orders_topic, devices_topic], partitions=3)
    env = {
        "INGEST_CONTRACTS_DIR": str(contracts_dir),
        "INGEST_CONTRACT_NAMES": "orders,devices",
        "INGEST_ORDERS_TOPIC": orders_topic,
        "INGEST_DEVICES_TOPIC": devices_topic,
    }
    orders = orders_corpus()
    devices = devices_corpus()
    quarantined_orders = {name: code for name, _, code in orders if code}

    # 1. The driver ingests both topics from their contracts, and nothing else.
    driver = lake.service("driver-1", "run", **env).start()
    try:
        driver.wait_for_log('"event": "running"', timeout=240)
        produce(lake.bootstrap_servers, orders_topic, [(b"c", v) for _, v, _ in orders])
        # o-5 again: a duplicate of an id seen within the horizon.
        produce(lake.bootstrap_servers, orders_topic, [(b"c", orders[4][1])])
        produce(lake.bootstrap_servers, devices_topic, [(k, v) for k, v, _ in devices])
        expected_quarantine = len(quarantined_orders) + sum(1 for *_, c in devices if c)

        def ingested() -> bool:
            # The tables, then the batches' progress (the metrics follow the commits).
            return (
                lake.rows("silver/quarantine") == expected_quarantine
                and lake.rows("silver/orders") == VALID_ORDERS
                and lake.rows("silver/orders_duplicates") == 1
                and lake.rows("silver/devices") == 3
                and [len(orders) + 1, len(devices)]
                == [
                    metric(scrape(driver), "lakehouse_ingest_input_rows_total", query=q)
                    for q in ("ingest_orders", "ingest_devices")
                ]
            )

        wait_until(ingested, 240, "orders and devices in silver, quarantine and duplicates")
        metrics = scrape(driver)
        assert {q["query"] for q in driver.events("query_started")} == {
            "ingest_orders",
            "ingest_devices",
        }
        driver.terminate()
        assert 0 == driver.wait(timeout=120), driver.log_text()[-3000:]
    finally:
        driver.cleanup()
    total_orders = len(orders) + 1
    # The checkpoint's offsets, committed to the consumer group: Kafka's own tools see no lag.
    for topic in (orders_topic, devices_topic):
        ends = end_offsets(lake.bootstrap_servers, topic)
        assert ends == group_offsets(lake.bootstrap_servers, lake.consumer_group, topic, ends), (
            topic
        )
    assert total_orders == metric(
        metrics, "lakehouse_ingest_input_rows_total", query="ingest_orders"
    )
    assert 1 == metric(metrics, "lakehouse_ingest_duplicates_dropped_total", query="ingest_orders")
    assert len(quarantined_orders) == metric(
        metrics, "lakehouse_ingest_quarantined_rows_total", query="ingest_orders"
    )
    assert len(devices) == metric(
        metrics, "lakehouse_ingest_input_rows_total", query="ingest_devices"
    )

    quarantine = rows(spark, lake, "silver/quarantine")
    by_topic = {
        topic: sorted(r.error_code for r in quarantine if r.kafka_topic == topic)
        for topic in (orders_topic, devices_topic)
    }
    assert sorted(quarantined_orders.values()) == by_topic[orders_topic]
    assert sorted(c for *_, c in devices if c) == by_topic[devices_topic]
    [d7] = [r for r in quarantine if r.key_text == "d-7"]
    assert d7.error_detail == "location.row: expected a JSON string, got integer"
    silver_orders = {r.order_id: r for r in rows(spark, lake, "silver/orders")}
    assert {f"o-{i}" for i in range(1, VALID_ORDERS + 1)} == set(silver_orders)
    assert json.loads(silver_orders["o-1"]._rescued) == {"priority": "high"}
    assert silver_orders["o-12"].coupon == "WELCOME"
    assert str(silver_orders["o-3"].order_date) == at(3)[:10]
    devices_now = {r.device_id: r for r in rows(spark, lake, "silver/devices")}
    assert devices_now["d-1"].firmware == "2.0"  # the newer update, though sent first
    assert devices_now["d-2"].is_deleted
    assert (devices_now["d-3"].location_site, devices_now["d-3"].location_rack) == ("ams", 4)
    assert devices_now["d-3"].location_others == {"row": "b", "room": "2.13"}
    assert devices_now["d-3"].labels == '{"ports":[1,2],"tier":"gold"}'
    assert devices_now["d-1"].labels is None
    assert (devices_now["d-3"].ports, devices_now["d-1"].ports) == ([8080, 443], None)
    assert devices_now["d-3"].calibration == {"gain": 1.5, "offset": -2.0}
    assert (devices_now["d-3"]._schema_id, devices_now["d-1"]._schema_id) == (7, None)

    # 2. The operator's verbs know the new topics from the contracts alone.
    status = lake.cli("status", "--json", **env)
    assert status.code == 0, status.err
    report = json.loads(status.out)
    assert {q["query"]: q["lag"] for q in report["queries"]} == {
        "ingest_orders": 0,
        "ingest_devices": 0,
    }
    tables = {t["table"]: t for t in report["tables"]}
    v1 = read_contract(contracts_dir / "orders.json")
    assert tables["silver/orders"]["contract"] == f"v1 {v1.fingerprint}"
    assert tables["silver/orders"]["rows"] == VALID_ORDERS
    assert tables["silver/orders"]["contract_file"] is None
    where = "order_id = 'o-2'"
    shown = lake.cli("show", "silver/orders", "--format", "json", "--where", where, **env)
    assert shown.code == 0, shown.err
    [o2] = [json.loads(line) for line in shown.out.splitlines()]
    assert (o2["order_id"], o2["amount"], o2["customer_id"]) == ("o-2", 11.5, 102)
    reconciled = lake.cli("reconcile", "--json", **env)
    assert reconciled.code == 0, reconciled.out[-3000:] + reconciled.err[-3000:]
    assert json.loads(reconciled.out)["records"] == {
        "bronze/orders": total_orders,
        "bronze/devices": len(devices),
    }

    # 3. An unsupported keyword, an invalid document and a breaking change: refused at
    # start, one line each, before anything is read or written.
    refused_dir = tmp_path / "refused"
    refused_dir.mkdir()
    for document, exit_code, needle in (
        (
            {
                **ORDERS,
                "properties": {
                    **ORDERS["properties"],
                    "coupon": {"type": "string", "oneOf": [{"minLength": 2}]},
                },
            },
            2,
            "/properties/coupon/oneOf",
        ),
        ({**ORDERS, "required": "order_id"}, 2, "orders.json"),
        (
            {**ORDERS, "properties": {**ORDERS["properties"], "amount": {"type": "string"}}},
            3,
            "amount",
        ),
    ):
        write_contract(refused_dir, document)
        write_contract(refused_dir, DEVICES)
        run = lake.cli("run", **{**env, "INGEST_CONTRACTS_DIR": str(refused_dir)})
        # The log is JSON lines on stdout: one, and nothing on stderr.
        lines = run.out.strip().splitlines()
        assert (run.code, len(lines), run.err) == (exit_code, 1, ""), run.out[-3000:]
        assert needle in lines[0], lines[0]
    assert "docs/runbooks/ContractChangeRefused.md" in lines[0]

    # 4. The evolved contract: promote, killed -9 right after its MERGE, then rerun.
    write_contract(contracts_dir, ORDERS_V2)
    promote = ("promote", "--topic", orders_topic, "priority", "--json")
    lake.killed_at("promote-killed", "after:silver/orders", env, promote)
    rerun = lake.cli("promote", "--topic", "orders", "priority", "--json", **env)
    assert rerun.code == 0, rerun.err[-3000:]
    second = json.loads(rerun.out)
    assert (second["rows_promoted"], second["rows_kept"]) == (0, 1)
    assert len(second["unfinished"]) == 1
    promoted = {r.order_id: r for r in rows(spark, lake, "silver/orders")}
    assert {o: r.priority for o, r in promoted.items() if r.priority} == PRIORITIES
    assert all(promoted[o]._rescued is None for o in PRIORITIES)
    assert json.loads(promoted["o-11"]._rescued) == {"priority": "urgent"}
    audit = rows(spark, lake, "silver/promotions")
    assert sorted(r.outcome for r in audit) == ["done", "started", "started"]

    # 5. What only the old enum refused moves to silver.
    replay = lake.cli("replay-quarantine", "--topic", orders_topic, "--json", **env)
    assert replay.code == 0, replay.err[-3000:]
    replayed = {r.order_id: r for r in rows(spark, lake, "silver/orders")}
    assert replayed["o-40"].status == "refunded"
    assert len(replayed) == VALID_ORDERS + 1

    # 6. A second driver finds the contract applied (no change logged twice) and fills the
    # new column from new records.
    driver = lake.service("driver-2", "run", **env).start()
    try:
        driver.wait_for_log('"event": "running"', timeout=240)
        produce(
            lake.bootstrap_servers,
            orders_topic,
            [
                (
                    b"c",
                    json.dumps(
                        order(
                            50,
                            priority="high",
                            status="refunded",
                            lines=[{"sku": "C-3", "gift": True}],
                        )
                    ).encode(),
                )
            ],
        )
        wait_until(lambda: lake.rows("silver/orders") == VALID_ORDERS + 2, 180, "o-50 in silver")
        driver.terminate()
        assert 0 == driver.wait(timeout=120), driver.log_text()[-3000:]
    finally:
        driver.cleanup()
    assert [] == driver.events("contract_evolved")
    # After the restart and its batch, the group holds the new end (o-50's offset + 1).
    ends = end_offsets(lake.bootstrap_servers, orders_topic)
    assert total_orders + 1 == sum(ends.values())
    assert ends == group_offsets(lake.bootstrap_servers, lake.consumer_group, orders_topic, ends)
    after = {r.order_id: r for r in rows(spark, lake, "silver/orders")}
    assert after["o-50"].priority == "high"
    # The objects of lines gained gift in place: the rows before have it null.
    assert [("C-3", None, True)] == [(x.sku, x.qty, x.gift) for x in after["o-50"].lines]
    assert [("A-1", 2, None), ("B-7", None, None)] == [
        (x.sku, x.qty, x.gift) for x in after["o-13"].lines
    ]
    reconciled = lake.cli("reconcile", "--json", **env)
    assert reconciled.code == 0, reconciled.out[-3000:] + reconciled.err[-3000:]
    v2 = read_contract(contracts_dir / "orders.json")
    status = json.loads(lake.cli("status", "--json", **env).out)
    assert {t["table"]: t["contract"] for t in status["tables"]}["silver/orders"] == (
        f"v2 {v2.fingerprint}"
    )
    # Another Delta reader (delta-rs) reads every table of the lake whole.
    contracts = Contracts({"orders": v2, "devices": read_contract(contracts_dir / "devices.json")})
    reader = LakeReader(
        Location(lake.storage_root).for_delta_rs(),
        {**lake.s3_env, "AWS_ALLOW_HTTP": "true"},
        catalogue_of(contracts).by_name(),
    )
    read = {}
    for table in reader.tables:
        delta = reader.open_if_exists(table)
        if delta is not None:
            arrow = delta.to_pyarrow_table()
            arrow.validate(full=True)
            read[table.name] = arrow.num_rows
    assert read["silver/orders"] == VALID_ORDERS + 2
    assert read["bronze/orders"] == total_orders + 1
    assert read["silver/devices"] == 3
