"""Gold tables via real Kafka and a real S3 server: oracles, late events, bounded state, kill -9.

Wave 1 is an hour of event time, every device reporting every few seconds, shuffled
within 2-minute blocks: out of order, but never by more than the 10-minute
watermark, so no wave-1 reading is late however it falls into micro-batches. It is
ingested once; two lakes then hold the same silver. In ``reference`` the gold
queries run without interruption; in ``crashed`` the driver is killed with SIGKILL
three times while a stateful gold query has a micro-batch in flight, and restarted.
Wave 2 (reference only) adds readings far behind the watermark (dropped by the
windows and the join, kept in silver), a device whose only readings are late,
readings that advance the watermark, and a user deletion."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from confluent_kafka import Producer
from delta.tables import DeltaTable
from devstack import MinioServer
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from service.gold.transforms import (
    alerts,
    enrich_readings,
    heart_rate_stats,
    heart_rate_with_activity,
    sensor_stats,
)
from service.lake.hadoop_fs import HadoopFiles
from tests.support.gold import final_watermark
from tests.support.kafka import topic_records
from tests.support.lake import Lake, LakeFactory, copy_storage_root
from tests.support.service_process import ServiceProcess

pytestmark = pytest.mark.integration

MINUTES = 60


def _base() -> datetime:
    """Event time zero: 90 minutes ago, moved back so that the test's hour of event time
    stays within one UTC day (one silver partition, so one file per silver version)."""
    base = (datetime.now(UTC) - timedelta(minutes=90)).replace(second=0, microsecond=0)
    span = timedelta(minutes=MINUTES + 11)  # wave 1, then wave 2's fresh readings
    if (base + span).date() != base.date():
        base = datetime.combine((base + span).date(), datetime.min.time(), UTC) - span
    return base


BASE = _base()
USERS = 12  # user 12 never gets a profile
KINDS = ("heart_rate", "accelerometer", "temperature")
DEVICES = USERS * len(KINDS) + 1  # and one anonymous heart-rate device
WATERMARK = timedelta(minutes=10)
TOLERANCE = timedelta(seconds=30)
# A reading is produced at most this far (in event time) after a later one: the
# shuffle block, plus the spread of Kafka partitions within one ingest batch.
DISORDER = timedelta(minutes=3)
ENV = {
    "INGEST_GOLD_ENABLED": "true",
    # 5 ingest batches (silver versions) of about 12 minutes of event time for wave 1, and
    # one version per gold batch (one file: a batch of that size is written in one task,
    # `service.ingest.writer.ONE_TASK_OFFSETS`).
    "INGEST_KAFKA_MAX_OFFSETS_PER_TRIGGER": "1470",
    "INGEST_GOLD_MAX_FILES_PER_TRIGGER": "1",
}
STATEFUL = ("gold_sensor_stats_1m", "gold_heart_rate_5m", "gold_heart_rate_activity")
TABLES = {
    "gold/sensor_stats_1m": ["window_start", "device_id", "sensor_type"],
    "gold/heart_rate_5m": ["window_start", "user_id"],
    "gold/readings_enriched": ["event_id"],
    "gold/heart_rate_activity": ["hr_event_id", "acc_event_id"],
    "gold/alerts": ["event_id"],
}
# Sums in a different order (other micro-batch boundaries) may differ in the last bits.
FLOAT_AGGREGATES = {"avg", "stddev", "avg_bpm"}

Record = tuple[str, Mapping[str, Any] | None]


def iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def naive(moment: datetime) -> datetime:
    """``moment`` as Spark returns a UTC timestamp (session time zone UTC)."""
    return moment.astimezone(UTC).replace(tzinfo=None)


def reading(
    rng: random.Random, event_id: str, user_id: int | None, kind: str, at: datetime
) -> dict[str, Any]:
    """A random plausible ``kind`` reading of ``user_id``'s device at ``at``: workload, not the
    fixed valid payload of `tests.payloads.reading`; an anonymous device keeps an explicit
    null ``user_id``, which the oracles read back."""
    record: dict[str, Any] = {
        "event_id": event_id,
        "device_id": f"dev-{user_id or 'anon'}-{kind[:4]}",
        "user_id": user_id,
        "sensor_type": kind,
        "event_time": iso(at),
    }
    if kind == "heart_rate":
        record["value"] = round(rng.uniform(50, 200), 1)
    elif kind == "temperature":
        record["value"] = round(rng.uniform(35, 40), 2)
        record["danger_level"] = "HIGH" if record["value"] > 39.5 else "LOW"
    else:
        record.update({c: round(rng.gauss(0, 3), 3) for c in "xyz"})
        record["activity"] = rng.choice(("walk", "sit", "bike"))
    return record


def wave1(rng: random.Random) -> list[dict[str, Any]]:
    """Every user's heart rate and accelerometer every 15 s, temperature every 30 s, and an
    anonymous heart-rate device every 30 s, shuffled within 2-minute blocks."""
    readings: list[dict[str, Any]] = []
    for slot in range(0, MINUTES * 60, 15):
        kinds = KINDS if slot % 30 == 0 else KINDS[:2]
        for user in range(1, USERS + 1):
            for kind in kinds:
                at = BASE + timedelta(seconds=slot + rng.uniform(0, 15))
                readings.append(reading(rng, f"r{len(readings)}", user, kind, at))
        if slot % 30 == 0:
            at = BASE + timedelta(seconds=slot + rng.uniform(0, 15))
            readings.append(reading(rng, f"r{len(readings)}", None, "heart_rate", at))
    readings.sort(key=lambda r: r["event_time"])
    blocks: dict[int, list[dict[str, Any]]] = {}
    for r in readings:
        blocks.setdefault((parse(r["event_time"]) - BASE) // timedelta(minutes=2), []).append(r)
    return [r for _, block in sorted(blocks.items()) for r in rng.sample(block, len(block))]


def produce(bootstrap_servers: str, topic: str, records: Sequence[Record]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap_servers})
    for key, value in records:
        producer.produce(topic, key=key, value=None if value is None else json.dumps(value))
    assert 0 == producer.flush(30)


@dataclass(frozen=True)
class GoldRuns:
    """What the module's runs produced, for the tests to check."""

    reference: Lake
    crashed: Lake
    readings: list[dict[str, Any]]  # wave 1
    late: list[dict[str, Any]]  # wave 2, behind the watermark (incl. the ghost device's)
    fresh: list[dict[str, Any]]  # wave 2, ahead of it
    progress: dict[str, list[dict[str, Any]]]  # reference's query_progress lines per run
    written: list[dict[str, Any]]  # reference's batch_written lines of wave 1
    wave1_versions: dict[str, int]  # reference's gold table versions after wave 1
    in_flight_at_kill: list[tuple[str, int]]  # (stateful query, uncommitted batch) per kill


