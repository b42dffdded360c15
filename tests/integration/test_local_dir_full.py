"""``spark.local.dir`` full: a clear failure, nothing lost, and a resume once space returns.

The driver's local directory is a small tmpfs filled to the last byte (shuffle and
spill files go there); the lake is on MinIO and the topics on Kafka, as always.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.support.lake import Lake, assert_bronze_exactly_once

pytestmark = pytest.mark.integration


@contextlib.contextmanager
def full_tmpfs(path: Path, size_mb: int = 32) -> Iterator[Path]:
    """A tmpfs of ``size_mb`` at ``path`` whose every byte is taken by ``path/ballast``."""
    path.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)], check=True
    )
    try:
        with (path / "ballast").open("wb") as ballast, contextlib.suppress(OSError):
            while True:
                ballast.write(b"\0" * 65536)
                ballast.flush()
        yield path / "ballast"
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def test_a_full_local_dir_stops_the_driver_clearly_and_a_restart_loses_nothing(
    spark: SparkSession, lake: Lake
) -> None:
    produced = json.loads(
        lake.generate(
            "--users", "20", "--readings", "3000", "--seed", "21",
            "--bad-fraction", "0.05", "--duplicate-fraction", "0.05",
        )
    )  # fmt: skip
    assert 0 == produced["delivery_errors"]
    with full_tmpfs(lake.work_dir / "spark-local") as ballast:
        local_dir = str(ballast.parent)
        stuck = lake.service("full", "run", "--available-now", INGEST_SPARK_LOCAL_DIR=local_dir)
        stuck.start()
        try:
            code = stuck.wait(timeout=300)
        finally:
            stuck.cleanup()
        assert 1 == code, stuck.log_text()[-4000:]
        # One line that names the directory and the setting, not a traceback.
        [failed] = stuck.events("failed")
        assert "LocalDiskFullError" == failed["error_class"], failed
        assert f"Spark's local directory {local_dir} has no space left" in failed["error"]
        assert [] == stuck.events("crashed")

        ballast.unlink()  # the space returns
        resumed = lake.service(
            "resumed", "run", "--available-now", INGEST_SPARK_LOCAL_DIR=local_dir
        ).start()
        try:
            assert 0 == resumed.wait(timeout=300), resumed.log_text()[-4000:]
        finally:
            resumed.cleanup()

    assert_bronze_exactly_once(spark, lake)
    code, report = lake.reconcile()
    assert 0 == code, report
    tables = lake.delta_rs_rows()
    categories = produced["by_category"]
    assert categories["sensors.bad"] == tables["silver/quarantine"]
    assert categories["sensors.duplicate"] == tables["silver/sensor_duplicates"]
