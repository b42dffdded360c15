"""verify_checkpoint_matches_tables: refuse exactly the states that lose or duplicate data."""

from __future__ import annotations

import pytest

from service.checkpoints import CheckpointState, app_id, verify_checkpoint_matches_tables
from service.errors import CheckpointMismatchError

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
