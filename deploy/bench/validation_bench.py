"""Validation alone: the sensors contract's `parse_records` on cached readings, warm.

``python deploy/bench/validation_bench.py [--readings N] [--repeat K]`` builds N generated
readings (the generator's records, every one valid) as bronze rows, caches them, then
times K runs of each step into Spark's no-op sink, on a local[2] session configured as
the service's: the cached scan, `from_json` with the baseline's typed schema (what a
hand-written query pays), the typed fast path's marking (what an ingest query's stream
computes: the readings it decides, which are all of these), and the contract's whole
validation (`parse_records`: the marking, then the exact checks on the records it left
pending), with its typed fast path and without (every record checked exactly). The
first run of each
includes its code generation; the best of the others is the warm figure.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from baseline import SENSOR_PAYLOAD
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from service.config import Settings
from service.ingest.bronze import to_records
from service.ingest.modes import Validation, parse_records
from service.ingest.validation import DEFAULT_MAX_PAYLOAD_BYTES
from service.streaming.session import build_spark
from service.verbs.generate import RecordFactory

_KAFKA_SOURCE = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, headers array<struct<key: string, value: binary>>"
)


def _timed(name: str, df: DataFrame, repeat: int) -> None:
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        df.write.format("noop").mode("overwrite").save()
        runs.append(time.perf_counter() - start)
    warm = min(runs[1:]) if len(runs) > 1 else runs[0]
    shown = " ".join(f"{r:.2f}" for r in runs)
    print(f"{name:24s} warm {warm:6.2f} s   runs: {shown}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readings", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)

    settings = Settings(spark_master="local[2]", spark_ui_enabled=False)
    spark = build_spark(settings)
    spark.sparkContext.setLogLevel("ERROR")
    factory = RecordFactory(users=1000, seed=0)
    start = datetime(2026, 11, 27, tzinfo=UTC)
    values = [factory.reading(start + timedelta(milliseconds=i))[1] for i in range(args.readings)]
    rows = [
        (None, json.dumps(value).encode(), "sensors", i % 3, i, start, None)
        for i, value in enumerate(values)
    ]
    source = spark.createDataFrame(rows, _KAFKA_SOURCE).repartition(2)
    bronze = to_records(source).persist()
    print(f"{bronze.count():,} readings cached", flush=True)
    contract = settings.contracts.by_name["sensors"]
    _timed("cached scan", bronze, args.repeat)
    typed = bronze.select(F.from_json("value_text", SENSOR_PAYLOAD))
    _timed("from_json (baseline)", typed, args.repeat)
    validation = Validation.of(contract, DEFAULT_MAX_PAYLOAD_BYTES, settings.max_future_seconds)
    _timed("marked (the stream's)", validation.mark(bronze), args.repeat)
    for name, fast in (("parse_records", True), ("parse_records exact", False)):
        parsed = parse_records(
            contract, bronze, DEFAULT_MAX_PAYLOAD_BYTES, settings.max_future_seconds, fast=fast
        )
        _timed(name, parsed, args.repeat)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