def run_available_now(lake: Lake, name: str, **env: str) -> ServiceProcess:
    driver = lake.service(name, "run", "--available-now", **{**ENV, **env}).start()
    try:
        assert 0 == driver.wait(timeout=900), driver.log_text()[-4000:]
    finally:
        driver.cleanup()
    return driver


def batch_ids(files: HadoopFiles, uri: str) -> set[int]:
    return {int(n) for n in files.list_names(uri) if n.isdigit()}


def kill_during_batch(
    driver: ServiceProcess, files: HadoopFiles, lake: Lake, query: str, rng: random.Random
) -> int:
    """Once ``query`` committed a batch in this run, SIGKILL the driver while its next
    batch is planned but not committed; return that batch's id."""
    checkpoint = f"{lake.storage_root}/_checkpoints/{query}"
    committed_before = batch_ids(files, f"{checkpoint}/commits")
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        assert driver.alive(), driver.log_text()[-4000:]
        commits = batch_ids(files, f"{checkpoint}/commits")
        pending = batch_ids(files, f"{checkpoint}/offsets") - commits
        if commits - committed_before and pending:
            time.sleep(rng.uniform(0.0, 1.0))  # somewhere inside the batch
            driver.kill9()
            return max(pending)
        time.sleep(0.2)
    raise AssertionError(f"{query} never had a batch in flight:\n{driver.log_text()[-4000:]}")


