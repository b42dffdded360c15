"""`show` and `reconcile` on a real lake: the real service (gold on) wrote it to MinIO from Kafka.

One lake for the module: a generated corpus (bad, late, duplicate readings; profile
updates and tombstones) drained by one ``run --available-now`` with gold on (its
only service run: about two minutes here). The verbs run as the operator runs them
(``python -m service …``, no JVM); Spark reading the same tables, at the same
versions, is the oracle. The broken lake is a local copy altered with delta-rs,
never the shared one.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable, write_deltalake
from devstack import MinioServer
from pydantic import SecretStr
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from service.config import Settings
from service.lake.invariants import Increment, reconcile
from service.lake.lakeview import LakeReader
from service.lake.schemas import COORDINATES
from service.lake.tables import SHIPPED
from service.verbs.show import ShowRequest, show
from tests.support.lake import Lake, LakeFactory

pytestmark = pytest.mark.integration

READINGS = 1200


@pytest.fixture(scope="module")
def lake(make_lake: LakeFactory) -> Iterator[Lake]:
    """One lake for the module's tests: generated and ingested (gold on) once."""
    lake = make_lake("operator-verbs")
    lake.generate(
        "--users", "15", "--readings", str(READINGS), "--seed", "23",
        "--bad-fraction", "0.05", "--late-fraction", "0.05", "--duplicate-fraction", "0.03",
        "--user-update-fraction", "0.05", "--tombstone-fraction", "0.02",
    )  # fmt: skip
    driver = lake.service("available-now", "run", "--available-now", INGEST_GOLD_ENABLED="true")
    driver.start()
    try:
        assert 0 == driver.wait(timeout=600), driver.log_text()[-4000:]
    finally:
        driver.cleanup()
    # A run that ends once the backlog is read keeps no recent ids: its batches search.
    batches = [
        e["phases_ms"]
        for e in driver.events("batch_written")
        if e["query"] == "ingest_sensors" and e["rows_in"]
    ]
    assert batches and all("dedup" in b and "recent_ids" not in b for b in batches), batches
    yield lake


def read(spark: SparkSession, uri: str, version: int | None = None) -> DataFrame:
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(uri)


