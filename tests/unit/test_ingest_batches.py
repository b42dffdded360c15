"""A gold batch lets the ingest batches in flight finish first, for a bounded time."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from pyspark.sql import SparkSession

from service.config import Settings
from service.gold import GoldWriter, gold_queries
from service.queries import IngestBatches
from service.tables import HEART_RATE_ACTIVITY


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


# One ingest trigger instant, 2001-09-09: every batch of a test is of that trigger, and
# none starts within a second of it.
LONG_AGO = 1e9
# An interval this short puts every moment right after an ingest trigger.
EVERY_MOMENT = 1e-6


def test_no_ingest_batch_in_flight_means_no_wait() -> None:
    ingest = IngestBatches(LONG_AGO)
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


def test_the_wait_ends_when_every_ingest_batch_in_flight_has_ended() -> None:
    ingest = IngestBatches(LONG_AGO)
    releases = [threading.Event(), threading.Event()]
    ended: list[float] = []
    threads = [_hold(ingest, threading.Event(), r, ended) for r in releases]
    releases[0].set()
    threads[0].join(60)
    # One batch still in flight: the wait runs to its bound.
    assert ingest.wait_until_idle(0.2) >= 0.2
    assert 1 == len(ended)
    threading.Timer(0.2, releases[1].set).start()
    ingest.wait_until_idle(60)
    waited_until = time.time()
    assert 2 == len(ended)
    assert ended[1] <= waited_until
    threads[1].join(60)


def test_right_after_an_ingest_trigger_the_wait_lets_its_batch_start_first() -> None:
    ingest = IngestBatches(EVERY_MOMENT)
    assert ingest.wait_until_idle(0.2) >= 0.2  # the bound holds while it lets one start
    release = threading.Event()
    ended: list[float] = []
    # The ingest batch reaches its write 0.3 s after the wait began, and ends 1.5 s after.
    threading.Timer(0.3, lambda: _hold(ingest, threading.Event(), release, ended)).start()
    threading.Timer(1.5, release.set).start()
    ingest.wait_until_idle(60)
    waited_until = time.time()
    assert 1 == len(ended)
    assert ended[0] <= waited_until


def test_a_batch_that_started_before_the_latest_trigger_is_not_waited_for() -> None:
    ingest = IngestBatches(EVERY_MOMENT)
    release = threading.Event()
    ended: list[float] = []
    thread = _hold(ingest, threading.Event(), release, ended)
    # Ingest is behind: neither this batch nor the grace for a new one holds gold.
    assert ingest.wait_until_idle(60) < 0.5
    assert [] == ended
    release.set()
    thread.join(60)


def test_a_gold_batch_commits_after_the_ingest_batch_in_flight(
    spark: SparkSession, tmp_path: Path
) -> None:
    settings = Settings(storage_root=str(tmp_path), trigger_interval_seconds=120)
    join = next(q for q in gold_queries() if q.table == HEART_RATE_ACTIVITY)
    ingest = IngestBatches(LONG_AGO)
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
