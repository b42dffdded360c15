"""MERGE of user changes into silver/users: ordering, tombstones and replay idempotency."""

from __future__ import annotations

import datetime
from contextlib import nullcontext
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from service.ingest.modes import parse_records
from service.ingest.modes.dedup import id_hash_in, valid_hash
from service.ingest.modes.entities import Entities
from service.ingest.validation import DEFAULT_MAX_PAYLOAD_BYTES, split_valid_invalid
from service.lake import merge as merge_module
from service.lake.delta import ensure_table
from service.lake.merge import merge_once, plan_merge
from service.lake.tables import SHIPPED, USERS
from tests.support.lake import LOCAL_FILES
from tests.support.payloads import profile
from tests.support.records import bronze_frame
from tests.support.spark import jobs_of

APP = "silver_users-test"
CONTRACT = SHIPPED.contracts["users"]
BATCH_ARRIVAL = datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.UTC)


def merge(
    spark: SparkSession,
    uri: str,
    records: list[tuple[str | None, str | None]],
    version: int,
    arrival: datetime.datetime = BATCH_ARRIVAL,
    first_offset: int = 0,
    path: str = "delta-merge",
) -> int:
    """Parse ``records`` as one users batch and MERGE it as txn ``version`` by ``path``: Delta's
    MERGE, or as a driver's small batch is, a rewrite of the files that hold the batch's
    keys (``touched-files``: found by a job of their own; ``one-pass``: a small table's,
    all of them). Returns the Spark jobs the MERGE ran."""
    bronze = bronze_frame(spark, records, "users", arrival=arrival, first_offset=first_offset)
    valid, _ = split_valid_invalid(parse_records(CONTRACT, bronze, DEFAULT_MAX_PAYLOAD_BYTES, None))
    mode = Entities(CONTRACT)
    touching = None
    touched = path != "delta-merge"
    if touched:
        keys = {r.h for r in valid.select(valid_hash(CONTRACT, mode.key).alias("h")).collect()}
        touching = id_hash_in(mode.key, keys)
    changes, clauses = mode.latest_changes(valid), mode.merge_clauses()
    # A small batch as a driver's runs it: without adaptive execution (a job per shuffle
    # stage), which changes how many files an append writes.
    spark.conf.set("spark.sql.adaptive.enabled", str(not touched).lower())
    # Any table is above the bound of the one pass for ``touched-files``.
    bound = mock.patch.object(merge_module, "ONE_PASS_BYTES", -1)
    try:
        with bound if path == "touched-files" else nullcontext():
            return jobs_of(
                spark,
                f"merge-{uri}-{version}",
                lambda: merge_once(changes, uri, APP, version, clauses, touching),
            )
    finally:
        spark.conf.unset("spark.sql.adaptive.enabled")


MERGE_PATHS = ("delta-merge", "touched-files", "one-pass")


def table_version(spark: SparkSession, uri: str) -> int:
    """The table's latest commit version."""
    latest = DeltaTable.forPath(spark, uri).history(1).select("version").first()
    assert latest is not None
    return int(latest["version"])


def table(spark: SparkSession, uri: str) -> dict[int, dict[str, Any]]:
    """The table's rows by user id."""
    return {r["user_id"]: r.asDict() for r in spark.read.format("delta").load(uri).collect()}


@pytest.fixture
def users_uri(spark: SparkSession, tmp_path: Path) -> str:
    """An empty silver/users table."""
    uri = f"file:{tmp_path}/silver/users"
    ensure_table(LOCAL_FILES, uri, USERS)
    return uri