def lake_reader(lake: Lake) -> LakeReader:
    """The reader the verbs build from the service's settings for ``lake``."""
    env = lake.s3_env
    settings = Settings(
        storage_root=lake.storage_root,
        aws_endpoint_url=env["AWS_ENDPOINT_URL"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=SecretStr(env["AWS_SECRET_ACCESS_KEY"]),
        aws_region=env["AWS_REGION"],
    )
    return LakeReader.from_settings(settings)


def shown(lake: Lake, name: str, **request: Any) -> list[dict[str, Any]]:
    """Every row `show` prints (JSON Lines) for table ``name``, in process (the CLI's own
    path is tested below with fewer runs: each costs a Python start)."""
    out = io.StringIO()
    table = SHIPPED.by_name()[name]
    show(lake_reader(lake), ShowRequest(table, limit=0, output_format="json", **request),
         out)  # fmt: skip
    return [json.loads(line) for line in out.getvalue().splitlines()]


def as_shown(value: Any) -> Any:
    """A Spark value as `show` prints it: bytes as hex."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    return value


def test_show_reads_every_table_as_spark_does(spark: SparkSession, lake: Lake) -> None:
    seconds = {}
    for table in SHIPPED.tables:
        started = time.monotonic()
        rows = shown(lake, table.name)
        seconds[table.name] = round(time.monotonic() - started, 2)
        assert read(spark, lake.table(table.name)).count() == len(rows), table.name
    print("show, seconds per table (all rows, JSON):", seconds)
    # A meaningful lake: rows in every table the corpus must fill, gold windows included.
    for name in ("silver/quarantine", "silver/sensor_duplicates", "gold/sensor_stats_1m",
                 "gold/heart_rate_5m", "gold/readings_enriched"):  # fmt: skip
        assert read(spark, lake.table(name)).count() > 0, name


def test_show_travels_in_time_filters_and_prints_bytes_as_hex(
    spark: SparkSession, lake: Lake
) -> None:
    # Every version of a table created empty (ingest) and of one created by its first append
    # (gold): the rows of each as Spark reads them at that version.
    for name in ("bronze/sensors", "gold/sensor_stats_1m"):
        latest = lake_reader(lake).open(SHIPPED.by_name()[name]).version()
        counts = {v: len(shown(lake, name, version=v)) for v in range(latest + 1)}
        assert {v: read(spark, lake.table(name), v).count() for v in counts} == counts
        assert len(set(counts.values())) > 1, f"{name}: versions hold different rows {counts}"

    predicate = "error_code = 'malformed_json' AND kafka_partition >= 0"
    expected = {
        (r.kafka_partition, r.kafka_offset, r.error_code, as_shown(r.value))
        for r in read(spark, lake.table("silver/quarantine"))
        .where(F.col("error_code") == "malformed_json")
        .collect()
    }
    assert expected, "the corpus has malformed records"
    assert expected == {
        (r["kafka_partition"], r["kafka_offset"], r["error_code"], r["value"])
        for r in shown(lake, "silver/quarantine", where=predicate)
    }

    # The command line: a text table of 20 rows by default, CSV with a header.
    table = lake.cli("show", "bronze/sensors")
    assert 0 == table.code, table.err
    assert 2 + 20 + 1 == len(table.out.splitlines())
    assert table.out.splitlines()[-1].startswith("(20 rows shown; more match")
    csv_rows = lake.cli("show", "silver/users", "--format", "csv", "--limit", "0", "--version", "1")
    assert 0 == csv_rows.code, csv_rows.err
    users_v1 = read(spark, lake.table("silver/users"), 1)
    assert [",".join(users_v1.columns)] == csv_rows.out.splitlines()[:1]
    assert users_v1.count() + 1 == len(csv_rows.out.splitlines())


def test_show_refuses_a_missing_table_a_missing_version_and_a_bad_predicate(lake: Lake) -> None:
    nowhere = lake.cli("show", "gold/alerts", INGEST_STORAGE_ROOT="s3a://lakehouse/no-lake-here")
    assert (2, "") == (nowhere.code, nowhere.out)
    assert [
        "lakehouse-ingest show: no Delta table gold/alerts at s3://lakehouse/no-lake-here/gold/alerts"
    ] == nowhere.err.splitlines()

    too_new = lake.cli("show", "bronze/sensors", "--version", "999")
    assert 2 == too_new.code
    assert "bronze/sensors has no version 999" in too_new.err

    bad = lake.cli("show", "bronze/sensors", "--where", "no_such_column = 1")
    assert 2 == bad.code
    assert "no_such_column" in bad.err


def test_reconcile_holds_on_the_lake_and_counts_what_spark_counts(
    spark: SparkSession, lake: Lake
) -> None:
    result = lake.cli("reconcile", "--json")

    assert 0 == result.code, result.out + result.err
    report = json.loads(result.out)
    assert (True, []) == (report["ok"], report["problems"])

    def count(name: str, where: str = "true") -> int:
        return read(spark, lake.table(name)).where(where).count()

    sensors_quarantine = f"kafka_topic = '{lake.sensors_topic}'"
    assert {
        "bronze": count("bronze/sensors"),
        "silver/sensor_readings": count("silver/sensor_readings"),
        "silver/quarantine": count("silver/quarantine", sensors_quarantine),
        "silver/sensor_duplicates": count("silver/sensor_duplicates"),
    } == {"bronze": report["sensors"]["bronze_rows"], **report["sensors"]["landed"]}
    assert READINGS == report["sensors"]["bronze_rows"]
    assert (count("bronze/users"), count("silver/users")) == (
        report["users"]["coverage"]["bronze_rows"],
        report["users"]["silver_rows"],
    )
    assert {g["table"]: count(g["table"]) for g in report["gold"]} == {
        g["table"]: g["rows"] for g in report["gold"]
    }
    assert {(p["topic"], p["partition"]) for p in report["bronze"]} == {
        (topic, partition)
        for topic in (lake.users_topic, lake.sensors_topic)
        for partition in range(3)
    }
    print(f"reconcile: {result.seconds:.2f}s (process), {report['duration_seconds']}s (checks)")

    text = lake.cli("reconcile")
    assert (0, "OK: every invariant holds") == (text.code, text.out.splitlines()[-1])

    # --since: only the records at or after a Kafka timestamp in the middle of the corpus.
    stamps = sorted(r[0] for r in read(spark, lake.table("bronze/sensors")).select(
        "kafka_timestamp").collect())  # fmt: skip
    since = stamps[len(stamps) // 2].isoformat() + "Z"  # the session time zone is UTC
    recent = json.loads(lake.cli("reconcile", "--json", "--since", since).out)
    assert recent["ok"], recent["problems"]
    expected = count("bronze/sensors", f"kafka_timestamp >= '{since.removesuffix('Z')}'")
    assert expected == recent["sensors"]["bronze_rows"] < READINGS


def download_lake(minio: MinioServer, lake: Lake, target: Path) -> Path:
    """A local copy of ``lake``'s tables (no checkpoints)."""
    s3 = minio.s3_client()
    bucket, _, prefix = lake.storage_root.removeprefix("s3a://").partition("/")
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/"):
        for item in page.get("Contents", []):
            relative = item["Key"].removeprefix(f"{prefix}/")
            if relative.startswith("_checkpoints/"):
                continue
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, item["Key"], str(target / relative))
    return target


