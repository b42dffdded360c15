"""replay-quarantine's selection, resumption and outcomes (the writes run on MinIO in
tests/integration/test_operator_verbs.py)."""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import DataFrame, SparkSession

from service.lake.schemas import QUARANTINE_REPLAYS
from service.verbs.replay import ReplayRequest, classify, select_quarantined, unfinished_replays

T0 = datetime(2026, 11, 1, 12, 0)
T1 = datetime(2026, 11, 2, 12, 0)


def quarantine(spark: SparkSession) -> DataFrame:
    rows = [
        ("sensors", 0, 1, "event_time_in_future", T0),
        ("sensors", 0, 2, "malformed_json", T0),
        ("sensors", 1, 7, "event_time_in_future", T1),
        ("users", 0, 3, "missing_field", T1),
        ("elsewhere", 0, 9, "event_time_in_future", T1),
    ]
    return spark.createDataFrame(
        rows,
        "kafka_topic string, kafka_partition int, kafka_offset long, error_code string,"
        " quarantined_at timestamp",
    )


Replay = tuple[str, int, int, str, datetime, str]


def replays(spark: SparkSession, rows: list[Replay]) -> DataFrame:
    """silver/quarantine_replays rows: (topic, partition, offset, replay id, at, outcome)."""
    full = [(t, p, o, None, rid, at, outcome, None, None) for t, p, o, rid, at, outcome in rows]
    return spark.createDataFrame(full, QUARANTINE_REPLAYS)


def coordinates(rows: DataFrame) -> set[tuple[str, int, int]]:
    return {(r.kafka_topic, r.kafka_partition, r.kafka_offset) for r in rows.collect()}


def test_the_selection_applies_every_filter_and_skips_records_already_moved(
    spark: SparkSession,
) -> None:
    done = replays(spark, [("sensors", 1, 7, "a", T1, "silver"),
                           ("sensors", 0, 2, "a", T1, "rejected")])  # fmt: skip
    topics = ["users", "sensors"]

    everything = select_quarantined(quarantine(spark), done, ReplayRequest(), topics)
    future = select_quarantined(
        quarantine(spark), done, ReplayRequest(error_codes=("event_time_in_future",)), topics
    )
    recent = select_quarantined(quarantine(spark), done, ReplayRequest(since=T1), topics)
    early_users = select_quarantined(
        quarantine(spark), done, ReplayRequest(topic="users", until=T1), topics
    )

    # A rejected record may be replayed again; a moved one never; other topics are not ours.
    assert {("sensors", 0, 1), ("sensors", 0, 2), ("users", 0, 3)} == coordinates(everything)
    assert {("sensors", 0, 1)} == coordinates(future)
    assert {("users", 0, 3)} == coordinates(recent)
    assert set() == coordinates(early_users)


def test_a_replay_with_a_plan_and_no_outcome_is_unfinished(spark: SparkSession) -> None:
    rows: list[Replay] = [
        ("sensors", 0, 1, "done", T0, "planned"),
        ("sensors", 0, 1, "done", T0, "rejected"),
        ("sensors", 0, 2, "killed-late", T1, "planned"),
        ("sensors", 0, 3, "killed-early", T0, "planned"),
    ]
    assert ["killed-early", "killed-late"] == unfinished_replays(replays(spark, rows))


def test_outcomes_are_rejected_with_the_new_code_else_duplicate_else_silver(
    spark: SparkSession,
) -> None:
    parsed = spark.createDataFrame(
        [
            ("sensors", 0, 1, T0, None, None),
            ("sensors", 0, 2, T0, "malformed_json", "not JSON"),
            ("sensors", 0, 3, T0, None, None),
        ],
        "kafka_topic string, kafka_partition int, kafka_offset long, kafka_timestamp timestamp,"
        " error_code string, error_detail string",
    )
    duplicates = parsed.where("kafka_offset = 3").select(
        "kafka_topic", "kafka_partition", "kafka_offset"
    )

    outcomes = {
        r.kafka_offset: (r.outcome, r.error_code) for r in classify(parsed, duplicates).collect()
    }

    assert {1: ("silver", None), 2: ("rejected", "malformed_json"), 3: ("duplicate", None)} == (
        outcomes
    )
    assert {1: "silver", 2: "rejected", 3: "silver"} == {
        r.kafka_offset: r.outcome for r in classify(parsed, None).collect()
    }
