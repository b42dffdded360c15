"""`make bench`: throughput, latency and resources of the service on this machine.

One run starts its own Kafka broker on loopback and a fresh local lakehouse per
measured process, so every variant reads the same records with the same jars.

    backlog    produce N readings first, then drain them with `--available-now`:
               a hand-written baseline query, ingest (bronze + silver), ingest + gold
    sustained  the long-running driver (all queries) while the generator produces
               at a rate: Kafka lag, batch durations, silver and gold freshness,
               the driver's memory and CPU
    soak       sustained for longer, plus batch durations early vs late and the
               files per table

It prints tables and writes every figure to a JSON document. Not a test: nothing is
asserted on time; the exit code is 1 only when a process failed or bronze does not
hold exactly what was produced.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

# Measure the service of this checkout, and start Kafka with the repo's own launcher.
REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "deploy" / "local")]
from devstack import KafkaBroker  # noqa: E402
from measurements import (  # noqa: E402
    Batch,
    ResourceSample,
    batch_summary,
    by_query,
    committed_records,
    delta_tables,
    freshness,
    group_resources,
    log_events,
    logged_batches,
    machine_resources,
    resource_summary,
    scrape_metrics,
    table_stats,
    written_summaries,
)

from service.config import (  # noqa: E402
    CHECKPOINTS_DIR,
    Settings,
    default_cache_dir,
    load_settings,
)
from service.lake.tables import BRONZE_SENSORS, BRONZE_USERS, SENSOR_READINGS  # noqa: E402
from service.logs import configure_logging  # noqa: E402
from service.streaming.session import build_spark  # noqa: E402
from service.verbs.generate import GeneratorOptions, generate  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
VAR = REPO / "var" / "bench"
USERS, SENSORS, ALERTS = "users", "sensors", "alerts"
PARTITIONS = 3
VARIANTS = ("baseline", "ingest", "ingest+gold")
# The query that reads the sensors topic, per variant: its rows are the ones counted.
SENSOR_QUERY = {"baseline": "baseline", "ingest": "ingest_sensors", "ingest+gold": "ingest_sensors"}
_POLL_SECONDS = 0.2
_START_TIMEOUT_SECONDS = 600.0
_STOP_TIMEOUT_SECONDS = 300.0


# The generator's mix (`generate`'s ``--<name>-fraction``): name, what, the default's meaning.
MIX = (
    ("bad", "readings the contract rejects", "every reading valid"),
    ("duplicate", "re-sent readings (same event id)", "every reading unique"),
    ("late", "readings 15 min to 2 h late in event time", "every reading on time"),
    ("user-update", "reading slots that also update a profile", "each user sent once, first"),
    ("tombstone", "reading slots that also delete a user", "each user sent once, first"),
)


def mix_flags(args: argparse.Namespace) -> list[str]:
    """The ``--*-fraction`` flags given, as `generate`'s arguments."""
    return [
        arg
        for name, _, _ in MIX
        for arg in (f"--{name}-fraction", str(getattr(args, f"{name.replace('-', '_')}_fraction")))
    ]


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a fraction between 0 and 1")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line; ``--help`` documents every flag."""
    parser = argparse.ArgumentParser(
        prog="bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "The INGEST_* variables of the environment (e.g. INGEST_SPARK_MASTER,\n"
            "INGEST_SPARK_DRIVER_MEMORY, INGEST_TRIGGER_INTERVAL_SECONDS) reach every measured\n"
            "process, except those the bench sets itself: bootstrap servers, topics, storage\n"
            "root (checkpoint root unset), HTTP port 0, Spark UI off, JSON logs at INFO."
        ),
    )
    parser.add_argument(
        "--mode",
        choices=("backlog", "sustained", "soak"),
        default="backlog",
        help="what to measure (default: backlog)",
    )
    parser.add_argument(
        "--readings",
        type=int,
        default=1_000_000,
        help="backlog: sensor readings to produce before draining (default: 1000000)",
    )
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"backlog: comma-separated subset of {','.join(VARIANTS)} (default: all, in order; "
        "empty: only produce, to measure the generator)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=1000.0,
        help="sustained/soak: readings per second the generator produces (default: 1000)",
    )
    parser.add_argument(
        "--minutes",
        type=float,
        help="sustained/soak: minutes the generator runs (default: 10 sustained, 30 soak)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=600.0,
        help="sustained/soak: seconds to wait, once the generator stopped, for the service "
        "to read everything (default: 600)",
    )
    parser.add_argument("--users", type=int, default=1000, help="distinct users (default: 1000)")
    parser.add_argument("--seed", type=int, default=0, help="generator seed (default: 0)")
    for name, what, default in MIX:
        parser.add_argument(
            f"--{name}-fraction",
            type=_fraction,
            default=0.0,
            help=f"fraction of {what} (default: 0: {default})",
        )
    parser.add_argument(
        "--sample-seconds",
        type=float,
        default=5.0,
        help="seconds between samples of /proc, /metrics and broker offsets (default: 5)",
    )
    parser.add_argument(
        "--run-timeout",
        type=float,
        default=7200.0,
        help="backlog: seconds after which a variant is killed and reported failed (default: 7200)",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        help="Kafka data, lakehouses and logs (default: var/bench/run-<timestamp>)",
    )
    parser.add_argument(
        "--keep-data",
        action="store_true",
        help="keep the Kafka data and lakehouses in the work dir (logs are always kept)",
    )
    parser.add_argument(
        "--json-out",
        type=Path,
        help="where to write the JSON report (default: var/bench/bench-<timestamp>.json)",
    )
    args = parser.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    if unknown := set(args.variants) - set(VARIANTS):
        parser.error(f"--variants: unknown {', '.join(sorted(unknown))}")
    if args.minutes is None:
        args.minutes = 30.0 if args.mode == "soak" else 10.0
    return args