@pytest.mark.parametrize("path", MERGE_PATHS)
def test_only_newer_changes_apply_tombstones_mark_deleted_and_newer_upserts_resurrect(
    spark: SparkSession, users_uri: str, path: str
) -> None:
    # Batch 0 arrives 2024-05-01 12:00: that is the change time of its tombstones.
    merge(
        spark,
        users_uri,
        [
            ("1", profile(user_id=1, first_name="new", updated_at="2024-04-10T00:00:00Z")),
            ("2", profile(user_id=2, first_name="kept", updated_at="2024-04-01T00:00:00Z")),
            ("3", profile(user_id=3, first_name="gone", updated_at="2024-04-01T00:00:00Z")),
            ("5", None),
            ("6", None),
        ],
        version=0,
    )
    jobs = merge(
        spark,
        users_uri,
        [
            ("1", profile(user_id=1, first_name="old", updated_at="2024-04-09T00:00:00Z")),
            ("3", None),  # tombstone of a known user: keeps the profile
            ("9", None),  # tombstone of an unknown user: inserted deleted
            # older than user 5's tombstone: becomes the profile, the user stays deleted
            ("5", profile(user_id=5, first_name="before", updated_at="2024-04-30T00:00:00Z")),
            ("6", profile(user_id=6, first_name="after", updated_at="2024-05-02T00:00:00Z")),
        ],
        version=1,
        arrival=BATCH_ARRIVAL + datetime.timedelta(days=1),
        first_offset=10,
        path=path,
    )
    rows = table(spark, users_uri)
    actual = {
        u: (r["first_name"], r["is_deleted"], r["deleted_at"] is not None, r["kafka_offset"])
        for u, r in rows.items()
    }
    expected = {
        1: ("new", False, False, 0),
        2: ("kept", False, False, 1),
        3: ("gone", True, True, 2),
        5: ("before", True, True, 13),
        6: ("after", False, False, 14),
        9: (None, True, True, 12),
    }
    assert expected == actual
    merged = DeltaTable.forPath(spark, users_uri).history(1).first()
    assert merged is not None
    # Each records the MERGE with the same counts.
    counted = ("numSourceRows", "numTargetRowsInserted", "numTargetRowsUpdated")
    written = ("numTargetRowsCopied", "numOutputRows", "numTargetFilesRemoved")
    metrics = {k: int(merged["operationMetrics"][k]) for k in (*counted, *written)}
    assert ("MERGE", [5, 1, 3, 2, 6, 1]) == (merged["operation"], list(metrics.values()))
    # The touched files with the counts, then their rewrite; or the rewrite alone, which
    # counts (Delta's MERGE: its state reconstruction and its passes).
    if path != "delta-merge":
        assert {"touched-files": 2, "one-pass": 1}[path] == jobs


def test_final_state_does_not_depend_on_how_changes_fall_into_batches(
    spark: SparkSession, tmp_path: Path
) -> None:
    changes: list[tuple[str | None, str | None]] = [
        ("1", profile(first_name="a", updated_at="2024-04-01T00:00:00Z")),
        ("1", profile(first_name="b", updated_at="2024-04-20T00:00:00Z")),
        ("1", None),  # tombstone at 2024-05-01 12:00: newer than both upserts
        ("1", profile(first_name="stale", updated_at="2024-04-10T00:00:00Z")),
        ("2", None),
        ("2", profile(user_id=2, first_name="back", updated_at="2024-06-01T00:00:00Z")),
    ]
    states = []
    # One batch, then one batch per change, merged by Delta's MERGE and by the rewrites in
    # turn (as a driver's large and small batches are).
    for split in (len(changes), 1):
        uri = f"file:{tmp_path}/split-{split}"
        ensure_table(LOCAL_FILES, uri, USERS)
        for version, start in enumerate(range(0, len(changes), split)):
            batch = changes[start : start + split]
            path = MERGE_PATHS[version % len(MERGE_PATHS)]
            merge(spark, uri, batch, version, first_offset=start, path=path)
        states.append(
            {
                u: (r["first_name"], r["updated_at"], r["is_deleted"], r["deleted_at"])
                for u, r in table(spark, uri).items()
            }
        )
    assert states[0] == states[1]
    assert ("b", True) == (states[0][1][0], states[0][1][2])
    assert ("back", False) == (states[0][2][0], states[0][2][2])


