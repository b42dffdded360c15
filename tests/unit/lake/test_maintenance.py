"""Table maintenance: due rule, table ownership, the writer's hook, and OPTIMIZE/VACUUM on Delta."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from delta.tables import DeltaTable
from prometheus_client import CollectorRegistry
from pyspark.sql import SparkSession

from service.config import Settings
from service.driver.metrics import MaintenanceMetrics
from service.gold.queries import gold_queries
from service.ingest.query import ingest_queries
from service.lake.delta import append_once, ensure_table
from service.lake.maintenance import (
    MAINTAINED_FILE,
    MaintenanceOutcome,
    MaintenancePolicy,
    MaintenanceRecord,
    MaintenanceSchedule,
    TableMaintenance,
    compaction_due,
    error_summary,
    maintenance_for,
    owned_tables,
    recorded_runs,
    table_owners,
)
from service.lake.object_files import ObjectFiles
from service.lake.tables import (
    OFFSET_GAPS_TABLE,
    OPERATOR_TABLES,
    QUARANTINE_TABLE,
    SENSOR_DUPLICATES_TABLE,
    SHIPPED,
    USERS,
    QuerySpec,
    Table,
)
from service.streaming.runner import QueryWriter
from service.streaming.session import spark_conf
from tests.support.lake import LOCAL_FILES

HOUR = 3600.0
POLICY = MaintenancePolicy(interval_seconds=HOUR, min_files=3, retention_hours=168)
NOW = 1_800_000_000.0


class Clock:
    """A settable clock."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def all_queries() -> list[QuerySpec]:
    return [*ingest_queries(Settings()), *gold_queries()]


# -- due rule --------------------------------------------------------------------------------


def test_a_table_is_first_due_one_interval_after_start() -> None:
    schedule = MaintenanceSchedule(["bronze/users"], HOUR, now=100.0)

    assert [] == schedule.due(100.0)
    assert [] == schedule.due(100.0 + HOUR - 1)
    assert ["bronze/users"] == schedule.due(100.0 + HOUR)


def test_a_table_is_due_again_one_interval_after_its_last_run() -> None:
    schedule = MaintenanceSchedule(["bronze/users", "silver/users"], HOUR, now=0.0)

    schedule.ran("bronze/users", HOUR + 30)

    assert ["silver/users"] == schedule.due(HOUR + 30)
    assert ["silver/users"] == schedule.due(2 * HOUR + 29)
    assert ["bronze/users", "silver/users"] == schedule.due(2 * HOUR + 30)


def test_an_interval_of_zero_never_makes_a_table_due() -> None:
    schedule = MaintenanceSchedule(["bronze/users"], 0.0, now=0.0)

    assert [] == schedule.due(10 * HOUR)
    assert not MaintenancePolicy(0.0, 32, 168).enabled


def test_compaction_is_due_from_the_minimum_number_of_files() -> None:
    assert (False, True, True) == tuple(compaction_due(files, 32) for files in (31, 32, 500))


# -- ownership -------------------------------------------------------------------------------


def test_every_table_is_maintained_by_exactly_one_query() -> None:
    queries = all_queries()

    owned = [t.name for q in queries for t in owned_tables(q.name, q.tables, queries)]

    assert sorted(t.name for t in SHIPPED.tables if t not in OPERATOR_TABLES) == sorted(owned)


def test_quarantine_written_by_both_ingest_queries_is_maintained_by_the_first() -> None:
    users, sensors = ingest_queries(Settings())
    assert QUARANTINE_TABLE in users.tables and QUARANTINE_TABLE in sensors.tables

    assert "ingest_users" == table_owners([users, sensors])[QUARANTINE_TABLE.name]
    assert QUARANTINE_TABLE in owned_tables(users.name, users.tables, [users, sensors])
    assert QUARANTINE_TABLE not in owned_tables(sensors.name, sensors.tables, [users, sensors])


def test_a_table_no_peer_writes_belongs_to_the_query() -> None:
    assert (USERS,) == owned_tables("any_query", (USERS,), peers=())


def test_ingest_and_gold_writers_maintain_the_tables_they_own() -> None:
    settings = Settings()
    users, sensors = ingest_queries(settings)
    gold = gold_queries()[0]
    peers: list[QuerySpec] = [users, sensors, gold]
    metrics = MaintenanceMetrics()

    def maintained(query: QuerySpec) -> tuple[str, ...]:
        maintenance = maintenance_for(query, settings, peers, metrics)
        assert maintenance is not None
        return maintenance.tables

    assert tuple(t.name for t in users.tables) == maintained(users)
    # The tables both ingest queries write belong to the first.
    shared = (QUARANTINE_TABLE, OFFSET_GAPS_TABLE)
    assert tuple(t.name for t in sensors.tables if t not in shared) == maintained(sensors)
    assert (gold.table.name,) == maintained(gold)


def test_a_zero_interval_maintains_nothing() -> None:
    users = ingest_queries(Settings())[0]
    off = Settings(maintenance_interval_seconds=0)

    assert maintenance_for(users, off, [users], MaintenanceMetrics()) is None


