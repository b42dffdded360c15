"""Delta sink: idempotent appends by (txn app id, version), compaction by the writer, live files."""

from __future__ import annotations

import functools
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from service.lake.delta import append_once, ensure_table, table_transactions
from service.lake.live_files import LiveFiles
from service.lake.tables import (
    BRONZE_SENSORS,
    CHECKPOINT_INTERVAL,
    HEART_RATE_ACTIVITY,
    IN_COMMIT_CHECKPOINTS_OFF,
    SENSOR_DUPLICATES_TABLE,
    SENSOR_READINGS,
    STATS_COLUMNS,
)
from service.streaming.profile import BatchProfile
from tests.support.lake import LOCAL_FILES
from tests.support.records import bronze_frame, readings
from tests.support.spark import jobs_of

T0 = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def active_files(spark: SparkSession, uri: str) -> int:
    return len(spark.read.format("delta").load(uri).inputFiles())


def test_a_replayed_batch_is_skipped_and_small_files_are_compacted_after_the_write(
    spark: SparkSession, tmp_path: Path
) -> None:
    min_files = int(spark.conf.get("spark.databricks.delta.autoCompact.minNumFiles") or 0)
    uri = f"file:{tmp_path / 'duplicates'}"
    ensure_table(LOCAL_FILES, uri, SENSOR_DUPLICATES_TABLE)
    schema = SENSOR_DUPLICATES_TABLE.schema
    assert schema is not None
    replays: list[int] = []
    for batch in range(min_files):
        rows = [
            (f"e{batch}-{i}", "sensors", i, batch * 10 + i, None, None, None, None)
            for i in range(2)
        ]
        df = spark.createDataFrame(rows, schema).repartition(2)
        append_once(df, uri, "app", batch, on_replay=lambda: replays.append(-1))
        # A replay of the same batch: skipped, and what replays run instead runs.
        append_once(df, uri, "app", batch, on_replay=functools.partial(replays.append, batch))

    table = spark.read.format("delta").load(uri)
    operations = [r["operation"] for r in DeltaTable.forPath(spark, uri).history().collect()]

    assert 2 * min_files == table.count()
    assert list(range(min_files)) == replays
    assert {"app": min_files - 1} == table_transactions(spark, uri)
    assert "OPTIMIZE" in operations
    assert active_files(spark, uri) < min_files


def _rows(spark: SparkSession, batch: int) -> DataFrame:
    schema = SENSOR_DUPLICATES_TABLE.schema
    assert schema is not None
    rows = [
        (f"e{batch}-{i}", "sensors", i, batch * 10 + i, None, None, None, None) for i in range(3)
    ]
    return spark.createDataFrame(rows, schema).coalesce(1)


def _table_with_batch_0(spark: SparkSession, table: Path) -> str:
    """The URI of a new duplicates table at ``table`` holding batch 0 of app ``app``."""
    uri = f"file:{table}"
    ensure_table(LOCAL_FILES, uri, SENSOR_DUPLICATES_TABLE)
    append_once(_rows(spark, 0), uri, "app", 0)
    return uri


def test_an_append_reads_the_txn_from_the_checksum_and_records_it_as_delta_does(
    spark: SparkSession, tmp_path: Path
) -> None:
    uri = _table_with_batch_0(spark, tmp_path / "duplicates")

    profile = BatchProfile(spark.sparkContext)

    def append(phase: str) -> object:
        return append_once(_rows(spark, 1), uri, "app", 1, committing=profile.phase(phase))

    # One job writes the files; none reconstructs the table state to find the txn.
    assert 1 == jobs_of(spark, "append-1", lambda: append("commit"))
    assert 0 == jobs_of(spark, "replay-1", lambda: append("replay"))
    assert ["commit"] == list(profile.phases_ms)  # the replay committed nothing
    last = DeltaTable.forPath(spark, uri).history(1).collect()[0]

    assert 6 == spark.read.format("delta").load(uri).count()
    assert {"app": 1} == table_transactions(spark, uri)
    assert ("WRITE", True) == (last["operation"], last["isBlindAppend"])
    assert "Append" == last["operationParameters"]["mode"]


def test_without_a_checksum_listing_the_txn_delta_reads_it_and_a_replay_is_still_skipped(
    spark: SparkSession, tmp_path: Path
) -> None:
    table = tmp_path / "duplicates"
    uri = _table_with_batch_0(spark, table)
    for checksum in (table / "_delta_log").glob("*.crc"):
        checksum.unlink()
    jvm: Any = spark.sparkContext._jvm
    jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()

    replays: list[int] = []
    append_once(_rows(spark, 0), uri, "app", 0)  # a replay: skipped by Delta's writer
    # Told apart from a write when the caller has something to run instead.
    append_once(_rows(spark, 0), uri, "app", 0, on_replay=lambda: replays.append(0))
    append_once(_rows(spark, 1), uri, "app", 1, on_replay=lambda: replays.append(1))

    assert [0] == replays
    assert 6 == spark.read.format("delta").load(uri).count()
    assert {"app": 1} == table_transactions(spark, uri)


