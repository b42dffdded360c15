"""verify_checkpoint_matches_tables: refuse exactly the states that lose or duplicate data."""

from __future__ import annotations

import pytest

from service.errors import CheckpointCorruptError, CheckpointMismatchError
from service.lake.checkpoints import (
    PLAN_FILE,
    BatchRanges,
    CheckpointState,
    app_id,
    checkpoint_plan,
    read_checkpoint,
    recorded_plan,
    verify_checkpoint_matches_tables,
)
from tests.support.checkpoints import DictFiles

QUERY = "ingest_sensors"
TABLE = "s3a://lake/bronze/sensors"
OWN = app_id(QUERY, "q-1")


def test_app_id_is_derived_from_the_checkpoint_query_id() -> None:
    assert "lakehouse-ingest:ingest_sensors:q-1" == OWN
    assert app_id(QUERY, "q-1") != app_id(QUERY, "q-2")


@pytest.mark.parametrize(
    ("checkpoint", "txns"),
    [
        (CheckpointState("cp", None, None), None),  # first start ever
        (CheckpointState("cp", None, None), {}),  # tables created, nothing written yet
        (CheckpointState("cp", "q-1", None), {OWN: 0}),  # crashed before the first commit
        (CheckpointState("cp", "q-1", 4), {OWN: 4}),  # clean restart
        (CheckpointState("cp", "q-1", 4), {OWN: 5}),  # crashed between write and commit
        (CheckpointState("cp", "q-1", 4), {OWN: 4, "someone-else": 9}),  # other writers ignored
    ],
)
def test_consistent_states_are_accepted(
    checkpoint: CheckpointState, txns: dict[str, int] | None
) -> None:
    verify_checkpoint_matches_tables(QUERY, checkpoint, {TABLE: txns}, anchor=TABLE)


@pytest.mark.parametrize(
    ("checkpoint", "txns", "message"),
    [
        (CheckpointState("cp", "q-1", 4), None, "does not exist"),
        (CheckpointState("cp", "q-1", 4), {}, "has txn version None"),
        (CheckpointState("cp", "q-1", 4), {OWN: 3}, "has txn version 3"),
        (CheckpointState("cp", "q-1", 0), {app_id(QUERY, "q-0"): 8}, "has txn version None"),
        (CheckpointState("cp", None, None), {app_id(QUERY, "q-0"): 8}, "another checkpoint"),
        (CheckpointState("cp", "q-1", None), {app_id(QUERY, "q-0"): 8}, "another checkpoint"),
    ],
)
def test_states_that_would_skip_or_duplicate_are_refused(
    checkpoint: CheckpointState, txns: dict[str, int] | None, message: str
) -> None:
    with pytest.raises(CheckpointMismatchError, match=message) as error:
        verify_checkpoint_matches_tables(QUERY, checkpoint, {TABLE: txns}, anchor=TABLE)
    assert TABLE in str(error.value)


SIDE_TABLE = "s3a://lake/silver/quarantine"


@pytest.mark.parametrize("side_txns", [{}, {OWN: 2}, {OWN: 4}])
def test_a_side_table_may_have_skipped_batches_that_had_no_rows_for_it(
    side_txns: dict[str, int],
) -> None:
    verify_checkpoint_matches_tables(
        QUERY, CheckpointState("cp", "q-1", 4), {TABLE: {OWN: 4}, SIDE_TABLE: side_txns}, TABLE
    )


def test_a_missing_side_table_is_refused() -> None:
    with pytest.raises(CheckpointMismatchError, match=f"table {SIDE_TABLE} does not exist"):
        verify_checkpoint_matches_tables(
            QUERY, CheckpointState("cp", "q-1", 4), {TABLE: {OWN: 4}, SIDE_TABLE: None}, TABLE
        )


def test_a_side_table_of_another_checkpoint_is_refused_under_a_new_one() -> None:
    with pytest.raises(CheckpointMismatchError, match="another checkpoint"):
        verify_checkpoint_matches_tables(
            QUERY,
            CheckpointState("cp", None, None),
            {TABLE: {}, SIDE_TABLE: {app_id(QUERY, "q-0"): 3}},
            TABLE,
        )


def spark_checkpoint() -> dict[str, str]:
    """Batches 0-1 committed, batch 2 planned: the files as Spark 4.0 writes them."""
    meta = '{"batchWatermarkMs":0,"batchTimestampMs":1700000000000,"conf":{}}'
    return {
        "cp/metadata": '{"id":"q-1"}',
        "cp/offsets/0": f'v1\n{meta}\n{{"sensors":{{"0":5,"1":7}}}}',
        "cp/offsets/1": f'v1\n{meta}\n{{"sensors":{{"0":9,"1":7}}}}',
        "cp/offsets/2": f'v1\n{meta}\n{{"sensors":{{"0":12,"1":8}}}}',
        "cp/commits/0": 'v1\n{"nextBatchWatermarkMs":0}',
        "cp/commits/1": 'v1\n{"nextBatchWatermarkMs":0}',
    }


