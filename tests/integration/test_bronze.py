"""Driver lifecycle against real Kafka and a real S3 server: stops, refusals, single writer.

Exactly-once through repeated kill -9 is `test_reconciliation.py`.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
from devstack import MinioServer
from pyspark.sql import SparkSession

from service.config import Settings
from service.lake.lease import lease_location
from service.lake.lease_store import S3LeaseStore
from service.lake.schemas import BRONZE
from service.streaming.session import cds_archive
from tests.support.lake import (
    Lake,
    LakeFactory,
    assert_bronze_exactly_once,
    copy_storage_root,
    table_coordinates,
)
from tests.support.service_process import ServiceProcess

pytestmark = pytest.mark.integration

EXIT_REFUSED = 3


# SIGTERM to the whole process group reaches the Spark JVM too, which must leave the stop
# to the driver (a SIGTERM to the driver alone, as Kubernetes sends it, is the lesser case).
# Ctrl-C in a terminal sends SIGINT to the group. One lake: the second driver resumes
# where the first stopped, and is stopped the other way.
def test_a_stop_under_load_finishes_the_batches_in_flight_starts_none_and_logs_no_error(
    spark: SparkSession, lake: Lake
) -> None:
    lake.generate("--users", "2000", "--readings", "20000", "--seed", "3")
    for stop in ("sigterm-group", "ctrl-c"):
        driver = lake.service(stop, INGEST_KAFKA_MAX_OFFSETS_PER_TRIGGER="5000").start()
        try:
            driver.wait_for_log('"event": "batch_written"', timeout=180)
            if stop == "sigterm-group":
                driver.terminate_group()  # Python and the Spark JVM, as timeout or systemd do
            else:
                driver.interrupt_group()  # Python and the Spark JVM, as a terminal does
            assert driver.wait(timeout=120) == 0, driver.log_text()[-4000:]
        finally:
            driver.cleanup()
        _assert_stopped_after_the_batches_in_flight(driver, stop)
    rerun = lake.service("after-stops", "run", "--available-now").start()
    try:
        assert rerun.wait(timeout=300) == 0, rerun.log_text()[-4000:]
    finally:
        rerun.cleanup()
    assert_bronze_exactly_once(spark, lake)


def _assert_stopped_after_the_batches_in_flight(driver: ServiceProcess, stop: str) -> None:
    log = driver.log_text()
    assert "Traceback" not in log, stop
    errors = [e for e in _json_lines(log) if e.get("level") in ("error", "critical", "fatal")]
    assert [] == errors, stop
    [stopping] = driver.events("stopping")
    after_stop = log[log.index('"event": "stopping"') :]
    written = [e for e in _json_lines(after_stop) if e.get("event") == "batch_written"]
    for query in {"ingest_users", "ingest_sensors"}:
        batches = [e["batch_id"] for e in written if e["query"] == query]
        # At most the batch already begun; the one being written when the stop came.
        assert len(batches) <= 1, (stop, query, batches)
        if query in stopping["in_flight"]:
            assert batches == [stopping["in_flight"][query]], stop
    stopped = {e["query"] for e in driver.events("query_stopped")}
    assert {"ingest_users", "ingest_sensors"} <= stopped, stop
    assert [] == driver.events("stop_timeout"), stop
    assert [] != [e for e in driver.events("stopped") if e["reason"] == "signal"], stop


def _json_lines(text: str) -> list[dict[str, Any]]:
    lines = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            parsed = json.loads(line)
            if isinstance(parsed, dict):
                lines.append(parsed)
    return lines


def run_to_completion(lake: Lake, name: str) -> None:
    driver = lake.service(name, "run", "--available-now").start()
    try:
        assert driver.wait(timeout=300) == 0, driver.log_text()[-4000:]
    finally:
        driver.cleanup()


def delete_prefix(lake: Lake, s3_client: object, table: str) -> None:
    bucket, _, prefix = lake.table(table).removeprefix("s3a://").partition("/")
    listing = s3_client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")  # type: ignore[attr-defined]
    for obj in listing.get("Contents", []):
        s3_client.delete_object(Bucket=bucket, Key=obj["Key"])  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def ingested(make_lake: LakeFactory) -> Lake:
    """A lake that ingested 500 readings to completion; each test below damages a copy."""
    lake = make_lake("ingested")
    lake.generate("--users", "50", "--readings", "500", "--seed", "1")
    run_to_completion(lake, "first")
    return lake


@pytest.fixture
def ingested_copy(
    ingested: Lake, minio_server: MinioServer, request: pytest.FixtureRequest, tmp_path: Path
) -> Lake:
    """`ingested` at a storage root of this test's own (same topics)."""
    copy = ingested.at_new_root(request.node.name, tmp_path)
    copy_storage_root(minio_server.s3_client(), ingested, copy)
    return copy


