"""The driver's periodic reconcile: increments planned from checkpoints, cursors moved by
what bronze held, outcomes exported (the checks themselves run on MinIO in the
integration tests)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from service.config import Settings
from service.driver.lake_audit import Cursor, LakeAuditor, advance, plan
from service.driver.metrics import IngestMetrics
from service.lake.checkpoints import QueryTarget
from service.lake.invariants import (
    Coverage,
    Finding,
    Increment,
    Increments,
    KeyedCheck,
    PartitionOffsets,
    Reconciliation,
)
from service.lake.object_files import ObjectFiles


def report(bronze: list[PartitionOffsets], rows: int, problems: list[str]) -> Reconciliation:
    """A reconcile report of ``rows`` sensors records with ``bronze``'s partitions."""
    return Reconciliation(
        storage_root="file:/lake",
        since=None,
        generated_at="2026-11-23T00:00:00Z",
        duration_seconds=0.1,
        tables={},
        bronze=bronze,
        checks={
            "users": KeyedCheck(Coverage(0, {}, Finding(), Finding(), Finding()), 0, 0, []),
            "sensors": Coverage(rows, {}, Finding(), Finding(), Finding()),
        },
        gold=[],
        problems=problems,
        records={"bronze/users": 0, "bronze/sensors": rows},
    )


def partition(number: int, first: int, last: int, rows: int) -> PartitionOffsets:
    return PartitionOffsets(
        "bronze/sensors", "sensors", number, first, last, rows, last - first + 1 - rows, 0, [], []
    )


def commit(root: Path, batch: int, offsets: Mapping[str, Mapping[str, int]]) -> None:
    """Spark's files for a committed micro-batch ``batch`` ending at ``offsets``."""
    for name in ("offsets", "commits"):
        (root / name).mkdir(parents=True, exist_ok=True)
    (root / "metadata").write_text(json.dumps({"id": "q-1"}))
    meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1_700_000_000_000})
    (root / "offsets" / str(batch)).write_text(f"v1\n{meta}\n{json.dumps(offsets)}\n")
    (root / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def test_increments_run_from_the_cursors_to_the_committed_ends() -> None:
    cursors = {"sensors": {0: Cursor(10, expect=True), 1: Cursor(5, expect=True)}}
    committed = {"sensors": {0: 20, 1: 5, 2: 3}}

    assert {
        "sensors": {0: Increment(10, 20, expect_start=True), 2: Increment(0, 3, False)}
    } == plan(cursors, committed)
    assert {} == plan(cursors, {"sensors": {0: 10, 1: 5}})


def test_cursors_move_one_past_the_last_offset_bronze_held_or_to_the_end() -> None:
    cursors = {"sensors": {0: Cursor(10, True), 1: Cursor(5, True)}}
    increments: Increments = {"sensors": {0: Increment(10, 20, True), 2: Increment(0, 3, False)}}

    moved = advance(cursors, increments, report([partition(0, 10, 18, 9)], 9, []))

    # Offset 19 is not in bronze (yet, or a transaction marker): the next check expects it.
    assert {"sensors": {0: Cursor(19, True), 1: Cursor(5, True), 2: Cursor(3, True)}} == moved


def test_the_auditor_checks_what_was_committed_since_and_exports_the_outcome(
    tmp_path: Path,
) -> None:
    checkpoint = tmp_path / "ingest_sensors"
    commit(checkpoint, 0, {"sensors": {"0": 10}})
    seen: list[Increments] = []
    outcomes = [
        report([partition(0, 10, 29, 20)], 20, []),
        report([partition(1, 0, 3, 3)], 3, ["bronze/sensors sensors/1: 1 offsets missing"]),
    ]

    def check(increments: Increments) -> Reconciliation:
        seen.append(increments)
        return outcomes[len(seen) - 1]

    registry = CollectorRegistry()
    auditor = LakeAuditor(
        [QueryTarget("ingest_sensors", "sensors", f"file:{checkpoint}")],
        ObjectFiles(Settings()),
        check,
        IngestMetrics(registry).reconcile,
        interval_seconds=300,
    )
    auditor.start_from_committed()
    assert auditor.check_once() is None  # nothing committed since the start
    commit(checkpoint, 1, {"sensors": {"0": 20}})
    commit(checkpoint, 2, {"sensors": {"0": 30}})
    auditor.check_once()
    commit(checkpoint, 3, {"sensors": {"0": 30, "1": 4}})
    with capture_logs() as logs:
        auditor.check_once()

    assert [
        {"sensors": {0: Increment(10, 30, True)}},
        {"sensors": {1: Increment(0, 4, False)}},
    ] == seen
    [broken] = [e for e in logs if e["event"] == "lake_invariant_broken"]
    assert (1, "error") == (broken["problem_count"], broken["log_level"])

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert 1 == value("lakehouse_ingest_reconcile_checks_total", result="ok")
    assert 1 == value("lakehouse_ingest_reconcile_checks_total", result="broken")
    assert 1 == value("lakehouse_ingest_reconcile_problems")
    assert 23 == value("lakehouse_ingest_reconcile_records_checked_total", table="bronze/sensors")


def test_a_started_auditor_counts_its_start_as_the_last_check_until_one_completes(
    tmp_path: Path,
) -> None:
    checkpoint = tmp_path / "ingest_sensors"
    commit(checkpoint, 0, {"sensors": {"0": 10}})
    registry = CollectorRegistry()
    metrics = IngestMetrics(registry, clock=lambda: 1_800_000_000.0)
    auditor = LakeAuditor(
        [QueryTarget("ingest_sensors", "sensors", f"file:{checkpoint}")],
        ObjectFiles(Settings()),
        lambda _increments: report([], 0, []),
        metrics.reconcile,
        interval_seconds=300,
    )
    last_check = "lakehouse_ingest_reconcile_last_check_timestamp_seconds"
    assert 0 == registry.get_sample_value(last_check)  # checks off: 0

    auditor.start_from_committed()
    auditor.start()
    auditor.stop()

    # A first check that hangs ages the driver's start (ReconcileStale), not a 0.
    assert 1_800_000_000.0 == registry.get_sample_value(last_check)
