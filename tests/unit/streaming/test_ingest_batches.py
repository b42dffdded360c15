"""A gold batch lets the ingest batches in flight finish first, for a bounded time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from service.config import Settings
from service.gold.queries import GoldWriter, gold_queries
from service.lake.tables import HEART_RATE_ACTIVITY
from service.streaming.runner import IngestBatches


def _hold(ingest: IngestBatches, entered: threading.Event, release: threading.Event,
          ended: list[float]) -> threading.Thread:  # fmt: skip
    """A thread writing an ingest batch until ``release`` is set; ``ended`` gets its end."""

    def batch() -> None:
        with ingest.writing():
            entered.set()
            release.wait(60)
            ended.append(time.time())

    thread = threading.Thread(target=batch)
    thread.start()
    assert entered.wait(60)
    return thread


def _last_trigger_ago(seconds: float) -> IngestBatches:
    """Batches whose latest ingest trigger instant was ``seconds`` ago, the next far ahead."""
    return IngestBatches(trigger_seconds=time.time() - seconds)


def test_no_ingest_batch_in_flight_means_no_wait() -> None:
    ingest = _last_trigger_ago(5)
    with ingest.writing():
        pass
    assert ingest.wait_until_idle(60) < 30


def test_without_trigger_instants_gold_never_waits() -> None:
    ingest = IngestBatches()  # --available-now: gold starts once ingest has drained
    release = threading.Event()
    thread = _hold(ingest, threading.Event(), release, [])
    assert 0.0 == ingest.wait_until_idle(60)
    release.set()
    thread.join(60)


def test_the_wait_lets_the_batches_of_the_trigger_start_and_end() -> None:
    ingest = _last_trigger_ago(0)
    releases = [threading.Event(), threading.Event()]
    ended: list[float] = []
    # Two ingest batches reach their write 0.1 s and 0.2 s after the wait began (within
    # the time a batch takes to start) and end 0.5 s and 1.5 s after it.
    for delay, release in zip((0.1, 0.2), releases, strict=True):
        threading.Timer(delay, lambda r=release: _hold(ingest, threading.Event(), r, ended)).start()
    threading.Timer(0.5, releases[0].set).start()
    threading.Timer(1.5, releases[1].set).start()
    ingest.wait_until_idle(60)
    waited_until = time.time()
    assert 2 == len(ended)
    assert max(ended) <= waited_until


def test_the_wait_is_bounded() -> None:
    ingest = _last_trigger_ago(0)
    release = threading.Event()
    ended: list[float] = []
    thread = _hold(ingest, threading.Event(), release, ended)
    assert ingest.wait_until_idle(1.2) >= 1.2  # beyond the time a batch takes to start
    assert [] == ended
    release.set()
    thread.join(60)


@pytest.mark.parametrize(
    "batches",
    [
        # Started 1.5 s after the latest trigger instant: the batch before overran it.
        lambda: _last_trigger_ago(1.5),
        # Started before the latest trigger (every moment is right after one): gold does
        # not wait for a new batch either while this one runs.
        lambda: IngestBatches(trigger_seconds=1e-6),
    ],
    ids=["started-late-after-its-trigger", "started-before-the-latest-trigger"],
)
def test_a_batch_that_catches_up_is_not_waited_for(batches: Callable[[], IngestBatches]) -> None:
    ingest = batches()
    release = threading.Event()
    ended: list[float] = []
    thread = _hold(ingest, threading.Event(), release, ended)
    assert ingest.wait_until_idle(60) < 0.5
    assert [] == ended
    release.set()
    thread.join(60)


def test_a_gold_batch_commits_after_the_ingest_batch_in_flight(
    spark: SparkSession, tmp_path: Path
) -> None:
    settings = Settings(storage_root=str(tmp_path), trigger_interval_seconds=120)
    join = next(q for q in gold_queries() if q.table == HEART_RATE_ACTIVITY)
    ingest = _last_trigger_ago(0)
    writer = GoldWriter(join, settings, lambda: None, ingest=ingest)
    writer.bind("00000000-0000-0000-0000-000000000001")
    # The writer appends what its batch holds; the table keeps statistics on these.
    now = "current_timestamp()"
    rows = spark.range(3).selectExpr(
        "id AS user_id", f"{now} AS hr_event_time", f"{now} AS acc_event_time"
    )
    table = HEART_RATE_ACTIVITY.uri(settings.storage_uri)
    log = Path(table.removeprefix("file:")) / "_delta_log"
    release = threading.Event()
    ended: list[float] = []
    thread = _hold(ingest, threading.Event(), release, ended)
    seen_at_release: list[bool] = []

    def end_the_ingest_batch() -> None:
        # Long enough for the write to have committed had it not waited (< 1 s here).
        seen_at_release.append(log.exists())
        release.set()

    threading.Timer(3.0, end_the_ingest_batch).start()
    writer(rows, 0)
    thread.join(60)
    assert [False] == seen_at_release
    assert 3 == spark.read.format("delta").load(table).count()
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`")
    (committed,) = history.where("operation = 'WRITE'").collect()
    assert 1 == len(ended)
    assert int(ended[0] * 1000) <= committed["timestamp"].timestamp() * 1000