def kill_after_table_commit(files: HadoopFiles, lake: Lake, query: str) -> int:
    """SIGKILL a driver once ``query``'s table holds a batch its checkpoint has not committed
    (`tests.support.crash_at`); return that batch's id. The restart replays a batch its
    table holds: the query must run it again for its state stores, writing nothing."""
    lake.killed_at("crash-checkpoint", f"checkpoint:{query}", ENV, timeout=600)
    checkpoint = f"{lake.storage_root}/_checkpoints/{query}"
    pending = batch_ids(files, f"{checkpoint}/offsets") - batch_ids(files, f"{checkpoint}/commits")
    return max(pending)


def table_versions(spark: SparkSession, lake: Lake) -> dict[str, int]:
    versions = {}
    for name in TABLES:
        latest = DeltaTable.forPath(spark, lake.table(name)).history(1).first()
        assert latest is not None
        versions[name] = int(latest["version"])
    return versions


@pytest.fixture(scope="module")
def runs(
    make_lake: LakeFactory,
    minio_server: MinioServer,
    spark: SparkSession,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GoldRuns]:
    reference = make_lake("gold-reference")
    crashed = reference.at_new_root("gold-crashed", tmp_path_factory.mktemp("crashed"))
    servers = reference.bootstrap_servers
    rng = random.Random(5)
    profiles: list[Record] = [
        (str(u), {"user_id": u, "dob": f"19{50 + u}-03-04", "gender": "F", "country": "FR",
                  "updated_at": iso(BASE)})
        for u in range(1, USERS)
    ]  # fmt: skip
    produce(servers, reference.users_topic, profiles)
    readings = wave1(rng)
    produce(servers, reference.sensors_topic, [(f"k{r['event_id']}", r) for r in readings])

    # Ingested once: the crashed lake starts with the reference's silver, and no gold.
    first = run_available_now(reference, "wave1")
    progress = {"wave1": first.events("query_progress")}
    written = first.events("batch_written")
    wave1_versions = table_versions(spark, reference)
    copy_storage_root(
        minio_server.s3_client(), reference, crashed, skip=("gold/", "_checkpoints/gold_")
    )

    files = HadoopFiles(spark)
    in_flight = []
    for attempt, query in enumerate(STATEFUL[:-1]):
        driver = crashed.service(f"crash-{attempt}", "run", **ENV).start()
        try:
            in_flight.append((query, kill_during_batch(driver, files, crashed, query, rng)))
        finally:
            driver.cleanup()
    in_flight.append((STATEFUL[-1], kill_after_table_commit(files, crashed, STATEFUL[-1])))
    after = run_available_now(crashed, "after-crashes")
    # The join's batch its table held ran again (Spark 4.2 checks its state stores commit).
    replayed = [(e["table"], e["batch_id"]) for e in after.events("batch_already_in_table")]
    assert ("gold/heart_rate_activity", in_flight[-1][1]) in replayed, replayed

    late = [
        reading(rng, f"late{i}", rng.randint(1, USERS), rng.choice(KINDS),
                BASE + timedelta(seconds=rng.uniform(0, 600)))
        for i in range(60)
    ] + [
        reading(rng, f"ghost{i}", None, "temperature", BASE + timedelta(seconds=61 + 10 * i))
        for i in range(5)
    ]  # fmt: skip
    fresh = [
        reading(rng, f"new{i}", rng.randint(1, USERS), rng.choice(KINDS),
                BASE + timedelta(seconds=MINUTES * 60 + 15 * i))
        for i in range(40)
    ]  # fmt: skip
    produce(servers, reference.sensors_topic, [(r["event_id"], r) for r in late + fresh])
    produce(servers, reference.users_topic, [("3", None)])  # user 3 deleted from now on
    progress["wave2"] = run_available_now(reference, "wave2").events("query_progress")
    yield GoldRuns(
        reference, crashed, readings, late, fresh, progress, written, wave1_versions, in_flight
    )


def table(spark: SparkSession, lake: Lake, name: str) -> DataFrame:
    return spark.read.format("delta").load(lake.table(name))


