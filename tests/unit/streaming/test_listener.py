"""Progress events read as Spark's JSON: what a Spark query reports, and what Spark leaves out."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from service.streaming.listener import JsonProgressListener, progress_event
from tests.support.progress import recorded


class _Collecting(JsonProgressListener):
    def __init__(self) -> None:
        self.progress: list[Any] = []
        self.done = threading.Event()

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802
        pass

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802
        self.progress.append(event.progress)
        self.done.set()

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        pass


def test_a_query_s_progress_reaches_the_listener_with_its_numbers(
    spark: SparkSession, tmp_path: Path
) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_text("".join(f'{{"n": {i}}}\n' for i in range(7)))
    listener = _Collecting()
    spark.streams.addListener(listener)
    try:
        query = (
            spark.readStream.schema("n INT")
            .json(str(tmp_path / "in"))
            .writeStream.format("noop")
            .queryName("listened")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        deadline = time.monotonic() + 30
        while not listener.progress and time.monotonic() < deadline:
            listener.done.wait(0.5)
    finally:
        spark.streams.removeListener(listener)
    [progress] = [p for p in listener.progress if p.numInputRows]
    assert ("listened", 0, 7) == (progress.name, progress.batchId, progress.numInputRows)
    assert {"addBatch", "triggerExecution"} <= set(progress.durationMs)
    [source] = progress.sources
    assert "null" == source.startOffset
    assert 0 == json.loads(source.endOffset)["logOffset"]


def test_source_fields_spark_leaves_out_read_as_none() -> None:
    event = recorded("kafka_caught_up.json")["progress"]
    for field in ("startOffset", "latestOffset", "inputRowsPerSecond"):
        del event["sources"][0][field]
    [source] = progress_event(json.dumps(event)).progress.sources
    assert ("null", "null") == (source.startOffset, source.latestOffset)
    assert source["inputRowsPerSecond"] is None  # PySpark's type says float
    assert source.endOffset == json.dumps(event["sources"][0]["endOffset"])