@pytest.mark.parametrize("recreate", [False, True], ids=["deleted", "recreated-empty"])
def test_restart_refuses_a_checkpoint_whose_table_was_deleted_or_replaced(
    spark: SparkSession, ingested_copy: Lake, minio_server: MinioServer, recreate: bool
) -> None:
    lake = ingested_copy
    delete_prefix(lake, minio_server.s3_client(), "bronze/sensors")
    if recreate:
        spark.createDataFrame([], BRONZE).write.format("delta").save(lake.table("bronze/sensors"))
    restart = lake.service("restart", "run", "--available-now").start()
    try:
        assert restart.wait(timeout=180) == EXIT_REFUSED, restart.log_text()[-4000:]
    finally:
        restart.cleanup()
    log = restart.log_text()
    assert '"event": "refusing_to_start"' in log
    assert "bronze/sensors" in log
    assert "was deleted or replaced after the checkpoint was written" in log


def test_a_new_or_a_corrupt_checkpoint_over_existing_tables_is_refused(
    spark: SparkSession, ingested_copy: Lake, minio_server: MinioServer
) -> None:
    lake = ingested_copy
    other_checkpoints = f"{lake.storage_root}/_other_checkpoints"
    restart = lake.service(
        "new-checkpoint", "run", "--available-now", INGEST_CHECKPOINT_ROOT=other_checkpoints
    ).start()
    try:
        assert restart.wait(timeout=180) == EXIT_REFUSED, restart.log_text()[-4000:]
    finally:
        restart.cleanup()
    assert "already holds batches written under another checkpoint" in restart.log_text()
    landed, rows = table_coordinates(spark, lake.table("bronze/sensors"))
    assert len(landed) == rows == 500

    # The original checkpoint's last commit file truncated (a torn copy, a bad restore).
    s3 = minio_server.s3_client()
    bucket, _, root = lake.storage_root.removeprefix("s3a://").partition("/")
    commits = f"{root}/_checkpoints/ingest_sensors/commits/"
    listing = s3.list_objects_v2(Bucket=bucket, Prefix=commits)["Contents"]
    batches = [int(n) for o in listing if (n := o["Key"].removeprefix(commits)).isdigit()]
    last = f"{commits}{max(batches)}"
    s3.put_object(Bucket=bucket, Key=last, Body=b"v1\n")
    corrupt = lake.service("corrupt-checkpoint", "run", "--available-now").start()
    try:
        assert corrupt.wait(timeout=180) == EXIT_REFUSED, corrupt.log_text()[-4000:]
    finally:
        corrupt.cleanup()
    assert f"checkpoint file s3a://{bucket}/{last} is truncated or corrupt" in corrupt.log_text()
    assert "docs/runbooks/CheckpointCorrupt.md" in corrupt.log_text()


def test_a_driver_starts_from_the_cds_archive_and_a_second_one_on_its_storage_root_is_refused(
    lake: Lake,
) -> None:
    archive = cds_archive(Settings())
    assert archive is not None, "make setup builds it into the virtualenv (make cds)"
    first = lake.service("first").start()
    second = lake.service("second")
    try:
        first.wait_for_log('"event": "running"', timeout=120)
        assert str(archive) in first.jvm_mapped_files(), "the JVM did not map the archive"
        second.start()
        assert second.wait(timeout=120) == EXIT_REFUSED, second.log_text()[-4000:]
        assert "another driver is running on this storage root" in second.log_text()
        assert f"pid {first.pid}" in second.log_text()
        assert first.alive()
        first.terminate()
        assert first.wait(timeout=120) == 0, first.log_text()[-4000:]
        assert "[cds" not in first.log_text(), "the JVM's own CDS lines stay off stdout"
    finally:
        first.cleanup()
        second.cleanup()


def test_a_driver_whose_lease_was_taken_is_fenced_before_its_next_write_and_exits_1(
    lake: Lake,
) -> None:
    # Renewal far apart, so the write's fence, not the renewal, finds the lease gone.
    driver = lake.service(
        "fenced", INGEST_LEASE_TTL_SECONDS="240", INGEST_LEASE_RENEW_SECONDS="120"
    ).start()
    try:
        driver.wait_for_log('"event": "running"', timeout=120)
        store = S3LeaseStore(
            Settings.model_validate(lake.s3_env),
            lease_location(f"{lake.storage_root}/_checkpoints"),
        )
        found = store.read()
        assert found is not None
        usurper = {"owner": "other", "host": "elsewhere", "pid": 1, "started_at": 0.0}
        assert store.replace(json.dumps({**usurper, "heartbeat_at": time.time()}), found[1])
        lake.generate("--users", "3", "--readings", "20", "--seed", "5")

        assert driver.wait(timeout=120) == 1, driver.log_text()[-4000:]
        assert "no longer held by this driver" in driver.log_text()
        assert '"owner": "other"' in (store.read() or ("", ""))[0], "the lease stays the usurper's"
    finally:
        driver.cleanup()