def test_a_sound_checkpoint_reads_its_last_committed_offsets() -> None:
    state = read_checkpoint(DictFiles(spark_checkpoint()), "cp")
    assert ("q-1", 1, 2, {"sensors": {0: 9, 1: 7}}) == (
        state.query_id,
        state.last_committed_batch,
        state.planned_batch,
        state.kafka_offsets,
    )


@pytest.mark.parametrize(
    ("file", "text", "what"),
    [
        ("cp/metadata", '{"id":"q-', "no JSON object with the query id"),
        ("cp/commits/1", "v1\n", "not a v1 log entry"),
        ("cp/commits/1", "", "not a v1 log entry"),
        ("cp/offsets/1", 'v1\n{"batchWatermarkMs":0}\n{"sensors":{"0":9', "a line is not JSON"),
        ("cp/offsets/2", "\x00\x00\x00", "not a v1 log entry"),  # the planned batch
        ("cp/offsets/1", None, "missing"),
    ],
)
def test_a_truncated_or_corrupt_file_spark_restarts_from_is_refused_by_name(
    file: str, text: str | None, what: str
) -> None:
    files = spark_checkpoint()
    if text is None:
        del files[file]
    else:
        files[file] = text

    with pytest.raises(CheckpointCorruptError, match=what) as refused:
        read_checkpoint(DictFiles(files), "cp")
    assert f"checkpoint file {file} is" in str(refused.value)
    assert "docs/runbooks/CheckpointCorrupt.md" in str(refused.value)


def test_an_old_offsets_file_spark_no_longer_reads_is_not_checked() -> None:
    files = spark_checkpoint()
    files["cp/offsets/0"] = "garbage"
    assert 1 == read_checkpoint(DictFiles(files), "cp").last_committed_batch


def test_a_new_checkpoint_records_the_latest_plan_and_keeps_it() -> None:
    files = DictFiles({})
    assert 2 == checkpoint_plan(files, "cp", 2)
    assert {f"cp/{PLAN_FILE}": "2\n"} == files.files
    files.files["cp/metadata"] = '{"id":"q-1"}'  # Spark created the checkpoint
    assert 2 == checkpoint_plan(files, "cp", 3)  # a later release keeps the recorded one


def test_a_checkpoint_spark_created_without_a_plan_file_runs_plan_1() -> None:
    files = DictFiles(spark_checkpoint())
    assert 1 == checkpoint_plan(files, "cp", 2)
    assert f"cp/{PLAN_FILE}" not in files.files


def test_reading_the_plan_version_writes_nothing() -> None:
    files = DictFiles(spark_checkpoint())
    assert 1 == recorded_plan(files, "cp", 2)
    assert spark_checkpoint() == files.files
    files.files[f"cp/{PLAN_FILE}"] = "2\n"
    assert 2 == recorded_plan(files, "cp", 2)


def test_a_plan_file_left_beside_no_checkpoint_is_replaced() -> None:
    files = DictFiles({f"cp/{PLAN_FILE}": "1\n"})  # written, then the start failed
    assert 2 == checkpoint_plan(files, "cp", 2)
    assert "2\n" == files.files[f"cp/{PLAN_FILE}"]


@pytest.mark.parametrize(("text", "error"), [("x", CheckpointCorruptError),
    ("3", CheckpointMismatchError), ("0", CheckpointMismatchError)])  # fmt: skip
def test_an_unreadable_or_unknown_plan_version_refuses_to_start(
    text: str, error: type[Exception]
) -> None:
    files = DictFiles({"cp/metadata": '{"id":"q-1"}', f"cp/{PLAN_FILE}": text})
    with pytest.raises(error, match=PLAN_FILE if error is CheckpointCorruptError else "1 to 2"):
        checkpoint_plan(files, "cp", 2)


def test_a_batch_covers_the_previous_batch_end_to_its_own_or_the_initial_offsets() -> None:
    files = spark_checkpoint() | {"cp/sources/0/0": '\x00v1\n{"sensors":{"0":2,"1":0}}'}
    ranges = BatchRanges(DictFiles(files), "cp", "sensors", floors={})

    assert ({0: 2, 1: 0}, {0: 5, 1: 7}) == ranges.of(0)
    assert ({0: 5, 1: 7}, {0: 9, 1: 7}) == ranges.of(1)
    del files["cp/offsets/1"]  # a run of batches reads only each batch's own end
    assert ({0: 9, 1: 7}, {0: 12, 1: 8}) == ranges.of(2)


def test_a_replayed_batch_starts_at_the_previous_end_and_a_floor_raises_a_start() -> None:
    files = spark_checkpoint()
    ranges = BatchRanges(DictFiles(files), "cp", "sensors", floors={0: 11})

    assert ({0: 11, 1: 7}, {0: 12, 1: 8}) == ranges.of(2)
    assert ({}, {0: 5, 1: 7}) == BatchRanges(DictFiles(files), "cp", "sensors", {}).of(0)
