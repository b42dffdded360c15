"""The backlog's gold/heart_rate_activity write alone: its pairs appended to Delta.

``python deploy/bench/gold_write_bench.py [--pairs N] [--rounds K]`` makes N rows shaped
as the ±30 s join's output (by default 6,468,989: what `make bench`'s backlog of
1,000,000 readings pairs; about 19 accelerometer readings per heart-rate reading, event
ids as UUID text), caches them, and appends them K times, each to a new table with the
table's properties through the gold queries' own append (`append_once`), on a local[2]
session configured as the service's. It prints, per round, the wall time and the CPU
seconds of the process group (the Python driver and its JVM) of the append and of a
read of the cached rows alone: a floor under what gold costs, before any join or state.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from collections.abc import Sequence

from local_session import local_session
from measurements import group_resources
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from service.lake.delta import append_once
from service.lake.tables import HEART_RATE_ACTIVITY

BACKLOG_PAIRS = 6_468_989
# Accelerometer readings per heart-rate reading within ±30 s in the backlog.
PAIRS_PER_HEART_RATE = 19
_EPOCH_MICROS = 1_796_000_000_000_000
_READING_STEP_MICROS = 3_000_000


def _uuid_text(number: Column) -> Column:
    """A UUID-shaped text (8-4-4-4-12 hex digits) that ``number`` determines."""
    digits = F.md5(number.cast("string"))
    parts = ((1, 8), (9, 4), (13, 4), (17, 4), (21, 12))
    return F.concat_ws("-", *(F.substring(digits, start, size) for start, size in parts))


def pairs(spark: SparkSession, count: int) -> DataFrame:
    """``count`` rows with gold/heart_rate_activity's columns, as the join emits them: the
    pairs of one heart-rate reading one after the other, about as many accelerometer
    readings as heart-rate ones."""
    readings = max(1, count // PAIRS_PER_HEART_RATE)
    heart = (F.col("id") / PAIRS_PER_HEART_RATE).cast("long")
    # Each accelerometer reading in as many pairs, not one after the other.
    motion = F.col("id") * 7919 % readings + readings
    return spark.range(count).select(
        (heart % 1000 + 1).alias("user_id"),
        _uuid_text(heart).alias("hr_event_id"),
        F.timestamp_micros(F.lit(_EPOCH_MICROS) + heart * _READING_STEP_MICROS).alias(
            "hr_event_time"
        ),
        (F.rand(1) * 100 + 50).alias("bpm"),
        _uuid_text(motion).alias("acc_event_id"),
        F.timestamp_micros(
            F.lit(_EPOCH_MICROS)
            + heart * _READING_STEP_MICROS
            + (F.col("id") % 61 - 30) * 1_000_000
        ).alias("acc_event_time"),
        F.element_at(
            F.array(F.lit("rest"), F.lit("walk"), F.lit("run")), (heart % 3 + 1).cast("int")
        ).alias("activity"),
        (F.rand(2) * 20).alias("magnitude"),
    )


def _cpu_seconds() -> float:
    return group_resources(os.getpgrp()).cpu_seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=BACKLOG_PAIRS)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    root, settings, spark = local_session("gold-write-bench-")
    rows = pairs(spark, args.pairs).persist()
    print(f"{rows.count():,} pairs cached", flush=True)
    try:
        for round_ in range(1, args.rounds + 1):
            cpu, started = _cpu_seconds(), time.perf_counter()
            rows.write.format("noop").mode("overwrite").save()
            read_cpu, read_wall = _cpu_seconds() - cpu, time.perf_counter() - started
            uri = HEART_RATE_ACTIVITY.uri(settings.storage_uri) + f"-{round_}"
            cpu, started = _cpu_seconds(), time.perf_counter()
            append_once(rows, uri, "gold-write-bench", 0, HEART_RATE_ACTIVITY.properties)
            wall = time.perf_counter() - started
            print(
                f"round {round_}: append {wall:5.1f} s {_cpu_seconds() - cpu:5.1f} CPU-s;"
                f" the cached rows read alone {read_wall:4.1f} s {read_cpu:4.1f} CPU-s",
                flush=True,
            )
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
