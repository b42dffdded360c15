"""run_together: a batch's table writes at once, with the query's Spark properties."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from pyspark.sql import SparkSession

from service.streaming.runner import run_together

POOL = "spark.scheduler.pool"


def test_writes_run_at_once_in_the_callers_scheduler_pool(spark: SparkSession) -> None:
    context = spark.sparkContext
    seen: dict[int, str | None] = {}
    threads: set[int] = set()
    all_started = threading.Barrier(3, timeout=30)

    def write(n: int) -> None:
        all_started.wait()  # times out unless the three run at the same time
        seen[n] = context.getLocalProperty(POOL)
        threads.add(threading.get_ident())

    context.setLocalProperty(POOL, "ingest")
    try:
        with ThreadPoolExecutor(max_workers=2) as workers:
            run_together(spark, workers, [lambda: write(0), lambda: write(1), lambda: write(2)])
    finally:
        context.setLocalProperty(POOL, None)  # type: ignore[arg-type]
    assert {0: "ingest", 1: "ingest", 2: "ingest"} == seen
    assert 3 == len(threads)


def test_a_failure_is_raised_once_every_write_has_ended(spark: SparkSession) -> None:
    ended: list[str] = []

    def slow() -> None:
        time.sleep(1.0)
        ended.append("slow")

    def failing() -> None:
        raise ValueError("bronze append failed")

    with ThreadPoolExecutor(max_workers=2) as workers:
        with pytest.raises(ValueError, match="bronze append failed"):
            run_together(spark, workers, [failing, slow])
        assert ["slow"] == ended
        with pytest.raises(ValueError, match="bronze append failed"):
            run_together(spark, workers, [slow, failing])
    assert ["slow", "slow"] == ended