def append_copy_of_a_row(table: Path, partition: int | None = None) -> dict[str, Any]:
    """Append, with delta-rs, a second copy of one row (of Kafka ``partition``, if given) of the
    Delta table at ``table``; return the row."""
    filters = [("kafka_partition", "=", partition)] if partition is not None else None
    row = DeltaTable(str(table)).to_pyarrow_table(filters=filters).slice(0, 1)
    write_deltalake(str(table), row, mode="append")
    copied: dict[str, Any] = row.to_pylist()[0]
    return copied


def test_reconcile_finds_a_hand_made_gap_and_duplicates(
    lake: Lake, minio_server: MinioServer, tmp_path: Path
) -> None:
    copy = download_lake(minio_server, lake, tmp_path / "lake")
    bronze = DeltaTable(str(copy / "bronze" / "sensors"))
    partition_1 = bronze.to_pyarrow_table(
        columns=["kafka_offset"], filters=[("kafka_partition", "=", 1)]
    )
    offsets = sorted(partition_1.column("kafka_offset").to_pylist())
    first, last = offsets[10], offsets[12]
    bronze.delete(f"kafka_partition = 1 AND kafka_offset BETWEEN {first} AND {last}")
    reading = append_copy_of_a_row(copy / "silver" / "sensor_readings", partition=0)
    window = append_copy_of_a_row(copy / "gold" / "sensor_stats_1m")
    user = append_copy_of_a_row(copy / "silver" / "users")

    result = lake.cli("reconcile", "--json", INGEST_STORAGE_ROOT=str(copy))

    assert 1 == result.code, result.out + result.err
    report = json.loads(result.out)
    assert not report["ok"]
    partition = next(
        p for p in report["bronze"] if (p["table"], p["partition"]) == ("bronze/sensors", 1)
    )
    assert (3, [(first, last, 3)]) == (
        partition["missing_offsets"],
        [(g["first"], g["last"], g["count"]) for g in partition["gaps"]],
    )
    # The deleted records' silver rows are rows bronze lacks; the copied reading landed twice.
    extra = report["sensors"]["extra"]
    assert (3, {(1, o) for o in range(first, last + 1)}) == (
        extra["count"],
        {(r["partition"], o) for r in extra["ranges"] for o in range(r["first"], r["last"] + 1)},
    )
    assert [(reading["kafka_partition"], reading["kafka_offset"], "silver/sensor_readings + "
             "silver/sensor_readings")] == [
        (r["partition"], r["first"], r["tables"]) for r in report["sensors"]["repeated"]["ranges"]
    ]  # fmt: skip
    assert 0 == report["sensors"]["missing"]["count"]
    stats = next(g for g in report["gold"] if g["table"] == "gold/sensor_stats_1m")
    assert (1, 1, window["device_id"]) == (
        stats["duplicate_keys"],
        stats["extra_rows"],
        stats["samples"][0]["device_id"],
    )
    assert ([user["user_id"]], 1) == (
        report["users"]["duplicate_key_samples"],
        report["users"]["duplicate_keys"],
    )
    text = lake.cli("reconcile", INGEST_STORAGE_ROOT=str(copy))
    assert 1 == text.code
    assert f"bronze/sensors {lake.sensors_topic}/1: 3 offsets missing (gaps: {first}-{last})" in (
        text.out
    )


