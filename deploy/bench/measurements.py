"""What the benchmark measures, read from outside the measured process.

Micro-batches from a run's JSON log lines, CPU and memory of a process group
from /proc, the service's Prometheus endpoint, rows and files of Delta tables
from their transaction logs, and freshness: the time from a row's basis
(Kafka timestamp, event time, window end) to the commit that made it visible.
Nothing here starts or stops a process.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from prometheus_client.parser import text_string_to_metric_families
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from service.config import CHECKPOINTS_DIR

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
_METRICS_KEPT = (
    "lakehouse_ingest_input_rows_total",
    "lakehouse_ingest_kafka_max_offsets_behind_latest",
    "lakehouse_ingest_freshness_timestamp_seconds",
)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``values`` by linear interpolation; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def unix_seconds(timestamp: str) -> float:
    """Unix seconds of an ISO-8601 UTC timestamp (``…Z``) as Spark and structlog write them."""
    return datetime.fromisoformat(timestamp).timestamp()


# -- micro-batches from logs ---------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    """One micro-batch of one query: its rows and when it ran (unix seconds)."""

    query: str
    batch_id: int
    input_rows: int
    started: float
    ended: float

    @property
    def seconds(self) -> float:
        """Wall time of the whole trigger (planning, the write, the commit)."""
        return self.ended - self.started


def log_events(log_path: Path, event: str) -> list[dict[str, Any]]:
    """The JSON log lines of ``log_path`` whose ``event`` is ``event``, in order."""
    found = []
    with log_path.open(errors="replace") as lines:
        for line in lines:
            if f'"{event}"' not in line:
                continue
            try:
                parsed = json.loads(line)
            except ValueError:
                continue
            if isinstance(parsed, dict) and parsed.get("event") == event:
                found.append(parsed)
    return found


def logged_batches(log_path: Path) -> list[Batch]:
    """Every micro-batch in a run's ``query_progress`` lines, ordered by end.

    The service logs the line when Spark reports progress, i.e. at the batch's end;
    its start is that minus ``batch_duration_ms``. The baseline logs Spark's own
    trigger start (``trigger_start``) instead.
    """
    batches = []
    for line in log_events(log_path, "query_progress"):
        seconds = int(line["batch_duration_ms"]) / 1000.0
        if "trigger_start" in line:
            started = unix_seconds(line["trigger_start"])
            ended = started + seconds
        else:
            ended = unix_seconds(line["timestamp"])
            started = ended - seconds
        rows = int(line.get("input_rows") or 0)
        batches.append(Batch(line["query"], int(line["batch_id"]), rows, started, ended))
    return sorted(batches, key=lambda b: b.ended)


def batch_summary(batches: Sequence[Batch]) -> dict[str, Any]:
    """Count, rows and duration percentiles (seconds) of ``batches``."""
    seconds = [b.seconds for b in batches]
    return {
        "batches": len(batches),
        "input_rows": sum(b.input_rows for b in batches),
        "seconds_total": round(sum(seconds), 3),
        "seconds_p50": _round(percentile(seconds, 0.5)),
        "seconds_p99": _round(percentile(seconds, 0.99)),
        "seconds_max": _round(max(seconds, default=None)),
    }


def written_summaries(lines: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per query, from its ``batch_written`` log lines: the time inside ``foreachBatch``
    (seconds) and the Spark jobs each batch ran (total, p50, max)."""
    durations: dict[str, list[float]] = {}
    jobs: dict[str, list[int]] = {}
    for line in lines:
        if "duration_ms" in line:
            durations.setdefault(line["query"], []).append(line["duration_ms"] / 1e3)
        if "spark_jobs" in line:
            jobs.setdefault(line["query"], []).append(int(line["spark_jobs"]))
    return {
        query: {
            "foreach_batch_seconds_total": round(sum(durations.get(query, [])), 3),
            "spark_jobs_total": sum(jobs.get(query, [])),
            "spark_jobs_p50": _round(percentile(jobs.get(query, []), 0.5), 1),
            "spark_jobs_max": max(jobs.get(query, []), default=None),
        }
        for query in {**durations, **jobs}
    }


def by_query(batches: Iterable[Batch]) -> dict[str, list[Batch]]:
    """``batches`` grouped by query name: the ingest queries first, then by name."""
    grouped: dict[str, list[Batch]] = {}
    for batch in batches:
        grouped.setdefault(batch.query, []).append(batch)
    return {q: grouped[q] for q in sorted(grouped, key=lambda q: (q.startswith("gold"), q))}