# -- child processes -----------------------------------------------------------------------------


@dataclass
class Child:
    """A measured process in its own process group (the driver and its JVM), logging to a file."""

    name: str
    command: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes]
    launched: float
    exited: float | None = None
    resources: list[ResourceSample] = field(default_factory=list)

    @classmethod
    def launch(cls, name: str, command: list[str], env: Mapping[str, str], log_path: Path) -> Child:
        """Start ``command``; a thread records the moment it exits."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            launched = time.time()
            proc = subprocess.Popen(
                command,
                cwd=REPO,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        child = cls(name, command, log_path, proc, launched)
        threading.Thread(target=child._wait, daemon=True).start()
        return child

    def _wait(self) -> None:
        self.proc.wait()
        self.exited = time.time()

    def sample(self) -> None:
        """Record the process group's memory and CPU now."""
        if self.exited is None:
            self.resources.append(group_resources(self.proc.pid))

    def kill(self) -> None:
        """SIGKILL the whole process group if anything of it is left."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        if self.exited is None:  # killed: the waiting thread may not have recorded it yet
            self.exited = time.time()

    def watch(
        self, every: float, until: Callable[[], bool], timeout: float, tick: Callable[[], None]
    ) -> str:
        """Sample (and ``tick``) every ``every`` s until ``until()``, exit or ``timeout``.

        Returns which came first: ``"until"``, ``"exited"`` or ``"timeout"``.
        """
        deadline = time.monotonic() + timeout
        next_sample = 0.0
        while True:
            if self.exited is not None:
                return "exited"
            now = time.monotonic()
            if now >= next_sample:
                self.sample()
                tick()
                next_sample = now + every
                if until():
                    return "until"
            if now > deadline:
                return "timeout"
            time.sleep(_POLL_SECONDS)


def service_env(broker: KafkaBroker, storage_root: Path, **extra: str) -> dict[str, str]:
    """Environment of a measured process: the caller's, pointed at the bench's broker and lake."""
    env = {k: v for k, v in os.environ.items() if k != "INGEST_CHECKPOINT_ROOT"}
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])]),
            "INGEST_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
            "INGEST_USERS_TOPIC": USERS,
            "INGEST_SENSORS_TOPIC": SENSORS,
            "INGEST_ALERTS_TOPIC": ALERTS,
            "INGEST_STORAGE_ROOT": str(storage_root),
            "INGEST_HTTP_PORT": "0",
            "INGEST_SPARK_UI_ENABLED": "false",
            "INGEST_LOG_FORMAT": "json",
            "INGEST_LOG_LEVEL": "INFO",
            **extra,
        }
    )
    return env


def _never() -> bool:
    return False


def _nothing() -> None:
    return None


# -- backlog -------------------------------------------------------------------------------------


def run_backlog(args: argparse.Namespace, broker: KafkaBroker, work: Path) -> dict[str, Any]:
    """Produce the readings, then drain them with each variant in turn."""
    settings = Settings(
        kafka_bootstrap_servers=broker.bootstrap_servers, users_topic=USERS, sensors_topic=SENSORS
    )
    options = GeneratorOptions(
        users=args.users,
        readings=args.readings,
        seed=args.seed,
        partitions=PARTITIONS,
        bad_fraction=args.bad_fraction,
        late_fraction=args.late_fraction,
        duplicate_fraction=args.duplicate_fraction,
        user_update_fraction=args.user_update_fraction,
        tombstone_fraction=args.tombstone_fraction,
    )
    print(f"producing {args.readings:,} readings and {args.users:,} users ...", flush=True)
    began = time.monotonic()
    summary = generate(settings, options)
    seconds = time.monotonic() - began
    records = sum(summary.produced.values())
    produce = {
        "seconds": round(seconds, 2),
        "records_per_second": round(records / seconds),
        "produced": dict(summary.produced),
        "by_category": dict(summary.by_category),
    }
    print(f"  {records:,} records in {seconds:.1f} s ({records / seconds:,.0f} records/s)")
    variants = {}
    for variant in args.variants:
        print(f"running {variant} ...", flush=True)
        variants[variant] = run_variant(variant, args, broker, work)
        print(f"  exit {variants[variant]['exit_code']} in {variants[variant]['wall_seconds']} s")
    checks = reconcile_backlog(dict(summary.produced), variants)
    return {"produce": produce, "variants": variants, "reconciliation": checks}


def run_variant(
    variant: str, args: argparse.Namespace, broker: KafkaBroker, work: Path
) -> dict[str, Any]:
    """Drain the topics with one variant in a fresh process and lakehouse; summarise it."""
    root = work / f"lake-{variant.replace('+', '-')}"
    if variant == "baseline":
        command = [
            sys.executable,
            str(BENCH_DIR / "baseline.py"),
            "--table",
            str(root / "baseline" / "sensors"),
            "--checkpoint",
            str(root / CHECKPOINTS_DIR / "baseline"),
        ]
        env = service_env(broker, root)
    else:
        command = [sys.executable, "-m", "service", "run", "--available-now"]
        env = service_env(broker, root, INGEST_GOLD_ENABLED=str(variant == "ingest+gold").lower())
    load = os.getloadavg()
    child = Child.launch(variant, command, env, work / "logs" / f"{root.name}.log")
    try:
        ended = child.watch(args.sample_seconds, _never, args.run_timeout, _nothing)
    finally:
        child.kill()
    assert child.exited is not None
    batches = logged_batches(child.log_path)
    sensor_rows = sum(b.input_rows for b in batches if b.query == SENSOR_QUERY[variant])
    result: dict[str, Any] = {
        "command": command,
        "log": str(child.log_path),
        "exit_code": child.proc.returncode,
        "timed_out": ended == "timeout",
        "load_average_before": [round(x, 2) for x in load],
        "wall_seconds": round(child.exited - child.launched, 2),
        "sensor_rows_read": sensor_rows,
        "rows_per_second_wall": round(sensor_rows / (child.exited - child.launched)),
    }
    if batches:
        first, last = min(b.started for b in batches), max(b.ended for b in batches)
        result.update(
            {
                "startup_seconds": round(first - child.launched, 2),
                "processing_seconds": round(last - first, 2),
                "shutdown_seconds": round(child.exited - last, 2),
                "rows_per_second_after_start": round(sensor_rows / max(last - first, 1e-3)),
            }
        )
    result["queries"] = _query_summaries(child.log_path, batches)
    result["resources"] = resource_summary(child.resources)
    result["tables"] = {name: asdict(table_stats(root / name)) for name in delta_tables(root)}
    return result


def _query_summaries(log_path: Path, batches: Sequence[Batch]) -> dict[str, dict[str, Any]]:
    """Per query: its batches, and where the service logs them (``batch_written``) the time
    inside ``foreachBatch`` and the Spark jobs per batch."""
    written = written_summaries(log_events(log_path, "batch_written"))
    return {
        query: {**batch_summary(group), **written.get(query, {})}
        for query, group in by_query(batches).items()
    }


def reconcile_backlog(
    produced: Mapping[str, int], variants: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Each variant exited 0 and its bronze tables (baseline: its table) hold what was produced."""
    checks = []
    for variant, result in variants.items():
        checks.append(_check(variant, "exit code", 0, result["exit_code"]))
        expected = (
            {"baseline/sensors": produced.get(SENSORS, 0)}
            if variant == "baseline"
            else {
                BRONZE_SENSORS.name: produced.get(SENSORS, 0),
                BRONZE_USERS.name: produced.get(USERS, 0),
            }
        )
        for table, rows in expected.items():
            actual = result["tables"].get(table, {}).get("rows")
            checks.append(_check(variant, f"{table} rows", rows, actual))
    return checks


