"""A lake and checkpoints written by the previous release, resumed by this one in place.

``tests/fixtures/previous_release`` holds a lake (tables and checkpoints, gold's
state stores included) written by the previous release's Spark and Delta, recorded by
`tests.support.previous_release`. The test puts it on MinIO, writes its topics back to
a fresh broker record for record from its bronze tables (the same partitions, offsets,
keys, values and timestamps), and runs this release on it: first with nothing new to
read (no batch may replay or double anything), then after new readings whose event
times close every window the previous release left open in gold's state.
"""

from __future__ import annotations

import json
import tarfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyspark
import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable
from devstack import KafkaBroker, MinioServer
from pyspark.sql import DataFrame, SparkSession

from service.gold.transforms import heart_rate_stats, heart_rate_with_activity, sensor_stats
from tests.support.gold import final_watermark
from tests.support.lake import Lake, assert_bronze_exactly_once
from tests.support.previous_release import LAKE_ARCHIVE, MANIFEST
from tests.support.repo import REPO
from tests.support.service_process import ServiceProcess

pytestmark = pytest.mark.integration

FIXTURE = REPO / "tests" / "fixtures" / "previous_release"
WATERMARK = timedelta(minutes=10)
ENV = {"INGEST_GOLD_ENABLED": "true", "INGEST_KAFKA_MAX_OFFSETS_PER_TRIGGER": "800"}


@dataclass(frozen=True)
class Upgraded:
    """The lake before and after this release resumed it."""

    lake: Lake
    previous_rows: dict[str, int]  # rows per table as the previous release left them
    resumed_rows: dict[str, int]  # after this release's run with nothing new to read
    resumed: ServiceProcess  # that run
    previous_latest_reading: datetime  # the latest event time the previous release read


def _upload(s3: Any, local_root: Path, storage_root: str) -> None:
    bucket, _, prefix = storage_root.removeprefix("s3a://").partition("/")
    for path in sorted(p for p in local_root.rglob("*") if p.is_file()):
        s3.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(local_root)}")


def _replay_topic(bootstrap_servers: str, topic: str, bronze: pa.Table) -> None:
    """Produce bronze's records again, each to its partition at its offset."""
    producer = Producer({"bootstrap.servers": bootstrap_servers, "enable.idempotence": True})
    records = sorted(bronze.to_pylist(), key=lambda r: (r["kafka_partition"], r["kafka_offset"]))
    expected = {p: 0 for p in range(3)}
    for r in records:
        partition = r["kafka_partition"]
        assert r["kafka_offset"] == expected[partition], "the fixture's bronze has a gap"
        expected[partition] += 1
        headers = [(h["key"], h["value"]) for h in r["headers"] or []]
        producer.produce(
            topic, value=r["value"], key=r["key"], partition=partition, headers=headers,
            timestamp=int(r["kafka_timestamp"].timestamp() * 1000),
        )  # fmt: skip
    assert 0 == producer.flush(60)


def _run_available_now(lake: Lake, name: str) -> ServiceProcess:
    driver = lake.service(name, "run", "--available-now", **ENV).start()
    try:
        assert 0 == driver.wait(timeout=900), driver.log_text()[-4000:]
    finally:
        driver.cleanup()
    return driver


@pytest.fixture(scope="module")
def upgraded(
    kafka_broker: KafkaBroker,
    minio_server: MinioServer,
    s3_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Upgraded]:
    manifest = json.loads((FIXTURE / MANIFEST).read_text())
    work = tmp_path_factory.mktemp("upgrade")
    with tarfile.open(FIXTURE / LAKE_ARCHIVE) as archive:
        archive.extractall(work, filter="data")
    lake = Lake(
        users_topic=manifest["users_topic"],
        sensors_topic=manifest["sensors_topic"],
        storage_root=f"s3a://lakehouse/upgrade-{uuid.uuid4().hex[:8]}",
        bootstrap_servers=kafka_broker.bootstrap_servers,
        s3_env=s3_env,
        work_dir=work,
        alerts_topic=manifest["alerts_topic"],
    )
    kafka_broker.create_topics([lake.users_topic, lake.sensors_topic], partitions=3)
    for topic, table in ((lake.users_topic, "users"), (lake.sensors_topic, "sensors")):
        bronze = DeltaTable(str(work / "lake" / "bronze" / table)).to_pyarrow_table()
        _replay_topic(lake.bootstrap_servers, topic, bronze)
    readings = DeltaTable(str(work / "lake" / "silver" / "sensor_readings")).to_pyarrow_table()
    latest = max(readings.column("event_time").to_pylist())
    _upload(minio_server.s3_client(), work / "lake", lake.storage_root)

    previous_rows = lake.delta_rs_rows()
    resumed = _run_available_now(lake, "resumed")
    resumed_rows = lake.delta_rs_rows()
    lake.generate("--users", "60", "--readings", "1200", "--seed", "13",
                  "--bad-fraction", "0.03", "--duplicate-fraction", "0.03")  # fmt: skip
    _run_available_now(lake, "after-new-readings")
    yield Upgraded(lake, previous_rows, resumed_rows, resumed, latest)