# -- process resources ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ResourceSample:
    """CPU and memory of one process group at one moment."""

    at: float
    processes: int
    rss_bytes: int
    cpu_seconds: float


def group_resources(pgid: int) -> ResourceSample:
    """Sum resident memory and CPU time (user + system, reaped children included) over ``pgid``.

    The service's process group is the Python driver and the Spark JVM it launched.
    """
    processes = rss_pages = ticks = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited while we looked
            continue
        # Fields after "pid (comm) ": comm may contain spaces and parentheses.
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) != pgid:
            continue
        processes += 1
        ticks += sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
        rss_pages += int(fields[21])
    return ResourceSample(time.time(), processes, rss_pages * _PAGE_BYTES, ticks / _CLOCK_TICKS)


def machine_resources() -> ResourceSample:
    """The whole machine now: CPU time busy on every core, memory in use (total minus available).

    Beside the driver, a sustained run's generator and Kafka broker use the same cores;
    this says whether the machine had any left.
    """
    cpu = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in cpu[1:9])
    meminfo = dict(
        (line.split(":")[0], int(line.split()[1]))
        for line in Path("/proc/meminfo").read_text().splitlines()
    )
    used_kib = meminfo["MemTotal"] - meminfo["MemAvailable"]
    busy = user + nice + system + irq + softirq + steal
    return ResourceSample(time.time(), os.cpu_count() or 1, used_kib * 1024, busy / _CLOCK_TICKS)


def resource_summary(samples: Sequence[ResourceSample]) -> dict[str, Any]:
    """Resident memory (MiB) and CPU (% of one core: 200 = two cores busy) over ``samples``."""
    live = [s for s in samples if s.processes]
    if len(live) < 2:
        return {"samples": len(live)}
    rss = [s.rss_bytes / 2**20 for s in live]
    cpu = [
        100 * (b.cpu_seconds - a.cpu_seconds) / (b.at - a.at)
        for a, b in itertools.pairwise(live)
        if b.at > a.at
    ]
    span = live[-1].at - live[0].at
    return {
        "samples": len(live),
        "rss_mib_p50": _round(percentile(rss, 0.5), 1),
        "rss_mib_max": _round(max(rss), 1),
        "cpu_seconds": round(live[-1].cpu_seconds - live[0].cpu_seconds, 1),
        "cpu_percent_avg": _round(100 * (live[-1].cpu_seconds - live[0].cpu_seconds) / span, 1),
        "cpu_percent_p50": _round(percentile(cpu, 0.5), 1),
        "cpu_percent_max": _round(max(cpu, default=None), 1),
    }


# -- the service's /metrics ----------------------------------------------------------------------


def scrape_metrics(port: int) -> dict[str, float]:
    """The service's key series as ``name{label=value,…}`` → value (see `_METRICS_KEPT`)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    series: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in _METRICS_KEPT:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                series[f"{sample.name}{{{labels}}}"] = sample.value
    return series


# -- Spark checkpoints ---------------------------------------------------------------------------


def committed_records(checkpoints: Path) -> dict[str, int]:
    """Records per Kafka topic that the queries under ``checkpoints`` have committed.

    For each query: the end offsets of its last committed batch (Spark's ``commits/N``
    and ``offsets/N`` logs), summed over partitions. Other sources (Delta) are skipped.
    """
    totals: dict[str, int] = {}
    for commits in checkpoints.glob("*/commits"):
        done = [int(p.name) for p in commits.iterdir() if p.name.isdigit()]
        if not done:
            continue
        # offsets/N: a version line, the batch metadata, then one JSON line per source.
        for line in (commits.parent / "offsets" / str(max(done))).read_text().splitlines()[2:]:
            source = json.loads(line)
            for topic, partitions in source.items():
                if isinstance(partitions, dict):
                    totals[topic] = totals.get(topic, 0) + sum(partitions.values())
    return totals


# -- Delta tables read through their logs --------------------------------------------------------


@dataclass(frozen=True)
class DataFile:
    """A data file a commit added with new data, and when that commit was made."""

    path: Path
    committed: float


@dataclass(frozen=True)
class TableStats:
    """A Delta table's current snapshot: rows (from file stats), live files, bytes, version."""

    rows: int | None
    files: int
    bytes: int
    version: int


