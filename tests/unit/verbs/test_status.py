"""The status verb's reading of a checkpoint, its lag arithmetic and its report."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

from deltalake import DeltaTable
from pyspark.sql import SparkSession

from service.config import Settings
from service.contracts.loading import parse_contract
from service.contracts.model import Contract
from service.driver_status import DriverView, QueryNow
from service.kafka.offsets import PartitionStatus
from service.lake.checkpoints import PLAN_FILE, CheckpointState, read_checkpoint
from service.lake.delta import append_once, ensure_table
from service.lake.evolution import Evolution, apply_evolution
from service.lake.lakeview import LakeReader
from service.lake.object_files import ObjectFiles
from service.lake.tables import SENSOR_DUPLICATES_TABLE, USERS, Table, contract_tables
from service.verbs.status import (
    LeaseStatus,
    QueryStatus,
    Status,
    TableStatus,
    _lease_status,
    _query_status,
    collect_status,
    table_status,
)
from tests.support.lake import LOCAL_FILES

CHECKPOINT = "s3a://lake/_checkpoints/ingest_sensors"


def run_file_stream(spark: SparkSession, source: Path, checkpoint: str) -> str:
    """Drain ``source`` once with an available-now query; return the query id."""
    query = (
        spark.readStream.schema("line STRING")
        .csv(str(source))
        .writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    return str(query.id)


def test_checkpoint_written_by_spark_reads_as_its_id_and_last_committed_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    source, checkpoint = tmp_path / "in", f"file:{tmp_path / 'checkpoint'}"
    source.mkdir()
    (source / "a.csv").write_text("one\n")
    run_file_stream(spark, source, checkpoint)
    (source / "b.csv").write_text("two\n")
    before = time.time()
    query_id = run_file_stream(spark, source, checkpoint)

    files = ObjectFiles(Settings(storage_root=str(tmp_path)))
    state = read_checkpoint(files, checkpoint)

    assert (query_id, 1, None, {}) == (
        state.query_id,
        state.last_committed_batch,
        state.planned_batch,
        state.kafka_offsets,  # a file source's offsets are not Kafka's
    )
    assert state.batch_timestamp_ms is not None
    assert before <= state.batch_timestamp_ms / 1000 <= time.time()
    committed_at = files.modified(f"{checkpoint}/commits/1")
    assert committed_at is not None
    assert before <= committed_at <= time.time()
    assert files.modified(f"{checkpoint}/commits/2") is None


def test_new_checkpoint_has_no_committed_batch(tmp_path: Path) -> None:
    uri = f"file:{tmp_path / 'none'}"
    files = ObjectFiles(Settings(storage_root=str(tmp_path)))
    assert CheckpointState(uri) == read_checkpoint(files, uri)
    assert files.read_text(f"{uri}/metadata") is None


def test_table_status_reads_version_commit_and_rows_from_the_delta_log(
    spark: SparkSession, tmp_path: Path
) -> None:
    settings = Settings(storage_root=str(tmp_path / "lake"))
    uri = SENSOR_DUPLICATES_TABLE.uri(settings.storage_uri)
    schema = SENSOR_DUPLICATES_TABLE.schema
    assert schema is not None
    ensure_table(LOCAL_FILES, uri, SENSOR_DUPLICATES_TABLE)
    rows = [(f"e{i}", "sensors", 0, i, None, None, None, None) for i in range(3)]
    append_once(spark.createDataFrame(rows, schema).coalesce(1), uri, "app", 0)
    reader = LakeReader.from_settings(settings)

    status = table_status(reader, SENSOR_DUPLICATES_TABLE)
    missing = table_status(reader, USERS)

    assert (True, 1, 3, "WRITE", None) == (
        status.exists,
        status.version,
        status.rows,
        status.last_operation,
        status.error,
    )
    assert status.last_commit_time is not None
    assert (False, None) == (missing.exists, missing.rows)

    # A live writer commits between the table's opening and the read of its history:
    # the status is the opened version's, with its rows.
    class Racing(LakeReader):
        def open_if_exists(self, table: Table) -> DeltaTable | None:
            delta = super().open_if_exists(table)
            append_once(spark.createDataFrame(rows, schema).coalesce(1), uri, "app", 1)
            return delta

    raced = table_status(
        Racing(reader.root, reader.options, reader.catalogue), SENSOR_DUPLICATES_TABLE
    )
    assert (1, 3, None) == (raced.version, raced.rows, raced.error)


def test_report_lists_queries_and_tables_as_text_and_json() -> None:
    status = Status(
        storage_root="s3a://lake",
        checkpoint_root="s3a://lake/_checkpoints",
        generated_at="2024-05-01T12:00:00+00:00",
        lease=LeaseStatus(held=False),
        queries=[
            QueryStatus(
                query="ingest_sensors",
                topic="sensors",
                checkpoint=CHECKPOINT,
                query_id="3f1c",
                last_committed_batch=41,
                last_batch_time="2024-05-01T11:59:50+00:00",
                committed_at="2024-05-01T11:59:52+00:00",
                planned_batch=None,
                lag=3,
                partitions=[PartitionStatus(0, 9, 12, 3)],
                errors=[],
            )
        ],
        tables=[
            TableStatus("bronze/sensors", "s3a://lake/bronze/sensors", True, 42, "t", "WRITE", 9),
            TableStatus("silver/sensor_readings", "s3a://lake/silver/sensor_readings", False),
        ],
    )

    text = status.to_text()

    assert status.ok
    assert "no driver holds the lease" in text
    [query_row] = [line for line in text.splitlines() if line.startswith("ingest_sensors")]
    assert [
        "ingest_sensors",
        "sensors",
        "41",
        "2024-05-01T11:59:50+00:00",
        "9",
        "12",
        "3",
        "-",
    ] == query_row.split()
    [table_row] = [line for line in text.splitlines() if line.startswith("bronze/sensors")]
    assert ["bronze/sensors", "42", "9", "t", "WRITE"] == table_row.split()
    assert "(no table)" in text
    assert 3 == json.loads(status.to_json())["queries"][0]["lag"]


def test_report_adds_what_the_running_driver_is_doing_now() -> None:
    status = Status(
        storage_root="s3a://lake",
        checkpoint_root="s3a://lake/_checkpoints",
        generated_at="2024-05-01T12:00:00+00:00",
        lease=LeaseStatus(held=True, host="h", pid=4242, heartbeat_age_seconds=1.0),
        queries=[
            QueryStatus(
                "ingest_sensors", "sensors", CHECKPOINT, "3f1c", 41, None, None, None, 3, [], []
            )
        ],
        tables=[],
        driver=DriverView(
            pid=4242,
            ready=False,
            ready_reason="no progress for over 120s: ingest_sensors (130s)",
            alive=True,
            alive_reason="ok",
            lease_heartbeat_age_seconds=1.0,
            queries=[QueryNow("ingest_sensors", True, 42, 130.4, 41, 130.0, 5000)],
        ),
    )

    text = status.to_text()

    assert "now         pid 4242 answering: NOT READY (no progress for over 120s" in text
    [query_row] = [line for line in text.splitlines() if line.startswith("ingest_sensors")]
    assert query_row.endswith("writing batch 42 for 130s")
    assert 42 == json.loads(status.to_json())["driver"]["queries"][0]["batch_in_flight"]


def test_a_gold_query_reports_the_plan_version_its_checkpoint_runs(tmp_path: Path) -> None:
    uri = f"file:{tmp_path / 'gold_heart_rate_activity'}"
    (tmp_path / "gold_heart_rate_activity").mkdir()
    (tmp_path / "gold_heart_rate_activity" / "metadata").write_text('{"id":"q-1"}')
    files = ObjectFiles(Settings(storage_root=str(tmp_path)))

    def report(plans: int) -> tuple[QueryStatus, Status]:
        query = _query_status(files, files.modified, uri, "gold_x", None, {}, True, plans=plans)
        return query, Status("r", "c", "t", LeaseStatus(held=False), [query], [])

    query, status = report(2)  # started before the plan file existed: plan 1
    assert (1, 2, []) == (query.plan_version, query.latest_plan, query.errors)
    assert "  gold_x: runs plan 1 of 2, its state's layout" in status.to_text()
    assert 1 == json.loads(status.to_json())["queries"][0]["plan_version"]

    (tmp_path / "gold_heart_rate_activity" / PLAN_FILE).write_text("2\n")
    query, status = report(2)
    assert (2, []) == (query.plan_version, query.errors)
    assert "runs plan" not in status.to_text()

    query, status = report(1)  # an older release than the one that started it
    assert query.plan_version is None
    [error] = query.errors
    assert error.startswith("plan version: checkpoint") and "knows versions 1 to 1" in error
    assert f"gold_x: {error}" in status.to_text()
    assert not status.ok

    fresh = f"file:{tmp_path / 'not_started'}"  # Spark has not created it: no version yet
    query = _query_status(files, files.modified, fresh, "gold_y", None, {}, True, plans=2)
    assert (None, []) == (query.plan_version, query.errors)


def devices(version: int | None, max_battery: int = 100) -> Contract:
    """A small entities contract (``version`` in its extension block unless None)."""
    extension: dict[str, object] = {
        "name": "devices",
        "topic": "devices",
        "mode": "entities",
        "key": "device_id",
        "order_by": "updated_at",
    }
    if version is not None:
        extension["version"] = version
    document = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "required": ["device_id", "updated_at"],
        "properties": {
            "device_id": {"type": "string", "minLength": 1},
            "updated_at": {"type": "string", "format": "date-time"},
            "battery": {"type": ["integer", "null"], "minimum": 0, "maximum": max_battery},
        },
        "x-lakehouse": extension,
    }
    return parse_contract(document, "/contracts/devices.json", "devices", {})


def test_a_silver_table_shows_its_recorded_contract_and_the_deployed_one_when_it_differs(
    spark: SparkSession, tmp_path: Path
) -> None:
    settings = Settings(storage_root=str(tmp_path / "lake"))
    recorded = devices(2)
    table = contract_tables(recorded).silver
    uri = table.uri(settings.storage_uri)
    ensure_table(LOCAL_FILES, uri, table)
    reader = LakeReader.from_settings(settings)

    unrecorded = table_status(reader, table, recorded)
    apply_evolution(spark, settings.storage_uri, [Evolution(recorded, table, True, [], True)],
                    lambda: None)  # fmt: skip
    same = table_status(reader, table, recorded)
    newer = table_status(reader, table, devices(3, max_battery=120))
    unversioned = table_status(reader, table, devices(None))
    no_contract = table_status(reader, table)

    assert (None, f"v2 {recorded.fingerprint}") == (unrecorded.contract, unrecorded.contract_file)
    expected = f"v2 {recorded.fingerprint}"
    assert (expected, None, 1, "SET TBLPROPERTIES") == (
        same.contract,
        same.contract_file,
        same.version,
        same.last_operation,
    )
    assert (expected, f"v3 {devices(3, max_battery=120).fingerprint}") == (
        newer.contract,
        newer.contract_file,
    )
    assert (expected, devices(None).fingerprint) == (
        unversioned.contract,
        unversioned.contract_file,
    )
    assert (expected, None) == (no_contract.contract, no_contract.contract_file)
    assert 16 == len(recorded.fingerprint)
    assert recorded.fingerprint != devices(3, max_battery=120).fingerprint


def test_the_report_shows_each_tables_contract_and_what_the_next_start_applies() -> None:
    tables = [
        TableStatus("bronze/devices", "file:/l/bronze/devices", True, 4, "t", "WRITE", 9),
        TableStatus("silver/devices", "file:/l/silver/devices", True, 7, "t", "MERGE", 3,
                    contract="v2 3f2a9c1b0d4e5f60", contract_file="v3 0123456789abcdef"),
        TableStatus("silver/readings", "file:/l/silver/readings", True, 2, "t", "WRITE", 5,
                    contract="v1 aaaaaaaaaaaaaaaa"),
        TableStatus("silver/orders", "file:/l/silver/orders", True, 0, "t", "CREATE TABLE", 0,
                    contract_file="bbbbbbbbbbbbbbbb"),
    ]  # fmt: skip
    status = Status("file:/l", "file:/l/_checkpoints", "t", LeaseStatus(held=False), [], tables)

    lines = status.to_text().splitlines()

    [header] = [line for line in lines if line.startswith("TABLE")]
    assert ["TABLE", "VERSION", "ROWS", "LAST", "COMMIT", "(UTC)", "OPERATION", "CONTRACT"] == (
        header.split()
    )
    column = header.index("CONTRACT")
    rows = {line.split()[0]: line for line in lines if line.startswith(("bronze/", "silver/"))}
    assert "v2 3f2a9c1b0d4e5f60" == rows["silver/devices"][column:]
    assert "v1 aaaaaaaaaaaaaaaa" == rows["silver/readings"][column:]
    assert "" == rows["bronze/devices"][column:]
    assert "" == rows["silver/orders"][column:]
    assert [
        "  silver/devices: the contract file is v3 0123456789abcdef, not the recorded"
        " v2 3f2a9c1b0d4e5f60; the driver applies it at its next start",
        "  silver/orders: the contract file is bbbbbbbbbbbbbbbb, none is recorded yet; the"
        " driver applies it at its next start",
    ] == [line for line in lines if "next start" in line]
    as_json = {t["table"]: t for t in json.loads(status.to_json())["tables"]}
    assert ("v2 3f2a9c1b0d4e5f60", "v3 0123456789abcdef") == (
        as_json["silver/devices"]["contract"],
        as_json["silver/devices"]["contract_file"],
    )


def test_status_answers_within_5_seconds_when_no_broker_answers(tmp_path: Path) -> None:
    with socket.socket() as closed:  # a loopback port nothing listens on
        closed.bind(("127.0.0.1", 0))
        nobody = f"127.0.0.1:{closed.getsockname()[1]}"
    settings = Settings(
        storage_root=str(tmp_path / "lake"), kafka_bootstrap_servers=nobody, http_port=1
    )

    started = time.monotonic()
    status = collect_status(settings)
    elapsed = time.monotonic() - started

    assert elapsed < 5.0, f"status took {elapsed:.1f} s"
    errors = [e for q in status.queries for e in q.errors]
    assert errors and all("Kafka unreachable" in e for e in errors), errors


class _RewrittenLease:
    """A lease read once while the driver rewrote it (the new record cut at the old
    one's length), then whole."""

    def __init__(self, record: str) -> None:
        self.reads = [record[: len(record) - 7], record]

    def read_text(self, uri: str) -> str | None:
        return self.reads.pop(0)

    def list_names(self, uri: str) -> list[str]:
        return []


def test_a_lease_read_while_the_driver_rewrites_it_is_read_again() -> None:
    record = json.dumps({"host": "worker-3", "pid": 41, "heartbeat_at": time.time() - 2})
    lease = _lease_status(_RewrittenLease(record), "s3a://lakehouse/_checkpoints/lease.json")
    assert (True, "worker-3", 41, None) == (lease.held, lease.host, lease.pid, lease.error)
    assert lease.heartbeat_age_seconds is not None and 1 <= lease.heartbeat_age_seconds < 30