def test_the_drivers_periodic_check_covers_its_increment_and_finds_a_gap_at_its_start(
    lake: Lake, minio_server: MinioServer, tmp_path: Path
) -> None:
    """`service.driver.lake_audit` checks offset increments: rows outside them are not read,
    and a record missing right at an increment's start (the boundary with the previous
    check) is a gap, though no row before it is in the increment."""
    copy = download_lake(minio_server, lake, tmp_path / "lake")
    settings = Settings(
        storage_root=str(copy), users_topic=lake.users_topic, sensors_topic=lake.sensors_topic
    )
    bronze = DeltaTable(str(copy / "bronze" / "sensors"))
    partition_1 = bronze.to_pyarrow_table(
        columns=["kafka_offset"], filters=[("kafka_partition", "=", 1)]
    )
    offsets = sorted(partition_1.column("kafka_offset").to_pylist())
    start, end = offsets[20], offsets[60] + 1
    increment = {lake.sensors_topic: {1: Increment(start, end, expect_start=True)}}

    whole = reconcile(LakeReader.from_settings(settings), settings, None, increment)
    assert [] == whole.problems
    assert end - start == whole.appended("sensors").bronze_rows
    assert 0 == whole.keyed("users").coverage.bronze_rows  # not in the increment
    enriched = DeltaTable(str(copy / "gold" / "readings_enriched")).to_pyarrow_table(
        filters=[
            ("kafka_topic", "=", lake.sensors_topic),
            ("kafka_partition", "=", 1),
            ("kafka_offset", ">=", start),
            ("kafka_offset", "<", end),
        ]
    )
    [checked] = [g for g in whole.gold if g.table == "gold/readings_enriched"]
    assert 0 < enriched.num_rows == checked.rows  # the per-reading gold rows of the increment

    bronze.delete(f"kafka_partition = 1 AND kafka_offset BETWEEN {start} AND {start + 1}")
    broken = reconcile(LakeReader.from_settings(settings), settings, None, increment)

    [partition] = [p for p in broken.bronze if p.topic == lake.sensors_topic]
    assert (2, [(start, start + 1)]) == (
        partition.missing_offsets,
        [(g.first, g.last) for g in partition.gaps],
    )
    assert 2 == broken.appended("sensors").extra.count  # their silver rows, which bronze now lacks
    assert end - start - 2 == broken.appended("sensors").bronze_rows
    assert f"{start}-{start + 1}" in broken.problems[0]


FIXED = {"INGEST_MAX_FUTURE_SECONDS": str(2 * 24 * 3600)}  # readings a day ahead now pass