def test_rows_whose_columns_differ_from_the_table_are_refused_by_delta(
    spark: SparkSession, tmp_path: Path
) -> None:
    uri = _table_with_batch_0(spark, tmp_path / "duplicates")
    renamed = _rows(spark, 1).withColumnRenamed("event_id", "id")

    with pytest.raises(AnalysisException):
        append_once(renamed, uri, "app", 1)

    assert 3 == spark.read.format("delta").load(uri).count()
    assert {"app": 0} == table_transactions(spark, uri)


def _file_statistics(table: Path) -> list[dict[str, Any]]:
    """The ``stats`` of every file the table's log adds."""
    adds = []
    for commit in sorted((table / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in commit.read_text().splitlines()]
        adds += [json.loads(a["add"]["stats"]) for a in actions if "add" in a]
    return adds


def test_files_carry_statistics_on_the_declared_columns_only(
    spark: SparkSession, tmp_path: Path
) -> None:
    for table in (BRONZE_SENSORS, SENSOR_READINGS):
        path = tmp_path / table.name
        ensure_table(LOCAL_FILES, f"file:{path}", table)
        if table is SENSOR_READINGS:
            rows = readings(spark, [("e1", 0, 5, T0), ("e2", 1, 9, T0 + timedelta(seconds=1))])
        else:
            rows = bronze_frame(spark, [("d1", '{"a": 1}'), ("d2", "x")], "sensors")
        append_once(rows.coalesce(1), f"file:{path}", "app", 0)
        declared = table.properties[STATS_COLUMNS].split(",")

        (stats,) = _file_statistics(path)
        assert 2 == stats["numRecords"]
        assert declared == list(stats["nullCount"]), table.name
        # Bounds where a column has values (all null: none).
        assert {"kafka_offset", "kafka_timestamp"} <= set(stats["minValues"]) <= set(declared)
        assert set(stats["minValues"]) == set(stats["maxValues"])
        # Never the payload: neither its bytes nor its text.
        assert not {"key", "value", "key_text", "value_text"} & set(declared)


def test_a_catalogued_table_commits_without_writing_a_delta_checkpoint(
    spark: SparkSession, tmp_path: Path
) -> None:
    # Delta's default interval is 10: the creation (delta-rs) records the catalogue's,
    # which Delta applies, and the driver writes the checkpoints after the batches
    # (tests/unit/lake/test_log_checkpoints.py).
    assert IN_COMMIT_CHECKPOINTS_OFF == SENSOR_READINGS.properties[CHECKPOINT_INTERVAL]
    path = tmp_path / SENSOR_READINGS.name
    ensure_table(LOCAL_FILES, f"file:{path}", SENSOR_READINGS)  # version 0
    for version in range(1, 11):
        append_once(
            readings(spark, [(f"e{version}", 0, version, T0)]), f"file:{path}", "a", version
        )
    assert (path / "_delta_log" / f"{10:020d}.json").exists()
    assert [] == list((path / "_delta_log").glob("*.checkpoint.parquet"))


def test_the_append_that_creates_a_gold_table_sets_its_properties(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = tmp_path / HEART_RATE_ACTIVITY.name
    uri = f"file:{path}"
    pair = (7, "hr1", T0, 120.0, "acc1", T0 + timedelta(seconds=5), "walk", 1.5)
    columns = "user_id hr_event_id hr_event_time bpm acc_event_id acc_event_time activity magnitude"
    rows = spark.createDataFrame([pair], columns.split()).coalesce(1)
    properties = HEART_RATE_ACTIVITY.properties

    append_once(rows, uri, "app", 0, properties)  # creates the table
    append_once(rows, uri, "app", 1, properties)  # an existing table: Delta ignores them

    detail = DeltaTable.forPath(spark, uri).detail().first()
    assert detail is not None
    assert properties[STATS_COLUMNS] == detail["properties"][STATS_COLUMNS]
    declared = properties[STATS_COLUMNS].split(",")
    assert ["user_id", "hr_event_time", "acc_event_time"] == declared
    assert [declared, declared] == [list(s["minValues"]) for s in _file_statistics(path)]
    assert {"app": 1} == table_transactions(spark, uri)


def _arrivals(spark: SparkSession, minute: int) -> DataFrame:
    """Three silver readings that arrived at ``T0 + minute``, in one file."""
    arrival = T0 + timedelta(minutes=minute)
    rows = [(f"e{minute}-{i}", 0, minute * 10 + i, arrival) for i in range(3)]
    return readings(spark, rows).coalesce(1)


def test_live_files_read_what_a_plain_read_does_from_the_files_of_the_range_only(
    spark: SparkSession, tmp_path: Path
) -> None:
    uri = f"file:{tmp_path / 'silver'}"
    ensure_table(LOCAL_FILES, uri, SENSOR_READINGS)
    live = LiveFiles(uri, "kafka_timestamp")
    start, end = T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)

    def keys(df: DataFrame) -> list[tuple[str, int]]:
        return sorted((r.event_id, r.kafka_offset) for r in df.collect())

    def plain() -> list[tuple[str, int]]:
        table = spark.read.format("delta").load(uri)
        return keys(table.where(F.col("kafka_timestamp").between(F.lit(start), F.lit(end))))

    live.committed(append_once(_arrivals(spark, 0), uri, "app", 0))  # nothing kept yet
    assert [] == keys(live.read(spark, start, end))  # loads the table's files
    for minute in (1, 2, 3):
        live.committed(append_once(_arrivals(spark, minute), uri, "app", minute))
    kept: list[DataFrame] = []

    # The files of the writer's own commits: no Spark job plans the read.
    assert 0 == jobs_of(spark, "live-read", lambda: kept.append(live.read(spark, start, end)))
    assert 2 == len(kept[0].inputFiles())  # minutes 1 and 2, both ends of the range
    assert plain() == keys(kept[0])
    assert 6 == len(plain())

    # Another writer's commit, then the writer's own: the files are loaded again.
    _arrivals(spark, 1).withColumn("kafka_offset", F.col("kafka_offset") + 100).write.format(
        "delta"
    ).mode("append").save(uri)
    live.committed(append_once(_arrivals(spark, 2).limit(1), uri, "app", 4))
    assert 10 == len(plain())
    assert plain() == keys(live.read(spark, start, end))

    # A new writer (a restart) loads them from the version's checksum: no Spark job.
    jvm: Any = spark.sparkContext._jvm
    forget_delta_logs = jvm.org.apache.spark.sql.delta.DeltaLog.clearCache
    forget_delta_logs()
    restarted, loaded = LiveFiles(uri, "kafka_timestamp"), []
    assert 0 == jobs_of(
        spark, "live-load", lambda: loaded.append(restarted.read(spark, start, end))
    )
    assert plain() == keys(loaded[0])
    # Without a checksum, from the table's state.
    for crc in (tmp_path / "silver" / "_delta_log").glob("*.crc"):
        crc.unlink()
    forget_delta_logs()
    rebuilt, loaded = LiveFiles(uri, "kafka_timestamp"), []
    assert 0 < jobs_of(
        spark, "live-rebuild", lambda: loaded.append(rebuilt.read(spark, start, end))
    )
    assert plain() == keys(loaded[0])


def _log_json(table: Path, name: str) -> Any:
    return json.loads((table / "_delta_log" / name).read_text())


def test_a_table_is_created_as_spark_creates_it_with_a_checksum_spark_reads_without_a_job(
    spark: SparkSession, tmp_path: Path
) -> None:
    ours, sparks = tmp_path / "ours", tmp_path / "spark"
    recorded = {"lakehouse.contract.fingerprint": "0123456789abcdef"}
    ensure_table(LOCAL_FILES, f"file:{ours}", SENSOR_READINGS, recorded)
    checksum = (ours / "_delta_log" / f"{0:020d}.crc").read_text()
    ensure_table(LOCAL_FILES, f"file:{ours}", SENSOR_READINGS, {"other": "ignored"})
    assert SENSOR_READINGS.schema is not None
    builder = (
        DeltaTable.createIfNotExists(spark)
        .location(f"file:{sparks}")
        .addColumns(SENSOR_READINGS.schema)
        .partitionedBy(*SENSOR_READINGS.partition_by)
    )
    for key, value in {**SENSOR_READINGS.properties, **recorded}.items():
        builder = builder.property(key, value)
    builder.execute()

    # A second call finds the table: no commit, the same checksum.
    assert [f"{0:020d}.crc", f"{0:020d}.json"] == sorted(
        p.name for p in (ours / "_delta_log").iterdir() if not p.name.startswith(".")
    )
    assert checksum == (ours / "_delta_log" / f"{0:020d}.crc").read_text()
    details = [
        spark.sql(f"DESCRIBE DETAIL delta.`file:{path}`")
        .select("partitionColumns", "properties", "minReaderVersion", "minWriterVersion")
        .collect()
        for path in (ours, sparks)
    ]
    assert details[1] == details[0]
    assert spark.read.format("delta").load(f"file:{sparks}").schema == (
        spark.read.format("delta").load(f"file:{ours}").schema
    )
    # Spark's own checksum but for what names this creation (and its file-size histogram).
    unique = ("txnId", "fileSizeHistogram")
    identity = ("id", "createdTime")
    expected, actual = (_log_json(p, f"{0:020d}.crc") for p in (sparks, ours))
    for summary in (expected, actual):
        # delta-rs spells an absent name and description as null.
        summary["metadata"] = {
            k: v for k, v in summary["metadata"].items() if k not in identity and v is not None
        }
        summary["metadata"]["schema"] = json.loads(summary["metadata"].pop("schemaString"))
    assert {k: v for k, v in expected.items() if k not in unique} == actual
    # Spark reads the transactions from it, and appends on, with no job to rebuild the state.
    assert 0 == jobs_of(spark, "created", lambda: table_transactions(spark, f"file:{ours}"))
    rows = readings(spark, [("e1", 0, 5, T0)])
    append_once(rows.coalesce(1), f"file:{ours}", "app", 0)
    assert {"app": 0} == table_transactions(spark, f"file:{ours}")
