"""A stateful gold query keeps the plan its checkpoint was started with."""

from __future__ import annotations

import shutil
from datetime import timedelta
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from service.config import Settings
from service.gold.queries import GoldWriter, gold_queries, start_gold_query
from service.lake.checkpoints import PLAN_FILE
from service.lake.delta import ensure_table
from service.lake.tables import HEART_RATE_ACTIVITY, SENSOR_READINGS
from service.streaming.runner import checkpoint_location, start_with_writer
from tests.support.gold import T0, acc, hr, readings
from tests.support.lake import LOCAL_FILES


def test_a_join_checkpoint_of_plan_1_resumes_with_plan_1_and_finds_pairs_across_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    settings = Settings(storage_root=str(tmp_path), spark_shuffle_partitions=2)
    silver = SENSOR_READINGS.uri(settings.storage_uri)
    ensure_table(LOCAL_FILES, silver, SENSOR_READINGS)  # gold tables: their query creates them
    join = next(q for q in gold_queries() if q.table == HEART_RATE_ACTIVITY)
    assert 2 == len(join.plans)

    def append(rows: list[dict[str, object]]) -> None:
        readings(spark, rows).write.format("delta").mode("append").save(silver)

    # What the release before plan 2 ran: plan 1, and no plan file in the checkpoint.
    append([hr("h1", 1, T0, 80.0), acc("a1", 1, T0 + timedelta(seconds=5), 1.0, "walk")])
    stream = spark.readStream.format("delta").load(silver)
    before = join.plans[0](stream, settings).writeStream.outputMode("append")
    writer = GoldWriter(join, settings, lambda: None)
    start_with_writer(spark, before, settings, writer, True, "gold").awaitTermination()
    checkpoint = checkpoint_location(settings, join.name)
    assert not (Path(checkpoint.removeprefix("file:")) / PLAN_FILE).exists()

    # This release: the pairs of readings on both sides of the upgrade are found.
    append([hr("h2", 1, T0 + timedelta(seconds=25), 90.0),
            acc("a2", 1, T0 + timedelta(seconds=20), 2.0, "run")])  # fmt: skip
    query = start_gold_query(spark, settings, join, GoldWriter(join, settings, lambda: None), True)
    query.awaitTermination()
    gold = spark.read.format("delta").load(HEART_RATE_ACTIVITY.uri(settings.storage_uri))
    pairs = sorted((r.hr_event_id, r.acc_event_id) for r in gold.collect())
    assert [("h1", "a1"), ("h1", "a2"), ("h2", "a1"), ("h2", "a2")] == pairs

    # Why: plan 2 on that checkpoint is refused by Spark (the state is keyed differently).
    (Path(checkpoint.removeprefix("file:")) / PLAN_FILE).write_text("2\n")
    append([hr("h3", 1, T0 + timedelta(seconds=40), 99.0)])
    query = start_gold_query(spark, settings, join, GoldWriter(join, settings, lambda: None), True)
    with pytest.raises(StreamingQueryException, match="STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"):
        query.awaitTermination()

    # The upgrade (docs/tables.md, Upgrading a lake): without its table and checkpoint, the query
    # rebuilds the table from silver with the latest plan.
    shutil.rmtree(checkpoint.removeprefix("file:"))
    shutil.rmtree(HEART_RATE_ACTIVITY.uri(settings.storage_uri).removeprefix("file:"))
    query = start_gold_query(spark, settings, join, GoldWriter(join, settings, lambda: None), True)
    query.awaitTermination()
    assert "2\n" == (Path(checkpoint.removeprefix("file:")) / PLAN_FILE).read_text()
    gold = spark.read.format("delta").load(HEART_RATE_ACTIVITY.uri(settings.storage_uri))
    pairs = sorted((r.hr_event_id, r.acc_event_id) for r in gold.collect())
    assert [("h1", "a1"), ("h1", "a2"), ("h2", "a1"), ("h2", "a2"), ("h3", "a2")] == pairs
