"""The graceful stop: a batch planned while it began is written in full; a query asleep
until its next trigger is stopped in that sleep; a batch still running at the deadline
is interrupted."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery
from structlog.testing import capture_logs

from service.driver.running import RunningQuery, _running, stop_gracefully
from service.streaming.runner import QueryWriter


def _rate_query(
    spark: SparkSession, write: Callable[[DataFrame, int], None], tmp_path: Path, **trigger: Any
) -> StreamingQuery:
    """A rate-source query writing with ``write``, with ``trigger`` if given."""
    writer = spark.readStream.format("rate").load().writeStream.foreachBatch(write)
    if trigger:
        writer = writer.trigger(**trigger)
    return writer.option("checkpointLocation", str(tmp_path / "checkpoint")).start()


def test_a_batch_still_running_at_the_deadline_is_interrupted(
    spark: SparkSession, tmp_path: Path
) -> None:
    writer = QueryWriter("slow", fence=lambda: None)
    writing = threading.Event()

    def endless(batch: DataFrame, batch_id: int) -> None:
        with writer.writing(batch_id):
            writing.set()
            batch.sparkSession.range(10**13).selectExpr("max(id)").collect()

    handle = _rate_query(spark, endless, tmp_path)
    try:
        assert writing.wait(60)
        query = RunningQuery(SimpleNamespace(name="slow"), handle, writer)  # type: ignore[arg-type]
        started = time.monotonic()
        stop_gracefully([query], timeout=2.0)

        assert not _running(handle)
        assert time.monotonic() - started < 30
    finally:
        handle.stop()


def test_a_query_asleep_until_its_next_trigger_is_stopped_in_that_sleep(
    spark: SparkSession, tmp_path: Path
) -> None:
    writer = QueryWriter("idle", fence=lambda: None)
    written = threading.Event()

    def quick(batch: DataFrame, batch_id: int) -> None:
        with writer.writing(batch_id):
            batch.count()
        written.set()

    handle = _rate_query(spark, quick, tmp_path, processingTime="1 hour")
    try:
        assert written.wait(60)
        query = RunningQuery(SimpleNamespace(name="idle"), handle, writer)  # type: ignore[arg-type]
        with capture_logs() as logs:
            stop_gracefully([query], timeout=120.0)

        assert not _running(handle)
        assert writer.last_batch_id == 0
        assert [e["event"] for e in logs] == ["stopping", "query_stopped"]
    finally:
        handle.stop()


def test_a_batch_planned_as_the_stop_began_is_written_despite_sparks_own_interrupt(
    spark: SparkSession, tmp_path: Path
) -> None:
    writer = QueryWriter("planned", fence=lambda: None)
    counted: list[int] = []
    jvm: Any = spark.sparkContext._jvm

    def interrupted_then_written(batch: DataFrame, batch_id: int) -> None:
        # What Spark 4.2 does to a batch whose query was marked terminated while it
        # planned: it interrupts its own thread before the write.
        writer.end_after_this_batch()
        jvm.java.lang.Thread.currentThread().interrupt()
        with writer.writing(batch_id):
            counted.append(batch.count())

    handle = _rate_query(spark, interrupted_then_written, tmp_path, availableNow=True)
    try:
        handle.awaitTermination(120)
        assert handle.exception() is None
        assert len(counted) >= 1
        assert writer.last_batch_id is not None
    finally:
        handle.stop()
