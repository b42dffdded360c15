"""Record the listener-event JSON fixtures of this directory from real Spark queries.

Run by hand after a Spark upgrade:
``PYTHONPATH=deploy/local .venv/bin/python -m tests.support.progress.record``.
It starts a throw-away Kafka broker, runs a Kafka ingest-like query (lagging,
then caught up, then idle, then failing) and a watermarked windowed
aggregation (state, watermark, late rows dropped), and writes one JSON file per
event kind next to this file.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from devstack import KafkaBroker
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.listener import StreamingQueryListener

from service.config import Settings
from service.streaming.session import spark_conf
from tests.support.progress import RECORDED


class _Recorder(StreamingQueryListener):
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def _add(self, kind: str, body: dict[str, Any]) -> None:
        with self.lock:
            self.events.append((kind, body))

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802
        body = {"id": str(event.id), "runId": str(event.runId), "name": event.name}
        self._add("started", {**body, "timestamp": event.timestamp})

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802
        self._add("progress", {"progress": json.loads(event.progress.json)})

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        body = {"id": str(event.id), "runId": str(event.runId), "timestamp": event.timestamp}
        self._add("idle", body)

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        body = {
            "id": str(event.id),
            "runId": str(event.runId),
            "exception": event.exception,
            "errorClassOnException": event.errorClassOnException,
        }
        self._add("terminated", body)


def _produce(bootstrap: str, topic: str, times: list[datetime]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i, t in enumerate(times):
        value = json.dumps({"event_id": f"e{i}-{t.timestamp()}", "event_time": t.isoformat()})
        producer.produce(topic, key=str(i % 7), value=value, partition=i % 3)
    producer.flush(30)


def _wait_for(
    recorder: _Recorder, what: Callable[[list[tuple[str, dict[str, Any]]]], bool]
) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        with recorder.lock:
            if what(list(recorder.events)):
                return
        time.sleep(0.5)
    raise RuntimeError("expected events not recorded within 300 s")


def _progress(events: list[tuple[str, dict[str, Any]]], name: str) -> list[dict[str, Any]]:
    return [b["progress"] for k, b in events if k == "progress" and b["progress"]["name"] == name]


def _lag(p: dict[str, Any]) -> float:
    return float(p["progress"]["sources"][0]["metrics"].get("maxOffsetsBehindLatest", "0"))


def _save(name: str, body: dict[str, Any]) -> None:
    (RECORDED / name).write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")


def main() -> None:
    """Record the fixtures."""
    with tempfile.TemporaryDirectory() as tmp, KafkaBroker(Path(tmp) / "kafka") as broker:
        broker.create_topics(["sensors", "readings"], partitions=3)
        now = datetime.now(UTC)
        _produce(broker.bootstrap_servers, "sensors", [now] * 300)
        settings = Settings(spark_master="local[2]", spark_ui_enabled=False)
        builder = SparkSession.builder
        for key, value in spark_conf(settings).items():
            builder = builder.config(key, value)
        spark = builder.config("spark.sql.streaming.noDataProgressEventInterval", "1000")
        session = spark.getOrCreate()
        recorder = _Recorder()
        session.streams.addListener(recorder)
        fail_after = threading.Event()

        def write(batch: DataFrame, batch_id: int) -> None:
            batch.count()
            if fail_after.is_set():
                raise RuntimeError("simulated sink failure: s3a bucket unreachable")

        ingest = (
            session.readStream.format("kafka")
            .option("kafka.bootstrap.servers", broker.bootstrap_servers)
            .option("subscribe", "sensors")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "120")
            .load()
            .writeStream.queryName("ingest_sensors")
            .option("checkpointLocation", f"{tmp}/cp-ingest")
            .trigger(processingTime="1 second")
            .foreachBatch(write)
            .start()
        )
        # lagging batches, then caught up, then idle events
        _wait_for(recorder, lambda ev: any(k == "idle" for k, _ in ev))
        fail_after.set()
        _produce(broker.bootstrap_servers, "sensors", [now] * 10)
        while ingest.isActive:
            time.sleep(0.5)

        _produce(
            broker.bootstrap_servers, "readings", [now - timedelta(seconds=i) for i in range(50)]
        )
        parsed = (
            session.readStream.format("kafka")
            .option("kafka.bootstrap.servers", broker.bootstrap_servers)
            .option("subscribe", "readings")
            .option("startingOffsets", "earliest")
            .load()
            .select(
                F.get_json_object(F.col("value").cast("string"), "$.event_time")
                .cast("timestamp")
                .alias("event_time")
            )
        )
        windows = (
            parsed.withWatermark("event_time", "10 minutes")
            .groupBy(F.window("event_time", "1 minute"))
            .count()
            .writeStream.queryName("gold_sensor_stats_1m")
            .format("noop")
            .outputMode("append")
            .option("checkpointLocation", f"{tmp}/cp-gold")
            .trigger(processingTime="1 second")
            .start()
        )
        _wait_for(
            recorder,
            lambda ev: any(
                p["eventTime"].get("watermark", "1970").startswith("2")
                for p in _progress(ev, "gold_sensor_stats_1m")
            ),
        )
        _produce(broker.bootstrap_servers, "readings", [now - timedelta(hours=2)] * 20)
        _wait_for(
            recorder,
            lambda ev: any(
                p["stateOperators"][0]["numRowsDroppedByWatermark"] > 0
                for p in _progress(ev, "gold_sensor_stats_1m")
            ),
        )
        windows.stop()
        session.stop()

    events = recorder.events
    Path(tempfile.gettempdir(), "recorded-events.json").write_text(json.dumps(events, indent=1))
    progress = [b for k, b in events if k == "progress"]
    ingest_progress = [p for p in progress if p["progress"]["name"] == "ingest_sensors"]
    gold_progress = [p for p in progress if p["progress"]["name"] == "gold_sensor_stats_1m"]

    _save("started.json", next(b for k, b in events if k == "started"))
    _save("kafka_lagging.json", next(p for p in ingest_progress if _lag(p) > 0))
    _save(
        "kafka_caught_up.json",
        next(p for p in ingest_progress if _lag(p) == 0 and p["progress"]["numInputRows"] > 0),
    )
    _save("idle.json", next(b for k, b in events if k == "idle"))
    _save("terminated_with_error.json", next(b for k, b in events if k == "terminated"))
    _save(
        "watermark_dropped_late_rows.json",
        next(
            p
            for p in gold_progress
            if p["progress"]["stateOperators"][0]["numRowsDroppedByWatermark"] > 0
        ),
    )
    print("recorded", len(events), "events")


if __name__ == "__main__":
    main()