def test_the_previous_releases_lake_was_recorded_by_another_spark() -> None:
    """After a Spark upgrade the fixture is recorded again with the release before it."""
    manifest = json.loads((FIXTURE / MANIFEST).read_text())
    assert manifest["pyspark"] != pyspark.__version__


def test_resuming_the_previous_releases_checkpoints_replays_nothing(upgraded: Upgraded) -> None:
    assert upgraded.previous_rows["bronze/sensors"] > 0
    assert upgraded.previous_rows["gold/readings_enriched"] > 0
    assert upgraded.previous_rows == upgraded.resumed_rows
    assert [] == [e for e in upgraded.resumed.events("batch_written") if e["rows_in"]]


def test_new_records_land_exactly_once_beside_the_previous_ones(
    spark: SparkSession, upgraded: Upgraded
) -> None:
    lake = upgraded.lake
    assert_bronze_exactly_once(spark, lake)
    code, report = lake.reconcile()
    assert 0 == code, report
    rows = lake.delta_rs_rows()
    assert rows["bronze/sensors"] > upgraded.previous_rows["bronze/sensors"]
    assert rows["silver/sensor_readings"] > upgraded.previous_rows["silver/sensor_readings"]


def _table(spark: SparkSession, lake: Lake, name: str) -> DataFrame:
    return spark.read.format("delta").load(lake.table(name))


def _keyed(df: DataFrame, key: list[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {tuple(r[k] for k in key): r.asDict() for r in df.collect()}


def test_gold_windows_the_previous_release_left_open_close_with_their_state(
    spark: SparkSession, upgraded: Upgraded
) -> None:
    lake = upgraded.lake
    silver = _table(spark, lake, "silver/sensor_readings")
    previous = upgraded.previous_latest_reading.replace(tzinfo=None)
    cases = (
        ("gold/sensor_stats_1m", ["window_start", "device_id", "sensor_type"],
         sensor_stats(silver, "1 minute", "10 minutes"), silver,
         ["count", "min", "max"], ["avg", "stddev"]),
        ("gold/heart_rate_5m", ["window_start", "user_id"],
         heart_rate_stats(silver, "5 minutes", "1 minute", "10 minutes"),
         silver.where("sensor_type = 'heart_rate' AND user_id IS NOT NULL"),
         ["count", "min_bpm", "max_bpm", "p95_bpm"], ["avg_bpm"]),
    )  # fmt: skip
    for name, key, oracle_df, basis, exact, close in cases:
        oracle = _keyed(oracle_df, key)
        emitted = _keyed(_table(spark, lake, name), key)
        closed = final_watermark(basis, WATERMARK)
        assert set(emitted) == {k for k, v in oracle.items() if v["window_end"] <= closed}, name
        from_state = [k for k, v in emitted.items() if v["window_start"] <= previous]
        assert from_state, f"{name}: no window of the previous release's readings"
        for k, actual in emitted.items():
            for column in exact:
                assert oracle[k][column] == actual[column], (name, k, column)
            for column in close:
                e, a = oracle[k][column], actual[column]
                assert (e is None and a is None) or a == pytest.approx(e, rel=1e-9), column

    pairs = _table(spark, lake, "gold/heart_rate_activity")
    key = ["hr_event_id", "acc_event_id"]
    oracle_pairs = heart_rate_with_activity(silver, "10 minutes", 30, bucketed=False)
    assert set(_keyed(oracle_pairs, key)) == set(_keyed(pairs, key))
    assert pairs.count() == pairs.select(*key).distinct().count()