def _check(scope: str, what: str, expected: object, actual: object) -> dict[str, Any]:
    return {
        "scope": scope,
        "check": what,
        "expected": expected,
        "actual": actual,
        "ok": expected == actual,
    }


# -- sustained and soak --------------------------------------------------------------------------


class LagProbe:
    """Samples what Kafka holds (end offsets) against what the service committed (checkpoints).

    Also keeps the service's own view of it (key series of /metrics) once ``port`` is known.
    """

    def __init__(self, broker: KafkaBroker, topics: Sequence[str], checkpoints: Path) -> None:
        self._consumer = Consumer(
            {"bootstrap.servers": broker.bootstrap_servers, "group.id": "lakehouse-bench"}
        )
        self._topics = topics
        self._checkpoints = checkpoints
        self.port: int | None = None
        self.samples: list[dict[str, Any]] = []

    def end_offsets(self, topic: str) -> int:
        """Records in ``topic``: the sum of its partitions' high watermarks."""
        metadata = self._consumer.list_topics(topic, timeout=10)
        return sum(
            self._consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in metadata.topics[topic].partitions
        )

    def sample(self) -> None:
        """One sample: end offsets, committed offsets, the lag between them, the metrics."""
        at = time.time()
        ends = {topic: self.end_offsets(topic) for topic in self._topics}
        committed = committed_records(self._checkpoints)
        metrics: dict[str, float] = {}
        if self.port is not None:
            with contextlib.suppress(OSError):  # not serving yet, or stopping
                metrics = scrape_metrics(self.port)
        self.samples.append(
            {
                "at": at,
                "end_offsets": ends,
                "committed": {topic: committed.get(topic, 0) for topic in self._topics},
                "lag": {topic: ends[topic] - committed.get(topic, 0) for topic in self._topics},
                "metrics": metrics,
            }
        )

    def caught_up(self) -> bool:
        """Whether the last sample had the service commit everything Kafka holds."""
        return bool(self.samples) and not any(self.samples[-1]["lag"].values())

    def close(self) -> None:
        """Close the Kafka client."""
        self._consumer.close()