def rows(df: DataFrame, key: list[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {tuple(r[k] for k in key): r.asDict() for r in df.collect()}


def assert_close(
    expected: dict[str, Any], actual: dict[str, Any], exact: list[str], rel: list[str]
) -> None:
    for column in exact:
        assert expected[column] == actual[column], column
    for column in rel:
        e, a = expected[column], actual[column]
        assert (e is None and a is None) or a == pytest.approx(e, rel=1e-9, abs=1e-12), column


def on_time_silver(spark: SparkSession, runs: GoldRuns) -> tuple[DataFrame, DataFrame]:
    """silver/sensor_readings of the reference lake, all and without wave 2's late readings."""
    silver = table(spark, runs.reference, "silver/sensor_readings")
    late_ids = [r["event_id"] for r in runs.late]
    return silver, silver.where(~F.col("event_id").isin(late_ids))


def test_windows_equal_their_batch_oracle_once_and_all_closed_ones(
    spark: SparkSession, runs: GoldRuns
) -> None:
    silver, on_time = on_time_silver(spark, runs)
    assert len(runs.readings) + len(runs.late) + len(runs.fresh) == silver.count()

    # 1-minute stats: exactly the oracle's windows that the final watermark closed, once each.
    gold = table(spark, runs.reference, "gold/sensor_stats_1m")
    key = TABLES["gold/sensor_stats_1m"]
    assert gold.count() == gold.select(*key).distinct().count()
    oracle = rows(sensor_stats(on_time, "1 minute", "10 minutes"), key)
    closed = final_watermark(on_time, WATERMARK)
    emitted = rows(gold, key)
    assert set(emitted) == {k for k, v in oracle.items() if v["window_end"] <= closed}
    assert len(emitted) > DEVICES * (MINUTES - 11)
    for k, actual in emitted.items():
        assert_close(oracle[k], actual, ["window_end", "count", "min", "max"], ["avg", "stddev"])

    # 5-minute sliding heart-rate windows; p95 with the same percentile_approx accuracy
    # (exact here: far fewer values per window than the accuracy).
    gold_hr = table(spark, runs.reference, "gold/heart_rate_5m")
    key = TABLES["gold/heart_rate_5m"]
    assert gold_hr.count() == gold_hr.select(*key).distinct().count()
    oracle = rows(heart_rate_stats(on_time, "5 minutes", "1 minute", "10 minutes"), key)
    closed = final_watermark(
        on_time.where("sensor_type = 'heart_rate' AND user_id IS NOT NULL"), WATERMARK
    )
    emitted = rows(gold_hr, key)
    assert set(emitted) == {k for k, v in oracle.items() if v["window_end"] <= closed}
    for k, actual in emitted.items():
        assert_close(oracle[k], actual, ["count", "min_bpm", "max_bpm", "p95_bpm"], ["avg_bpm"])


def test_late_events_are_dropped_counted_and_their_windows_absent(
    spark: SparkSession, runs: GoldRuns
) -> None:
    silver, _ = on_time_silver(spark, runs)
    late_ids = {r["event_id"] for r in runs.late}
    assert late_ids <= {r.event_id for r in silver.select("event_id").collect()}
    enriched = table(spark, runs.reference, "gold/readings_enriched")
    assert len(late_ids) == enriched.where(F.col("event_id").isin(list(late_ids))).count()

    # The ghost device's windows held only late readings: absent.
    ghost = table(spark, runs.reference, "gold/sensor_stats_1m").where(
        "device_id = 'dev-anon-temp'"
    )
    assert 0 == ghost.count()

    # Dropped rows as the stateful operators count them, in wave 2's micro-batch(es): input
    # rows for the join, groups (after partial aggregation) for the window aggregates.
    dropped = {
        query: sum(p["dropped_by_watermark"] for p in runs.progress["wave2"] if p["query"] == query)
        for query in STATEFUL
    }
    late = spark.createDataFrame(
        [(r["device_id"], r["user_id"], r["sensor_type"], naive(parse(r["event_time"])))
         for r in runs.late],
        "device_id string, user_id int, sensor_type string, event_time timestamp",
    )  # fmt: skip
    late_groups = late.select(F.window("event_time", "1 minute"), "device_id", "sensor_type")
    late_hr = late.where("sensor_type = 'heart_rate' AND user_id IS NOT NULL")
    late_hr_groups = late_hr.select(F.window("event_time", "5 minutes", "1 minute"), "user_id")
    # The join's input rows: an accelerometer reading enters it once per minute bucket its
    # ±30 s reaches, always two.
    late_acc = late.where("sensor_type = 'accelerometer' AND user_id IS NOT NULL")
    assert dropped == {
        "gold_sensor_stats_1m": late_groups.distinct().count(),
        "gold_heart_rate_5m": late_hr_groups.distinct().count(),
        "gold_heart_rate_activity": late_hr.count() + 2 * late_acc.count(),
    }
    assert late_acc.count() > 0
    assert 0 == sum(p["dropped_by_watermark"] for p in runs.progress["wave1"])


def test_joins_equal_their_batch_equivalents(spark: SparkSession, runs: GoldRuns) -> None:
    silver, on_time = on_time_silver(spark, runs)

    # Stream-static enrichment: each row equals the batch join with the users snapshot
    # (version) its micro-batch saw.
    enriched = table(spark, runs.reference, "gold/readings_enriched")
    total = silver.count()
    assert total == enriched.count() == enriched.select("event_id").distinct().count()
    columns = ["event_id", "user_known", "age", "age_band", "gender", "country"]
    versions = [v for (v,) in enriched.select("users_version").distinct().collect()]
    for version in versions:
        snapshot = (
            spark.read.format("delta")
            .option("versionAsOf", version)
            .load(runs.reference.table("silver/users"))
        )
        seen = enriched.where(F.col("users_version") == version)
        ids = [r.event_id for r in seen.select("event_id").collect()]
        expected = enrich_readings(silver.where(F.col("event_id").isin(ids)), snapshot)
        assert rows(expected.select(*columns), ["event_id"]) == rows(
            seen.select(*columns), ["event_id"]
        )
    assert len(versions) >= 2  # the deletion of user 3 is a later snapshot
    assert enriched.where("user_id = 3 AND NOT user_known").count() > 0
    assert enriched.where("user_id = 3 AND user_known").count() > 0
    assert enriched.where("user_id = 12 AND user_known").count() == 0

    # Stream-stream join (minute-keyed state): every ±30 s pair of on-time readings, once;
    # the oracle is the batch join keyed by user alone.
    pairs = table(spark, runs.reference, "gold/heart_rate_activity")
    key = TABLES["gold/heart_rate_activity"]
    oracle = heart_rate_with_activity(on_time, "10 minutes", 30, bucketed=False)
    oracle_pairs = rows(oracle, key)
    assert set(oracle_pairs) == set(rows(pairs, key))
    assert pairs.count() == len(oracle_pairs) > 0


def test_alerts_once_in_delta_and_at_least_once_on_kafka(
    spark: SparkSession, runs: GoldRuns
) -> None:
    silver, _ = on_time_silver(spark, runs)
    found = table(spark, runs.reference, "gold/alerts")
    expected_ids = {r.event_id for r in alerts(silver, 180.0).collect()}
    assert expected_ids == {r.event_id for r in found.collect()}
    assert found.count() == len(expected_ids) > 0
    published = topic_records(runs.reference.bootstrap_servers, runs.reference.alerts_topic)
    assert expected_ids == {r.key.decode() for r in published if r.key is not None}
    assert {json.loads(r.value)["event_id"] for r in published if r.value} == expected_ids


def test_each_gold_batch_logs_its_write_and_the_delta_commit_within_it(runs: GoldRuns) -> None:
    extra = {"gold_readings_enriched": {"per_batch"}, "gold_alerts": {"after_write"}}
    for table in TABLES:
        query = "gold_" + table.removeprefix("gold/")
        lines = [e for e in runs.written if e["query"] == query]
        assert list(range(len(lines))) == [e["batch_id"] for e in lines] != [], query
        for line in lines:
            phases = line["phases_ms"]
            # Batch 0 creates the table through Delta's writer: no commit of its own.
            commit = {f"{table}:commit"} if line["batch_id"] else set()
            assert {table} | commit | extra.get(query, set()) == set(phases), line
            assert line["duration_ms"] >= phases[table] >= phases.get(f"{table}:commit", 0), line
            assert line["spark_jobs"] >= 1 and line["waited_for_ingest_ms"] >= 0, line


def window_starts(after: datetime, until: datetime, size: timedelta, slide: timedelta) -> int:
    """How many (``size``, every ``slide``) windows holding wave-1 time end after ``after``
    and start at or before ``until``."""
    first = BASE - size + slide
    starts = (first + slide * i for i in range(int((until - first) / slide) + 1))
    return sum(1 for s in starts if s <= until and s + size > after)


def state_bounds(
    query: str, readings: list[dict[str, Any]], watermark: datetime, seen_max: datetime
) -> tuple[int, int]:
    """Bounds on a stateful operator's rows after a batch with ``watermark`` that saw events
    up to ``seen_max``: it holds exactly the seen groups (rows, for the join) that the
    watermark has not passed, and every reading up to ``seen_max - DISORDER`` was seen."""
    seen_all = seen_max - DISORDER
    if query in ("gold_sensor_stats_1m", "gold_heart_rate_5m"):
        keys, size, slide = (
            (DEVICES, timedelta(minutes=1), timedelta(minutes=1))
            if query == "gold_sensor_stats_1m"
            else (USERS, timedelta(minutes=5), timedelta(minutes=1))
        )
        lower = window_starts(watermark, seen_all - size, size, slide)
        return keys * lower, keys * window_starts(watermark, seen_max, size, slide)
    # The join's rows: a heart-rate reading once, an accelerometer reading once per
    # minute bucket its ±30 s reaches (always two).
    times = [
        (parse(r["event_time"]), 1 if r["sensor_type"] == "heart_rate" else 2)
        for r in readings
        if r["user_id"] is not None and r["sensor_type"] in ("heart_rate", "accelerometer")
    ]
    slack = timedelta(seconds=1)
    upper = sum(n for t, n in times if watermark - TOLERANCE - slack < t <= seen_max)
    return sum(n for t, n in times if watermark - TOLERANCE + slack < t <= seen_all), upper


def test_state_stays_bounded_once_the_watermark_advances(runs: GoldRuns) -> None:
    """Over 60 minutes of event time, in the uninterrupted run: after every batch, each
    stateful operator holds only what the watermark keeps (a band whose width does not grow
    with time), so its state rows stop growing; RocksDB reports the memory it uses."""
    for query in STATEFUL:
        batches = sorted(
            (p for p in runs.progress["wave1"] if p["query"] == query),
            key=lambda p: p["batch_id"],
        )
        seen_max = BASE - timedelta(days=1)
        steady = []
        for batch in batches:
            if batch["event_time_max"]:
                seen_max = max(seen_max, parse(batch["event_time_max"]))
            watermark = parse(batch["watermark"])
            lower, upper = state_bounds(query, runs.readings, watermark, seen_max)
            assert lower <= batch["state_rows"] <= upper, (query, batch["batch_id"], lower, upper)
            assert batch["state_memory_bytes"] > 0
            if watermark >= BASE + WATERMARK:  # past the first watermark interval
                steady.append(batch["state_rows"])
        assert len(steady) >= 4, (query, len(batches))


def sorted_rows(df: DataFrame, key: list[str]) -> list[dict[str, Any]]:
    return sorted((r.asDict() for r in df.collect()), key=lambda r: tuple(r[k] for k in key))


def test_gold_tables_after_three_kill_9_equal_the_uninterrupted_run(
    spark: SparkSession, runs: GoldRuns
) -> None:
    """The crashed lake's gold tables, rebuilt from the same silver through three SIGKILLs
    that each hit a stateful query mid-batch, equal the reference's after wave 1."""
    assert [q for q, _ in runs.in_flight_at_kill] == list(STATEFUL)
    for name, key in TABLES.items():
        uninterrupted = (
            spark.read.format("delta")
            .option("versionAsOf", runs.wave1_versions[name])
            .load(runs.reference.table(name))
        )
        expected = sorted_rows(uninterrupted.drop("users_version"), key)
        actual = sorted_rows(table(spark, runs.crashed, name).drop("users_version"), key)
        assert len(expected) == len(actual) > 0, name
        for want, got in zip(expected, actual, strict=True):
            for column, value in want.items():
                if column in FLOAT_AGGREGATES and value is not None:
                    assert got[column] == pytest.approx(value, rel=1e-12), (name, column)
                else:
                    assert got[column] == value, (name, column, [want[k] for k in key])
