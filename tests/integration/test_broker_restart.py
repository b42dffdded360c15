"""The Kafka broker stopped and killed while the generator produces and the driver ingests.

A broker of its own (the session's stays up for the other tests), restarted on the same
port and data directory. Ends reconciled by Kafka coordinates: bronze holds every record
the topics hold, once, and silver + quarantine + duplicates = bronze.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest
from devstack import KafkaBroker
from pyspark.sql import SparkSession

from service.ingest.query import IngestQuery
from service.lake.hadoop_fs import HadoopFiles
from service.lake.tables import SHIPPED
from tests.support.lake import Lake, assert_bronze_exactly_once, generator_summary

pytestmark = pytest.mark.integration

OUTAGE_SECONDS = 6
# A Delta checkpoint every few commits (10 by default): the driver's few batches write some.
COMMITS = 2
CHECKPOINTS = {"INGEST_DELTA_CHECKPOINT_COMMITS": str(COMMITS)}


def test_a_broker_stopped_then_killed_under_load_loses_and_doubles_nothing(
    s3_env: dict[str, str], tmp_path: Path, spark: SparkSession
) -> None:
    with KafkaBroker(tmp_path / "kafka") as broker:
        lake = Lake.fresh("broker-restart", broker, s3_env, tmp_path)
        producer = lake.producing(
            "--users", "10", "--rate", "60", "--duration", "50", "--seed", "9",
            "--bad-fraction", "0.05", "--duplicate-fraction", "0.05",
        )  # fmt: skip
        driver = lake.service("driver", "run", **CHECKPOINTS).start()
        try:
            driver.wait_for_log('"event": "batch_written"', timeout=180)
            outages = []
            for stop in (broker.stop, broker.kill):
                time.sleep(5)  # a few batches between the outages
                started = time.monotonic()
                stop()
                time.sleep(OUTAGE_SECONDS)
                broker.start()
                outages.append(time.monotonic() - started)
            summary = generator_summary(producer, timeout=300)
            time.sleep(5)
            driver.terminate()
            code = driver.wait(timeout=180)
        finally:
            producer.kill()
            driver.cleanup()
        # It rode both outages out: a clean stop, no error line.
        assert 0 == code, driver.log_text()[-4000:]
        assert [("ingest_sensors", "info"), ("ingest_users", "info")] == sorted(
            (e["query"], e["level"]) for e in driver.events("query_terminated")
        )  # each query ended once, by the stop
        assert not [
            line
            for line in driver.log_text().splitlines()
            if line.startswith("{") and json.loads(line).get("level") == "error"
        ]
        drain = lake.service("drain", "run", "--available-now", **CHECKPOINTS).start()
        try:
            assert 0 == drain.wait(timeout=600), drain.log_text()[-4000:]
        finally:
            drain.cleanup()
        # The long-running driver keeps silver's recent ids; the drain, which ends once the
        # backlog is read, does not.
        for run, keeps in ((driver, True), (drain, False)):
            phases = [
                e["phases_ms"]
                for e in run.events("batch_written")
                if e["query"] == "ingest_sensors"
            ]
            assert keeps == any("recent_ids" in p for p in phases), phases
        # Every Delta checkpoint is one a driver wrote after a batch (the commits write
        # none), a table's at least COMMITS + its stagger commits apart.
        runs = (driver, drain)
        written = [e for run in runs for e in run.events("delta_checkpoint_written")]
        assert [] == [e for run in runs for e in run.events("delta_checkpoint_failed")]
        for table in IngestQuery(SHIPPED.contracts["sensors"]).tables:
            names = HadoopFiles(spark).list_names(f"{lake.table(table.name)}/_delta_log")
            versions = sorted(e["version"] for e in written if e["table"] == table.name)
            assert sorted(f"{v:020d}.checkpoint.parquet" for v in versions) == sorted(
                n for n in names if n.endswith(".checkpoint.parquet")
            )
            due = COMMITS + table.checkpoint_stagger
            assert all(b - a >= due for a, b in itertools.pairwise([0, *versions])), versions
        # Bronze's is due after its second batch: the driver ran 3 on a slow host, 6 on a quiet one.
        assert "bronze/sensors" in {e["table"] for e in written}

        bronze = assert_bronze_exactly_once(spark, lake)
        # Every record the idempotent producer had acknowledged, none twice.
        assert (0, summary["produced"][lake.sensors_topic]) == (
            summary["delivery_errors"],
            len(bronze),
        )
        code, report = lake.reconcile()
        assert 0 == code, report["problems"]
        assert len(bronze) == report["sensors"]["bronze_rows"]
        # Every table reads whole with delta-rs, Arrow-validated, with the rows reconciled.
        assert len(bronze) == lake.delta_rs_rows()["bronze/sensors"]
        print(f"broker outages {[round(o, 1) for o in outages]} s; {len(bronze)} sensors records")