class Neighbours:
    """What shares the machine with the driver while the generator runs: the broker, the total."""

    def __init__(self, broker: KafkaBroker) -> None:
        self._broker_pid = broker.pid
        self.broker: list[ResourceSample] = []
        self.machine: list[ResourceSample] = []

    def sample(self) -> None:
        """Record the broker's and the machine's CPU and memory now."""
        if self._broker_pid is not None:
            self.broker.append(group_resources(self._broker_pid))
        self.machine.append(machine_resources())


def run_sustained(args: argparse.Namespace, broker: KafkaBroker, work: Path) -> dict[str, Any]:
    """Run the driver while the generator produces at ``--rate``; then drain, stop, read back."""
    root = work / "lake-sustained"
    env = service_env(broker, root)
    settings = Settings(users_topic=USERS, sensors_topic=SENSORS)
    trigger = settings.trigger_interval_seconds
    probe = LagProbe(broker, (USERS, SENSORS), root / CHECKPOINTS_DIR)
    neighbours = Neighbours(broker)
    service = Child.launch(
        "service", [sys.executable, "-m", "service", "run"], env, work / "logs" / "service.log"
    )
    generator: Child | None = None
    phases: dict[str, float | None] = {"launched": service.launched}
    try:
        print("starting the service ...", flush=True)
        running = _running_line(service)
        if running is None:
            raise RuntimeError(f"the service did not start; see {service.log_path}")
        probe.port = int(running["http_port"])
        phases["running"] = time.time()
        seconds = args.minutes * 60
        print(f"producing {args.rate:g} readings/s for {args.minutes:g} min ...", flush=True)
        generator = Child.launch(
            "generator",
            [
                sys.executable,
                "-m",
                "service",
                "generate",
                "--users",
                str(args.users),
                "--rate",
                str(args.rate),
                "--duration",
                str(seconds),
                "--seed",
                str(args.seed),
                "--partitions",
                str(PARTITIONS),
                *mix_flags(args),
            ],
            {**env, "INGEST_LOG_LEVEL": "WARNING"},
            work / "logs" / "generator.log",
        )
        phases["generating"] = generator.launched
        gen = generator

        def tick() -> None:
            probe.sample()
            gen.sample()
            neighbours.sample()

        service.watch(args.sample_seconds, lambda: gen.exited is not None, seconds + 600, tick)
        phases["generated"] = generator.exited or time.time()
        print("draining ...", flush=True)
        drained = service.watch(
            args.sample_seconds, probe.caught_up, args.drain_timeout, probe.sample
        )
        phases["drained"] = time.time() if drained == "until" else None
        # Let gold run a trigger or two over the last silver commit.
        service.watch(args.sample_seconds, _never, 2 * settings.gold_trigger_seconds, probe.sample)
        phases["stop_requested"] = time.time()
        service.proc.send_signal(signal.SIGTERM)
        service.watch(args.sample_seconds, _never, _STOP_TIMEOUT_SECONDS, _nothing)
    finally:
        probe.close()
        for child in (generator, service):
            if child is not None:
                child.kill()
    phases["exited"] = service.exited
    return summarise_sustained(
        args, trigger, root, service, generator, neighbours, probe.samples, phases
    )