def test_recorded_runs_are_read_back_never_after_now_and_unreadable_ones_count_from_now() -> None:
    tables = ["bronze/users", "silver/users"]
    text = json.dumps({"bronze/users": 100.0, "silver/users": NOW + HOUR, "gone": 5})
    assert {"bronze/users": 100.0, "silver/users": NOW} == recorded_runs(text, tables, NOW)
    for unreadable in (None, "", "{", "[1]", '{"bronze/users": "soon"}'):
        assert NOW == recorded_runs(unreadable, tables, NOW)["bronze/users"]


def test_the_schedule_carries_over_a_restart_through_the_checkpoint(tmp_path: Path) -> None:
    record = MaintenanceRecord(ObjectFiles(Settings()), f"file:{tmp_path}/{MAINTAINED_FILE}")
    clock = Clock(NOW)

    def restarted() -> RecordingMaintenance:
        return RecordingMaintenance(clock, record)

    first = restarted()
    first.run_due(None)  # type: ignore[arg-type]  # none due: the checkpoint's first start
    assert {USERS.name: NOW} == json.loads((tmp_path / MAINTAINED_FILE).read_text())
    # Restarts every 40 minutes: counted from each start, the table would never be due.
    clock.now = NOW + 40 * 60
    restarted().run_due(None)  # type: ignore[arg-type]
    clock.now = NOW + 80 * 60
    second = restarted()
    second.run_due(None)  # type: ignore[arg-type]
    assert [USERS.name] == second.maintained
    assert {USERS.name: clock.now} == json.loads((tmp_path / MAINTAINED_FILE).read_text())
    clock.now += 30 * 60
    third = restarted()
    third.run_due(None)  # type: ignore[arg-type]
    assert [] == third.maintained


# -- the writer's hook -----------------------------------------------------------------------


class RecordingMaintenance(TableMaintenance):
    """Maintenance that records which tables it was asked to maintain."""

    def __init__(self, clock: Clock, record: MaintenanceRecord | None = None) -> None:
        super().__init__("file:/lake", [USERS], POLICY, MaintenanceMetrics(), clock, record)
        self.maintained: list[str] = []

    def maintain(self, spark: SparkSession, table: str) -> MaintenanceOutcome | None:
        self.maintained.append(table)
        return None


def test_writer_maintains_due_tables_then_ends_the_batch_after_a_batch_that_succeeded_only(
    spark: SparkSession, tmp_path: Path
) -> None:
    clock = Clock()
    record = MaintenanceRecord(ObjectFiles(Settings()), f"file:{tmp_path}/{MAINTAINED_FILE}")
    maintenance = RecordingMaintenance(clock, record)
    # Then its Delta checkpoints are due (`LogCheckpoints`): what was maintained by then.
    ended: list[list[str]] = []
    writer = QueryWriter(
        "ingest_users", lambda: None, maintenance, lambda: ended.append(maintenance.maintained[:])
    )

    with writer.writing(0):
        pass  # not due yet, but the schedule's start is recorded
    assert {USERS.name: 0.0} == json.loads((tmp_path / MAINTAINED_FILE).read_text())
    clock.now = HOUR
    with pytest.raises(RuntimeError), writer.writing(1):
        raise RuntimeError("the batch failed")
    assert [] == maintenance.maintained

    with writer.writing(1):
        assert [] == maintenance.maintained  # not while the batch writes
    assert [USERS.name] == maintenance.maintained
    with writer.writing(2):
        pass  # maintained one interval ago at the latest: not due
    assert [USERS.name] == maintenance.maintained
    assert 2 == writer.last_batch_id
    assert [[], [USERS.name], [USERS.name]] == ended  # batches 0, 1 and 2, not the failed one


# -- OPTIMIZE and VACUUM on a real Delta table -------------------------------------------------


@pytest.fixture
def without_auto_compaction(spark: SparkSession) -> Iterator[None]:
    """The session's opt-in auto-compaction off, so only maintenance compacts."""
    key = "spark.databricks.delta.autoCompact.enabled"
    previous = spark.conf.get(key, None)
    spark.conf.set(key, "false")
    yield
    if previous is None:
        spark.conf.unset(key)
    else:
        spark.conf.set(key, previous)


def snapshot_files(spark: SparkSession, uri: str) -> int:
    return len(spark.read.format("delta").load(uri).inputFiles())


def sample(registry: CollectorRegistry, name: str, table: Table) -> float | None:
    return registry.get_sample_value(f"lakehouse_ingest_{name}", {"table": table.name})


def compaction_data_change(table_dir: Path, version: int) -> set[bool]:
    """The ``dataChange`` flags of the add and remove actions of commit ``version``."""
    commit = table_dir / "_delta_log" / f"{version:020d}.json"
    actions = [json.loads(line) for line in commit.read_text().splitlines() if line]
    return {a[kind]["dataChange"] for a in actions for kind in ("add", "remove") if kind in a}