def delta_tables(root: Path) -> list[str]:
    """Relative names (``bronze/sensors``) of the Delta tables under ``root``, checkpoints aside."""
    return sorted(
        str(log.parent.relative_to(root))
        for log in root.glob("**/_delta_log")
        if CHECKPOINTS_DIR not in log.parts
    )


def _commits(table: Path) -> Iterable[tuple[int, float, list[dict[str, Any]]]]:
    """(version, commit unix seconds, actions) of every JSON commit, in version order."""
    for path in sorted((table / "_delta_log").glob("[0-9]*.json")):
        actions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        committed = info["timestamp"] / 1000.0 if "timestamp" in info else path.stat().st_mtime
        yield int(path.stem), committed, actions


def table_stats(table: Path) -> TableStats:
    """Replay the log: live files are added minus removed; rows are their ``numRecords`` sum.

    ``rows`` is None if a live file was written without statistics.
    """
    live: dict[str, tuple[int | None, int]] = {}
    commits = list(_commits(table))
    for _, _, actions in commits:
        for action in actions:
            if "add" in action:
                add = action["add"]
                stats = json.loads(add["stats"]) if add.get("stats") else {}
                live[add["path"]] = (stats.get("numRecords"), int(add.get("size", 0)))
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
    counts = [rows for rows, _ in live.values()]
    return TableStats(
        rows=None if None in counts else sum(c for c in counts if c is not None),
        files=len(live),
        bytes=sum(size for _, size in live.values()),
        version=commits[-1][0] if commits else -1,
    )


def data_files(table: Path) -> list[DataFile]:
    """Every file added with new data (``dataChange``), with its commit time.

    Files rewritten by maintenance (``dataChange: false``) are left out: their rows
    became visible earlier, in the files they were compacted from.
    """
    return [
        DataFile(table / unquote(action["add"]["path"]), committed)
        for _, committed, actions in _commits(table)
        for action in actions
        if "add" in action and action["add"].get("dataChange", True)
    ]


# -- freshness -----------------------------------------------------------------------------------


def freshness_basis(columns: Sequence[str]) -> str | None:
    """The SQL expression of the moment a row's data existed, by the table's columns.

    Windows are complete at ``window_end``; a join row once both readings exist;
    readings at ``kafka_timestamp`` (arrival) if present, else ``event_time``.
    """
    if "window_end" in columns:
        return "window_end"
    if {"hr_event_time", "acc_event_time"} <= set(columns):
        return "greatest(hr_event_time, acc_event_time)"
    for column in ("kafka_timestamp", "event_time"):
        if column in columns:
            return column
    return None


def freshness(spark: SparkSession, table: Path, basis: str | None = None) -> dict[str, Any]:
    """Seconds from each row's basis to the commit of its file: count, p50, p99, max.

    The data files are read as Parquet (not as the current snapshot), so each row is
    attributed to the file, hence the commit, that first made it visible.
    """
    files = data_files(table)
    if not files:
        return {"rows": 0, "basis": basis}
    rows = spark.read.parquet(*(str(f.path) for f in files))
    basis = basis or freshness_basis(rows.columns)
    if basis is None:
        return {"rows": 0, "basis": None, "error": f"no time column in {rows.columns}"}
    commits = spark.createDataFrame(
        [(f.path.name, f.committed) for f in files], "file string, committed double"
    )
    try:
        latency = (
            rows.select(
                F.expr(basis).alias("basis"),
                F.element_at(F.split(F.col("_metadata.file_path"), "/"), -1).alias("file"),
            )
            .join(F.broadcast(commits), "file")
            .select((F.col("committed") - F.unix_micros("basis") / 1e6).alias("seconds"))
        )
        result = latency.agg(
            F.count("seconds").alias("rows"),
            F.percentile_approx("seconds", [0.5, 0.99], 10_000).alias("q"),
            F.max("seconds").alias("max"),
        ).first()
    except AnalysisException as e:
        return {"rows": 0, "basis": basis, "error": str(e).splitlines()[0]}
    assert result is not None
    quantiles = result["q"] or [None, None]
    return {
        "rows": int(result["rows"]),
        "basis": basis,
        "seconds_p50": _round(quantiles[0]),
        "seconds_p99": _round(quantiles[1]),
        "seconds_max": _round(result["max"]),
    }


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)