def _running_line(service: Child) -> dict[str, Any] | None:
    """Wait for the service's ``running`` log line (every query started); None if it died."""
    found: list[dict[str, Any]] = []

    def started() -> bool:
        found[:] = log_events(service.log_path, "running")
        return bool(found)

    outcome = service.watch(1.0, started, _START_TIMEOUT_SECONDS, _nothing)
    return found[0] if outcome == "until" else None


def summarise_sustained(
    args: argparse.Namespace,
    trigger: float,
    root: Path,
    service: Child,
    generator: Child,
    neighbours: Neighbours,
    samples: list[dict[str, Any]],
    phases: Mapping[str, float | None],
) -> dict[str, Any]:
    """Every figure of a sustained (or soak) run."""
    gen_start, gen_end = phases["generating"], phases["generated"]
    assert gen_start is not None and gen_end is not None
    produced = _generator_summary(generator.log_path)
    readings = produced.get("produced", {}).get(SENSORS, 0)
    batches = logged_batches(service.log_path)
    tables = {name: asdict(table_stats(root / name)) for name in delta_tables(root)}
    floor = 2 * args.rate * trigger
    lag = {
        topic: _lag_summary(samples, topic, gen_start, gen_end, floor)
        for topic in (samples[0]["lag"] if samples else {})
    }
    drained = phases["drained"]
    for topic_lag in lag.values():
        topic_lag["drain_seconds"] = None if drained is None else round(drained - gen_end, 1)
    generating = [s for s in service.resources if gen_start <= s.at <= gen_end]
    result: dict[str, Any] = {
        "service_log": str(service.log_path),
        "generator_log": str(generator.log_path),
        "exit_code": service.proc.returncode,
        "generator_exit_code": generator.proc.returncode,
        "phases": {
            k: None if v is None else round(v - service.launched, 1) for k, v in phases.items()
        },
        "production": {
            **produced,
            "rate_requested": args.rate,
            "rate_achieved": round(readings / (gen_end - gen_start), 1),
            "seconds": round(gen_end - gen_start, 1),
        },
        "kafka_lag": lag,
        "spark_max_offsets_behind_latest": _spark_lag_max(samples),
        "batch_durations": _query_summaries(service.log_path, batches),
        "freshness": read_back_freshness(root),
        "resources_generating": resource_summary(generating),
        "resources_all": resource_summary(service.resources),
        "neighbours_generating": {
            "generator": resource_summary(generator.resources),
            "kafka": resource_summary(neighbours.broker),
            "machine": resource_summary(neighbours.machine),
        },
        "tables": tables,
        "lag_samples": [
            {k: s[k] for k in ("at", "end_offsets", "committed", "lag")} for s in samples
        ],
        "metric_samples": [{"at": s["at"], **s["metrics"]} for s in samples],
    }
    if args.mode == "soak":
        window = min(300.0, (gen_end - gen_start) / 2)
        result["soak"] = {
            "window_seconds": window,
            "first": _window(batches, gen_start, gen_start + window),
            "last": _window(batches, gen_end - window, gen_end),
        }
    result["reconciliation"] = [
        _check("service", "exit code", 0, service.proc.returncode),
        _check("generator", "exit code", 0, generator.proc.returncode),
        *(
            _check(
                "service",
                f"{table} rows",
                produced.get("produced", {}).get(topic, 0),
                tables.get(table, {}).get("rows"),
            )
            for topic, table in ((SENSORS, BRONZE_SENSORS.name), (USERS, BRONZE_USERS.name))
        ),
    ]
    return result