def test_replay_quarantine_moves_what_now_passes_exactly_once_through_a_kill_9(
    spark: SparkSession, lake: Lake
) -> None:
    """Readings quarantined as a day in the future, replayed once the limit is raised: a
    replay killed right after its plan is resumed by the next run, every record lands in
    silver once, then a dry run would take only what is still quarantined (all of it
    rejected again) and writes nothing, and reconcile holds."""
    quarantine = read(spark, lake.table("silver/quarantine"))
    future = {
        (r.kafka_topic, r.kafka_partition, r.kafka_offset)
        for r in quarantine.where(F.col("error_code") == "event_time_in_future").collect()
    }
    others = quarantine.count() - len(future)
    readings_before = read(spark, lake.table("silver/sensor_readings")).count()
    assert future and others

    killed = lake.service("replay-killed", "replay-quarantine", "--error-code",
                          "event_time_in_future", **FIXED).start()  # fmt: skip
    try:
        killed.wait_for_log('"event": "replay_planned"', timeout=120)
        killed.kill9()
    finally:
        killed.cleanup()
    [planned] = killed.events("replay_planned")

    rerun = lake.cli("replay-quarantine", "--error-code", "event_time_in_future", "--json",
                **FIXED)  # fmt: skip
    assert 0 == rerun.code, rerun.err
    report = json.loads(rerun.out)
    assert [planned["replay_id"]] == report["resumed"] == report["replay_ids"]
    assert ({"event_time_in_future": len(future)}, {"silver": len(future)}) == (
        report["selected"],
        report["outcomes"],
    )

    silver = read(spark, lake.table("silver/sensor_readings"))
    assert readings_before + len(future) == silver.count()
    replayed = silver.join(
        spark.createDataFrame(list(future), "kafka_topic string, kafka_partition int,"
                              " kafka_offset long"),
        ["kafka_topic", "kafka_partition", "kafka_offset"],
    )  # fmt: skip
    assert len(future) == replayed.count() == replayed.select("event_id").distinct().count()
    replays = read(spark, lake.table("silver/quarantine_replays"))
    assert {("planned", len(future)), ("silver", len(future))} == {
        (r.outcome, r["count"]) for r in replays.groupBy("outcome").count().collect()
    }
    assert quarantine.count() == read(spark, lake.table("silver/quarantine")).count()

    dry = lake.cli("replay-quarantine", "--dry-run", "--json", **FIXED)
    assert 0 == dry.code, dry.err
    report = json.loads(dry.out)
    assert (True, others, {"rejected": others}) == (
        report["dry_run"],
        sum(report["selected"].values()),
        report["outcomes"],
    )
    assert "event_time_in_future" not in report["selected"]
    assert 2 * len(future) == read(spark, lake.table("silver/quarantine_replays")).count()
    checked = lake.cli("reconcile", "--json")
    assert 0 == checked.code, checked.out[-3000:]


def test_a_second_replay_moves_nothing_and_gold_picks_up_the_replayed_readings(
    spark: SparkSession, lake: Lake
) -> None:
    """Runs after the replay above: the same replay again selects nothing and leaves silver
    and the replay table as they were; the next driver run's gold queries read the replayed
    readings from silver like any late data, each once in gold/readings_enriched."""
    silver_before = read(spark, lake.table("silver/sensor_readings")).count()
    replays = read(spark, lake.table("silver/quarantine_replays"))
    moved = replays.where(F.col("outcome") == "silver").select(*COORDINATES)
    moved_count, replay_rows = moved.count(), replays.count()
    assert moved_count > 0

    again = lake.cli("replay-quarantine", "--error-code", "event_time_in_future", "--json",
                **FIXED)  # fmt: skip
    assert 0 == again.code, again.err
    report = json.loads(again.out)
    assert ({}, {}, []) == (report["selected"], report["outcomes"], report["resumed"])
    assert silver_before == read(spark, lake.table("silver/sensor_readings")).count()
    assert replay_rows == read(spark, lake.table("silver/quarantine_replays")).count()

    enriched_before = read(spark, lake.table("gold/readings_enriched"))
    assert 0 == enriched_before.join(moved, list(COORDINATES)).count()
    driver = lake.service("gold-after-replay", "run", "--available-now", INGEST_GOLD_ENABLED="true")
    driver.start()
    try:
        assert 0 == driver.wait(timeout=600), driver.log_text()[-4000:]
    finally:
        driver.cleanup()
    enriched = read(spark, lake.table("gold/readings_enriched"))
    in_gold = enriched.join(moved, list(COORDINATES))
    assert moved_count == in_gold.count() == in_gold.select("event_id").distinct().count()
    assert silver_before == enriched.count()