@pytest.mark.parametrize("path", ["delta-merge", "one-pass"])
def test_replayed_batch_version_is_skipped_and_the_next_version_applies(
    spark: SparkSession, users_uri: str, path: str
) -> None:
    merge(spark, users_uri, [("1", profile(first_name="v1", updated_at="2024-04-01T00:00:00Z"))], 1)
    version_after_first = table_version(spark, users_uri)
    # Same txn version, newer content: a replay Delta must skip whatever it carries.
    merge(
        spark,
        users_uri,
        [("1", profile(first_name="replay", updated_at="2024-04-02T00:00:00Z"))],
        1,
        path=path,
    )
    version_after_replay = table_version(spark, users_uri)
    name_after_replay = table(spark, users_uri)[1]["first_name"]
    v2: list[tuple[str | None, str | None]] = [
        ("1", profile(first_name="v2", updated_at="2024-04-03T00:00:00Z"))
    ]
    merge(spark, users_uri, v2, 2, path=path)
    expected = (version_after_first, "v1", "v2", None)
    actual = (
        version_after_replay,
        name_after_replay,
        table(spark, users_uri)[1]["first_name"],
        spark.conf.get("spark.databricks.delta.write.txnVersion", None),
    )
    assert expected == actual


def test_a_first_batch_into_an_empty_table_is_appended_as_the_merge_would_insert_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    records: list[tuple[str | None, str | None]] = [
        ("1", profile(user_id=1, first_name="a", updated_at="2024-04-01T00:00:00Z")),
        ("1", profile(user_id=1, first_name="b", updated_at="2024-04-20T00:00:00Z")),
        ("2", profile(user_id=2, first_name="gone", updated_at="2024-04-01T00:00:00Z")),
        ("2", None),  # a tombstone newer than the upsert
        ("3", None),  # a tombstone for an unknown user: a deleted row without fields
        ("4", '{"user_id": 4, "first_name": "x", "updated_at": "2024-04-02T00:00:00Z", "z": 1}'),
    ]
    appended, merged = f"file:{tmp_path}/appended", f"file:{tmp_path}/merged"
    for uri in (appended, merged):
        ensure_table(LOCAL_FILES, uri, USERS)
    merge(spark, appended, records, version=0)
    # Delta's own MERGE of the same changes into the same empty table.
    bronze = bronze_frame(spark, records, "users", arrival=BATCH_ARRIVAL)
    valid, _ = split_valid_invalid(parse_records(CONTRACT, bronze, DEFAULT_MAX_PAYLOAD_BYTES, None))
    mode = Entities(CONTRACT)
    on, changed, update, insert = mode.merge_clauses()
    (
        DeltaTable.forPath(spark, merged)
        .alias("t")
        .merge(mode.latest_changes(valid).alias("s"), on)
        .whenMatchedUpdate(condition=changed, set=update)
        .whenNotMatchedInsert(values=insert)
        .execute()
    )

    assert table(spark, merged) == table(spark, appended)
    assert len(table(spark, appended)) == 4
    history = DeltaTable.forPath(spark, appended).history(1).first()
    assert history is not None and history["operation"] == "WRITE"
    # The append recorded the batch's txn: replayed, the batch writes nothing.
    version = table_version(spark, appended)
    merge(spark, appended, records[:1], version=0)
    assert table_version(spark, appended) == version


def test_a_merge_planned_before_another_commit_fails_at_its_commit_and_writes_nothing(
    spark: SparkSession, users_uri: str
) -> None:
    """A driver plans a small batch's MERGE (its transaction started) while the batch's
    summary runs: a commit to the table in between is Delta's conflict check's."""
    merge(spark, users_uri, [("1", profile(first_name="v1", updated_at="2024-04-01T00:00:00Z"))], 1)
    bronze = bronze_frame(
        spark, [("1", profile(first_name="planned", updated_at="2024-04-03T00:00:00Z"))], "users"
    )
    valid, _ = split_valid_invalid(parse_records(CONTRACT, bronze, DEFAULT_MAX_PAYLOAD_BYTES, None))
    mode = Entities(CONTRACT)
    planned = plan_merge(
        mode.latest_changes(valid), users_uri, APP, 3, mode.merge_clauses(), small=True
    )
    merge(spark, users_uri, [("1", profile(first_name="v2", updated_at="2024-04-02T00:00:00Z"))], 2)
    version = table_version(spark, users_uri)

    with pytest.raises(Exception, match="Concurrent"):
        planned(None)
    assert (version, "v2") == (
        table_version(spark, users_uri),
        table(spark, users_uri)[1]["first_name"],
    )