def _generator_summary(log_path: Path) -> dict[str, Any]:
    """The generator's last stdout line: counts produced per topic and category."""
    for line in reversed(log_path.read_text(errors="replace").splitlines()):
        with contextlib.suppress(ValueError):
            parsed = json.loads(line)
            if isinstance(parsed, dict) and "produced" in parsed:
                return parsed
    return {}


def _lag_summary(
    samples: Sequence[Mapping[str, Any]], topic: str, start: float, end: float, floor: float
) -> dict[str, Any]:
    """Lag of ``topic`` while the generator ran (records in Kafka the service had not committed).

    Bounded when the largest lag of the last third is at most 1.5 times that of the
    first third, or under ``floor`` (two triggers' worth of records: the normal sawtooth).
    """
    window = [(s["at"], s["lag"][topic]) for s in samples if start <= s["at"] <= end]
    if len(window) < 3:
        return {"samples": len(window), "bounded": None}
    third = (end - start) / 3
    first = max((lag for at, lag in window if at <= start + third), default=0)
    last = max((lag for at, lag in window if at >= end - third), default=0)
    return {
        "samples": len(window),
        "max": max(lag for _, lag in window),
        "max_first_third": first,
        "max_last_third": last,
        "at_end": window[-1][1],
        "bounded": last <= max(1.5 * first, floor),
    }


def _spark_lag_max(samples: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Largest ``kafka_max_offsets_behind_latest`` per series over the samples."""
    largest: dict[str, float] = {}
    for sample in samples:
        for name, value in sample["metrics"].items():
            if name.startswith("lakehouse_ingest_kafka_max_offsets_behind_latest"):
                key = name.removeprefix("lakehouse_ingest_kafka_max_offsets_behind_latest")
                key = key.strip("{}")
                largest[key] = max(largest.get(key, 0.0), value)
    return largest


def _window(batches: Sequence[Batch], start: float, end: float) -> dict[str, dict[str, Any]]:
    inside = [b for b in batches if start <= b.ended <= end]
    return {q: batch_summary(bs) for q, bs in by_query(inside).items()}


def read_back_freshness(root: Path) -> dict[str, dict[str, Any]]:
    """Freshness of silver/sensor_readings and every gold table, read with a local Spark."""
    print("reading the tables back with Spark ...", flush=True)
    spark = build_spark(load_settings(spark_ui_enabled=False, log_level="ERROR"))
    try:
        tables = [
            t for t in delta_tables(root) if t == SENSOR_READINGS.name or t.startswith("gold/")
        ]
        return {table: freshness(spark, root / table) for table in tables}
    finally:
        spark.stop()


# -- report --------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """The machine: CPUs, memory, CPU model, kernel and load."""
    meminfo = Path("/proc/meminfo").read_text()
    mem_kib = next(
        int(line.split()[1]) for line in meminfo.splitlines() if line.startswith("MemTotal")
    )
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    model = next(
        (line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), None
    )
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "memory_gib": round(mem_kib / 2**20, 1),
        "cpu_model": model,
        "kernel": platform.release(),
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
    }


def versions() -> dict[str, Any]:
    """Versions of what runs: Python packages, Java, the jars, the repo's commit."""
    packages = (
        "lakehouse-ingest",
        "pyspark",
        "delta-spark",
        "confluent-kafka",
        "prometheus-client",
    )
    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False)
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True, check=False
    )
    return {
        "python": platform.python_version(),
        **{name: importlib.metadata.version(name) for name in packages},
        "java": (java.stderr.splitlines() or ["?"])[0],
        "kafka_broker_jars": sorted(
            p.name for p in (default_cache_dir() / "jars" / "kafka").glob("kafka_2.13-*.jar")
        ),
        "spark_jars": sorted(p.name for p in Path(Settings().jars_dir).glob("*.jar")),
        "git_commit": commit.stdout.strip(),
        "git_dirty": bool(dirty.stdout.strip()),
    }


