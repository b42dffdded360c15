"""The graceful stop's deadline: a batch still running when it passes is interrupted."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

from pyspark.sql import DataFrame, SparkSession

from service.driver.running import RunningQuery, _running, stop_gracefully
from service.streaming.queries import QueryWriter


def test_a_batch_still_running_at_the_deadline_is_interrupted(
    spark: SparkSession, tmp_path: Path
) -> None:
    writer = QueryWriter("slow", fence=lambda: None)
    writing = threading.Event()

    def endless(batch: DataFrame, batch_id: int) -> None:
        with writer.writing(batch_id):
            writing.set()
            batch.sparkSession.range(10**13).selectExpr("max(id)").collect()

    handle = (
        spark.readStream.format("rate")
        .load()
        .writeStream.foreachBatch(endless)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        assert writing.wait(60)
        query = RunningQuery(SimpleNamespace(name="slow"), handle, writer)  # type: ignore[arg-type]
        started = time.monotonic()
        stop_gracefully([query], timeout=2.0)

        assert not _running(handle)
        assert time.monotonic() - started < 30
    finally:
        handle.stop()