def test_maintenance_compacts_small_files_keeps_every_row_and_reports_the_file_count(
    spark: SparkSession, tmp_path: Path, without_auto_compaction: None
) -> None:
    commits = POLICY.min_files  # just enough to be compacted
    storage = f"file:{tmp_path}"
    table = SENSOR_DUPLICATES_TABLE
    uri = table.uri(storage)
    ensure_table(LOCAL_FILES, uri, table)
    for batch in range(commits):
        rows = [
            (f"e{batch}-{i}", "sensors", i, batch * 10 + i, None, None, None, None)
            for i in range(3)
        ]
        append_once(spark.createDataFrame(rows, table.schema).coalesce(1), uri, "app", batch)
    rows_before = sorted(spark.read.format("delta").load(uri).collect())
    assert commits == snapshot_files(spark, uri)
    registry = CollectorRegistry()
    metrics = MaintenanceMetrics(clock=lambda: NOW)
    registry.register(metrics)
    clock = Clock()
    maintenance = TableMaintenance(storage, [table], POLICY, metrics, clock)

    assert [] == maintenance.run_due(spark)  # not due before one interval
    clock.now = HOUR
    with structlog.testing.capture_logs() as logs:
        outcomes = maintenance.run_due(spark)

    assert [(table.name, commits, 1, True, 0)] == [
        (o.table, o.files_before, o.files_after, o.compacted, o.vacuumed_files) for o in outcomes
    ]
    assert rows_before == sorted(spark.read.format("delta").load(uri).collect())
    assert 1 == snapshot_files(spark, uri)
    assert 1.0 == sample(registry, "table_files", table)
    assert NOW == sample(registry, "maintenance_last_success_timestamp_seconds", table)
    assert 1.0 == sample(registry, "maintenance_duration_seconds_count", table)
    history = {
        r["operation"]: r["version"] for r in DeltaTable.forPath(spark, uri).history().collect()
    }
    assert {"OPTIMIZE", "VACUUM START", "VACUUM END"} <= set(history)
    assert {False} == compaction_data_change(tmp_path / table.name, history["OPTIMIZE"])
    done = [line for line in logs if line["event"] == "maintenance_done"]
    assert [(table.name, commits, 1, 0)] == [
        (d["table"], d["files_before"], d["files_after"], d["vacuumed_files"]) for d in done
    ]
    assert [] == maintenance.due()


def test_a_table_below_the_minimum_files_is_vacuumed_but_not_compacted(
    spark: SparkSession, tmp_path: Path
) -> None:
    storage = f"file:{tmp_path}"
    ensure_table(LOCAL_FILES, USERS.uri(storage), USERS)
    registry = CollectorRegistry()
    metrics = MaintenanceMetrics()
    registry.register(metrics)
    maintenance = TableMaintenance(storage, [USERS], POLICY, metrics, Clock())

    outcome = maintenance.maintain(spark, USERS.name)

    assert outcome is not None
    assert (0, 0, False) == (outcome.files_before, outcome.files_after, outcome.compacted)
    assert 0.0 == sample(registry, "table_files", USERS)


def test_a_failed_maintenance_is_counted_logged_and_retried_one_interval_later(
    spark: SparkSession, tmp_path: Path
) -> None:
    storage = f"file:{tmp_path}"
    (tmp_path / USERS.name).mkdir(parents=True)  # a directory, but no Delta table
    registry = CollectorRegistry()
    metrics = MaintenanceMetrics()
    registry.register(metrics)
    clock = Clock()
    maintenance = TableMaintenance(storage, [USERS], POLICY, metrics, clock)
    clock.now = HOUR

    with structlog.testing.capture_logs() as logs:
        outcomes = maintenance.run_due(spark)

    assert [] == outcomes
    assert 1.0 == sample(registry, "maintenance_failures_total", USERS)
    assert sample(registry, "maintenance_last_success_timestamp_seconds", USERS) is None
    failed = [line for line in logs if line["event"] == "maintenance_failed"]
    assert [USERS.name] == [line["table"] for line in failed]
    assert "not a Delta table" in failed[0]["error"]
    assert [] == maintenance.due()
    clock.now = 2 * HOUR
    assert [USERS.name] == maintenance.due()


def test_error_summary_is_the_first_line_of_the_jvm_message() -> None:
    py4j_style = RuntimeError(
        "An error occurred while calling o42.vacuum.\n"
        ": java.lang.IllegalArgumentException: requirement failed: low retention\n"
        "\tat scala.Predef$.require(Predef.scala:337)"
    )

    assert "java.lang.IllegalArgumentException: requirement failed: low retention" == error_summary(
        py4j_style
    )
    assert "ValueError" == error_summary(ValueError(""))


def test_vacuum_lists_a_table_in_as_many_tasks_as_a_shuffle_has_partitions() -> None:
    conf = spark_conf(Settings(spark_shuffle_partitions=3))

    assert "3" == conf["spark.sql.sources.parallelPartitionDiscovery.parallelism"]
