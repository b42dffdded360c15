"""Delta checkpoints after the batches (`LogCheckpoints`), on local Delta tables."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import SparkSession
from structlog.testing import capture_logs

from service.lake.delta import append_once, ensure_table
from service.lake.log_checkpoints import LogCheckpoints
from service.lake.tables import SENSOR_READINGS, Table
from tests.support.lake import LOCAL_FILES
from tests.support.records import readings

T0 = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
# Every 2 + 1 commits (INGEST_DELTA_CHECKPOINT_COMMITS is 10 by default).
COMMITS = 2
TABLE = replace(SENSOR_READINGS, checkpoint_stagger=1)


def _append(spark: SparkSession, root: Path, versions: range) -> None:
    for version in versions:
        rows = readings(spark, [(f"e{version}", 0, version, T0)])
        append_once(rows, TABLE.uri(f"file:{root}"), "a", version)


def _latest(root: Path) -> int:
    return max(int(p.stem) for p in (root / TABLE.name / "_delta_log").glob("*.json"))


def _checkpoints(root: Path, table: Table = TABLE) -> list[int]:
    log_dir = root / table.name / "_delta_log"
    return sorted(int(p.name.split(".")[0]) for p in log_dir.glob("*.checkpoint.parquet"))


def _three_commits(spark: SparkSession, root: Path) -> tuple[LogCheckpoints, Callable[[], None]]:
    """A table with three commits after its creation, its checkpoints and a batch's hook."""
    ensure_table(LOCAL_FILES, TABLE.uri(f"file:{root}"), TABLE)
    _append(spark, root, range(1, 4))
    checkpoints = LogCheckpoints(spark, f"file:{root}", COMMITS, "maintenance")
    return checkpoints, checkpoints.after_batch_of([TABLE])


def test_a_batch_commits_without_a_checkpoint_and_the_driver_writes_it_at_the_tables_cadence(
    spark: SparkSession, tmp_path: Path
) -> None:
    ensure_table(LOCAL_FILES, TABLE.uri(f"file:{tmp_path}"), TABLE)  # version 0
    checkpoints = LogCheckpoints(spark, f"file:{tmp_path}", COMMITS, "maintenance")
    committed = checkpoints.after_batch_of([TABLE])
    _append(spark, tmp_path, range(1, 3))
    committed()
    assert [] == checkpoints.run_due()  # 2 commits since the creation

    _append(spark, tmp_path, range(3, 5))
    assert [] == _checkpoints(tmp_path)  # the commits themselves wrote none
    assert [] == checkpoints.run_due()  # no batch ended: nothing pending
    committed()
    assert [(TABLE.name, 4)] == checkpoints.run_due()
    assert [4] == _checkpoints(tmp_path)

    _append(spark, tmp_path, range(5, 6))
    committed()
    assert [] == checkpoints.run_due()  # 1 commit since the checkpoint
    # Two more appends (and the session's auto-compaction commit after a few files).
    _append(spark, tmp_path, range(6, 8))
    latest = _latest(tmp_path)
    committed()
    assert [(TABLE.name, latest)] == checkpoints.run_due()
    assert [4, latest] == _checkpoints(tmp_path)

    # The checkpoint holds the whole table: without the commits before it, Delta reads
    # every row from it (Delta keeps the checkpoint's own commit, as its log cleanup does).
    for version in range(latest):
        (tmp_path / TABLE.name / "_delta_log" / f"{version:020d}.json").unlink()
    uri = TABLE.uri(f"file:{tmp_path}")
    rows = spark.newSession().read.format("delta").load(uri)
    assert [f"e{v}" for v in range(1, 8)] == sorted(r.event_id for r in rows.collect())


def test_a_checkpoint_that_fails_is_logged_and_tried_again_after_the_next_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    checkpoints, committed = _three_commits(spark, tmp_path)
    # The table is gone under the driver's snapshot: writing its state fails.
    shutil.move(tmp_path / TABLE.name, tmp_path / "moved")
    committed()
    with capture_logs() as logs:
        assert [] == checkpoints.run_due()
    (failed,) = [e for e in logs if e["event"] == "delta_checkpoint_failed"]
    assert TABLE.name == failed["table"]
    assert failed["error"]

    shutil.move(tmp_path / "moved", tmp_path / TABLE.name)
    committed()
    assert [(TABLE.name, 3)] == checkpoints.run_due()


def test_the_thread_writes_the_checkpoint_a_batch_made_due_and_stops(
    spark: SparkSession, tmp_path: Path
) -> None:
    checkpoints, committed = _three_commits(spark, tmp_path)
    checkpoints.start()
    try:
        committed()
        deadline = time.monotonic() + 60
        while not _checkpoints(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        checkpoints.stop()
    assert [3] == _checkpoints(tmp_path)