def _fmt(value: object, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print ``rows`` under ``headers`` in aligned columns (first left, the rest right)."""
    cells = [list(headers), *([_fmt(c) for c in row] for row in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    print(f"\n{title}")
    for row in cells:
        print(
            "  "
            + "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )


def print_backlog(result: Mapping[str, Any]) -> None:
    """The backlog report: one line per variant, then rows and files per table."""
    variants = result["variants"]
    print_table(
        "backlog (rows = sensor readings read; after start = first batch start → last batch end;"
        " RSS, CPU: the process group, Python + JVM)",
        [
            "variant",
            "exit",
            "wall s",
            "startup s",
            "processing s",
            "rows/s after start",
            "rows/s wall",
            "RSS max MiB",
            "CPU s",
            "CPU avg %",
        ],
        [
            [
                name,
                v["exit_code"],
                v["wall_seconds"],
                v.get("startup_seconds"),
                v.get("processing_seconds"),
                v.get("rows_per_second_after_start"),
                v["rows_per_second_wall"],
                v["resources"].get("rss_mib_max"),
                v["resources"].get("cpu_seconds"),
                v["resources"].get("cpu_percent_avg"),
            ]
            for name, v in variants.items()
        ],
    )
    print_table(
        "batches per query (trigger wall time; foreachBatch = inside the writer)",
        [
            "variant / query",
            "batches",
            "rows",
            "total s",
            "p50 s",
            "max s",
            "foreachBatch s",
            "jobs p50",
            "jobs max",
        ],
        [
            [
                f"{name} / {q}",
                s["batches"],
                s["input_rows"],
                s["seconds_total"],
                s["seconds_p50"],
                s["seconds_max"],
                s.get("foreach_batch_seconds_total"),
                s.get("spark_jobs_p50"),
                s.get("spark_jobs_max"),
            ]
            for name, v in variants.items()
            for q, s in v["queries"].items()
        ],
    )
    _print_tables({name: v["tables"] for name, v in variants.items()})


def print_sustained(result: Mapping[str, Any]) -> None:
    """The sustained/soak report: production, lag, batches, freshness, resources, tables."""
    production = result["production"]
    print(
        f"\nproduced {production.get('produced', {})} in {production['seconds']} s: "
        f"{production['rate_achieved']}/s of {production['rate_requested']:g}/s requested"
    )
    print_table(
        "Kafka lag while producing (records in Kafka minus those the service committed)",
        ["topic", "max", "max 1st third", "max last third", "at end", "drain s", "bounded"],
        [
            [
                t,
                v.get("max"),
                v.get("max_first_third"),
                v.get("max_last_third"),
                v.get("at_end"),
                v.get("drain_seconds"),
                v.get("bounded"),
            ]
            for t, v in result["kafka_lag"].items()
        ],
    )
    spark_lag = ", ".join(
        f"{k} {_fmt(v)}" for k, v in result["spark_max_offsets_behind_latest"].items()
    )
    print(f"  the service's kafka_max_offsets_behind_latest, largest sampled: {spark_lag or '-'}")
    print_table(
        "batch durations (s) and Spark jobs per batch",
        ["query", "batches", "rows", "p50", "p99", "max", "jobs p50", "jobs max"],
        [
            [
                q,
                s["batches"],
                s["input_rows"],
                s["seconds_p50"],
                s["seconds_p99"],
                s["seconds_max"],
                s.get("spark_jobs_p50"),
                s.get("spark_jobs_max"),
            ]
            for q, s in result["batch_durations"].items()
        ],
    )
    if "soak" in result:
        soak = result["soak"]
        first, last = soak["first"], soak["last"]
        print_table(
            f"batch durations, first vs last {soak['window_seconds'] / 60:.1f} min (s)",
            ["query", "first p50", "first p99", "last p50", "last p99"],
            [
                [
                    q,
                    first.get(q, {}).get("seconds_p50"),
                    first.get(q, {}).get("seconds_p99"),
                    last.get(q, {}).get("seconds_p50"),
                    last.get(q, {}).get("seconds_p99"),
                ]
                for q in sorted(set(first) | set(last))
            ],
        )
    print_table(
        "freshness (s from basis to the commit that made the row visible)",
        ["table", "basis", "rows", "p50", "p99", "max"],
        [
            [
                t,
                f.get("basis"),
                f.get("rows"),
                f.get("seconds_p50"),
                f.get("seconds_p99"),
                f.get("seconds_max"),
            ]
            for t, f in result["freshness"].items()
        ],
    )
    print_table(
        "driver process group (Python + JVM; CPU 100 % = one core)",
        ["period", "RSS p50 MiB", "RSS max MiB", "CPU avg %", "CPU p50 %", "CPU max %"],
        [
            [
                p,
                r.get("rss_mib_p50"),
                r.get("rss_mib_max"),
                r.get("cpu_percent_avg"),
                r.get("cpu_percent_p50"),
                r.get("cpu_percent_max"),
            ]
            for p, r in (
                ("while producing", result["resources_generating"]),
                ("whole run", result["resources_all"]),
            )
        ],
    )
    neighbours = result["neighbours_generating"]
    print_table(
        f"CPU while producing (%, 100 = one core; the machine has {100 * (os.cpu_count() or 1)})",
        ["process", "CPU avg %", "CPU p50 %", "CPU max %"],
        [
            [name, r.get("cpu_percent_avg"), r.get("cpu_percent_p50"), r.get("cpu_percent_max")]
            for name, r in (
                ("driver", result["resources_generating"]),
                ("generator", neighbours["generator"]),
                ("Kafka broker", neighbours["kafka"]),
                ("machine, all processes", neighbours["machine"]),
            )
        ],
    )
    _print_tables({"sustained": result["tables"]})


def _print_tables(by_run: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> None:
    names = sorted({table for tables in by_run.values() for table in tables})
    print_table(
        "tables (rows / files)",
        ["table", *by_run],
        [[name, *(_rows_files(tables.get(name)) for tables in by_run.values())] for name in names],
    )


def _rows_files(stats: Mapping[str, Any] | None) -> str:
    return "-" if stats is None else f"{_fmt(stats['rows'])} / {_fmt(stats['files'])}"


def print_reconciliation(checks: Sequence[Mapping[str, Any]]) -> bool:
    """Print every failed check as MISMATCH; return whether all passed."""
    failed = [c for c in checks if not c["ok"]]
    for check in failed:
        expected, actual = _fmt(check["expected"]), _fmt(check["actual"])
        print(f"MISMATCH {check['scope']}: {check['check']}: expected {expected}, got {actual}")
    if not failed:
        print(f"\nreconciliation: {len(checks)} checks OK (bronze rows = produced, exit codes 0)")
    return not failed


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; exit 1 if a process failed or bronze does not match what was produced."""
    args = parse_args(argv)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    work: Path = args.work_dir or VAR / f"run-{stamp}"
    json_out: Path = args.json_out or VAR / f"bench-{stamp}.json"
    configure_logging("console", "WARNING")
    report: dict[str, Any] = {
        "mode": args.mode,
        "started_at": datetime.now(UTC).isoformat(),
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "machine": machine(),
        "versions": versions(),
        "work_dir": str(work),
    }
    broker = KafkaBroker(work / "kafka", log_path=work / "logs" / "kafka.log")
    try:
        print(f"starting Kafka (work dir {work}) ...", flush=True)
        broker.start()
        broker.create_topics([USERS, SENSORS], partitions=PARTITIONS)
        if args.mode == "backlog":
            report["backlog"] = run_backlog(args, broker, work)
        else:
            report[args.mode] = run_sustained(args, broker, work)
    finally:
        broker.stop()
        if not args.keep_data:
            for data in (work / "kafka", *work.glob("lake-*")):
                shutil.rmtree(data, ignore_errors=True)
    report["finished_at"] = datetime.now(UTC).isoformat()
    report["machine"]["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    result = report[args.mode]
    if args.mode == "backlog":
        print_backlog(result)
    else:
        print_sustained(result)
    ok = print_reconciliation(result["reconciliation"])
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(report, indent=2, sort_keys=True))
    print(f"\nJSON report: {json_out}\nlogs: {work / 'logs'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
