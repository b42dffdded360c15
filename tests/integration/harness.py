"""Run the real service as a child process and inspect what it wrote, for integration tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition
from devstack import KafkaBroker
from pyspark.sql import Column, SparkSession

from service.config import Location
from service.lake.lakeview import LakeReader
from service.lake.tables import SHIPPED

REPO = Path(__file__).resolve().parents[2]
# A test's driver (and a cluster test's executor) lives seconds to a few minutes, and
# most of its CPU went to C2 compiling code for a run that ends before it pays back.
# C1 only and the serial collector: a 6,500-record `run --available-now` took 58-64 ->
# 35-37 CPU-s, 32-34 -> 25-26 s (README, Performance). Neither changes a result, only how
# fast the JVM gets there. C1 alone would reserve the client VM's 48 MB of code cache,
# which a driver with gold on fills ("Out of space in CodeCache", its queries fail):
# the default JVM's 240 MB.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=240m"
Coordinates = set[tuple[str, int, int]]

PROFILE = ("first_name", "last_name", "dob", "gender", "country")


@dataclass
class ServiceProcess:
    """``python -m MODULE ARGS`` (the service) in its own process group, logging to a file."""

    env: Mapping[str, str]
    log_path: Path
    args: tuple[str, ...] = ("run",)
    module: str = "service"
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> ServiceProcess:
        """Launch the service."""
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module, *self.args],
            cwd=REPO,
            env={**os.environ, **self.env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    @property
    def pid(self) -> int:
        """The Python driver's pid."""
        assert self.proc is not None
        return self.proc.pid

    def wait(self, timeout: float) -> int:
        """Wait for exit and return the exit code."""
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def alive(self) -> bool:
        """Whether the driver process is still running."""
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """Crash the driver: SIGKILL its whole process group (Python and the Spark JVM)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def terminate(self) -> None:
        """Send SIGTERM to the driver process only, as Kubernetes (through tini) does."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    def interrupt_group(self) -> None:
        """Send SIGINT to the whole process group, as Ctrl-C in a terminal does."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGINT)

    def cleanup(self) -> None:
        """Kill anything left of the process group."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def log_text(self) -> str:
        """Everything the service printed so far."""
        return self.log_path.read_text(errors="replace")

    def events(self, event: str | None = None) -> list[dict[str, Any]]:
        """The JSON log lines named ``event`` (None: all) printed so far, in order."""
        lines = []
        for line in self.log_text().splitlines():
            with contextlib.suppress(ValueError):
                parsed = json.loads(line)
                if isinstance(parsed, dict) and event in (None, parsed.get("event")):
                    lines.append(parsed)
        return lines

    def jvm_mapped_files(self) -> set[str]:
        """The files mapped into the memory of the driver's JVM (the java process of its group)."""
        assert self.proc is not None
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError):
                process_group = int(stat.read_text().rsplit(")", 1)[1].split()[2])
                java = (stat.parent / "comm").read_text() == "java\n"
                if process_group == self.proc.pid and java:
                    fields = (line.split(None, 5) for line in (stat.parent / "maps").open())
                    return {f[5].rstrip("\n") for f in fields if len(f) == 6}
        raise AssertionError(f"no JVM in the driver's process group:\n{self.log_text()[-4000:]}")

    def wait_for_log(self, needle: str, timeout: float, count: int = 1) -> None:
        """Block until ``needle`` appears ``count`` times in this run's log; fail if it dies."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.log_text().count(needle) >= count:
                return
            if not self.alive():
                raise AssertionError(
                    f"service exited before {needle!r}:\n{self.log_text()[-4000:]}"
                )
            time.sleep(0.5)
        raise AssertionError(f"{needle!r} not logged within {timeout}s:\n{self.log_text()[-4000:]}")


@dataclass(frozen=True)
class KafkaRecord:
    """One record read back from the broker."""

    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None


def topic_records(bootstrap_servers: str, topic: str) -> list[KafkaRecord]:
    """Every record currently in ``topic``, read back from the broker."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"harness-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=30)
        partitions = sorted(metadata.topics[topic].partitions)
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            for p in partitions
        }
        pending = {p for p in partitions if ends[p][1] > ends[p][0]}
        consumer.assign([TopicPartition(topic, p, ends[p][0]) for p in pending])
        records: list[KafkaRecord] = []
        while pending:
            msg = consumer.poll(10)
            if msg is None:
                raise AssertionError(f"timed out reading {topic}; still pending {pending}")
            error, partition, offset = msg.error(), msg.partition(), msg.offset()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    pending.discard(partition)
                    continue
                raise AssertionError(str(error))
            assert partition is not None and offset is not None
            records.append(
                KafkaRecord(partition, offset, msg.timestamp()[1], msg.key(), msg.value())
            )
            if offset + 1 >= ends[partition][1]:
                pending.discard(partition)
        return records
    finally:
        consumer.close()


def topic_coordinates(bootstrap_servers: str, topic: str) -> Coordinates:
    """Every (topic, partition, offset) currently in ``topic``."""
    return {(topic, r.partition, r.offset) for r in topic_records(bootstrap_servers, topic)}


@dataclass(frozen=True)
class Lake:
    """One test's topics, storage root and the environment that points the service at them."""

    users_topic: str
    sensors_topic: str
    storage_root: str
    bootstrap_servers: str
    s3_env: Mapping[str, str]
    work_dir: Path
    alerts_topic: str = "alerts"

    def env(self, **overrides: str) -> dict[str, str]:
        """Service environment for this lake (small batches, fast triggers, no UI, JVMs
        tuned to live briefly); ``INGEST_SPARK_EXTRA_CONF`` in ``overrides`` adds to it."""
        return {
            **self.s3_env,
            "INGEST_KAFKA_BOOTSTRAP_SERVERS": self.bootstrap_servers,
            "INGEST_USERS_TOPIC": self.users_topic,
            "INGEST_SENSORS_TOPIC": self.sensors_topic,
            "INGEST_ALERTS_TOPIC": self.alerts_topic,
            "INGEST_STORAGE_ROOT": self.storage_root,
            "INGEST_HTTP_PORT": "0",
            "INGEST_SPARK_UI_ENABLED": "false",
            "INGEST_SPARK_MASTER": "local[2]",
            "INGEST_SPARK_DRIVER_MEMORY": "1g",
            "INGEST_SPARK_SHUFFLE_PARTITIONS": "2",  # one task per core
            "INGEST_TRIGGER_INTERVAL_SECONDS": "1",
            "INGEST_LEASE_TTL_SECONDS": "8",
            "INGEST_LEASE_RENEW_SECONDS": "2",
            # Gold has its own test; elsewhere its five queries would only slow ingest down.
            "INGEST_GOLD_ENABLED": "false",
            # The driver's periodic reconcile has its own tests; elsewhere it would compete
            # for the cores with the queries under test once a driver runs five minutes.
            "INGEST_RECONCILE_INTERVAL_SECONDS": "0",
            **overrides,
            "INGEST_SPARK_EXTRA_CONF": json.dumps(
                {
                    "spark.driver.extraJavaOptions": TEST_JVM_OPTIONS,
                    "spark.executor.extraJavaOptions": TEST_JVM_OPTIONS,
                    **json.loads(overrides.get("INGEST_SPARK_EXTRA_CONF", "{}")),
                }
            ),
        }

    def delta_rs_rows(self) -> dict[str, int]:
        """Rows of every table of the lake, read whole by delta-rs into Arrow and validated
        in full (UTF-8 of every string included), as a reader other than Spark would."""
        options = {
            "AWS_ENDPOINT_URL": self.s3_env["AWS_ENDPOINT_URL"],
            "AWS_ACCESS_KEY_ID": self.s3_env["AWS_ACCESS_KEY_ID"],
            "AWS_SECRET_ACCESS_KEY": self.s3_env["AWS_SECRET_ACCESS_KEY"],
            "AWS_REGION": self.s3_env["AWS_REGION"],
            "AWS_ALLOW_HTTP": "true",
        }
        reader = LakeReader(Location(self.storage_root).for_delta_rs(), options)
        rows = {}
        for table in SHIPPED.tables:
            delta = reader.open_if_exists(table)
            if delta is None:
                continue
            arrow = delta.to_pyarrow_table()
            arrow.validate(full=True)
            rows[table.name] = arrow.num_rows
        return rows

    def service(self, name: str, *args: str, **env: str) -> ServiceProcess:
        """A not-yet-started service process logging to ``<work_dir>/<name>.log``."""
        return ServiceProcess(self.env(**env), self.work_dir / f"{name}.log", args or ("run",))

    @classmethod
    def fresh(
        cls,
        name: str,
        broker: KafkaBroker,
        s3_env: Mapping[str, str],
        work_dir: Path,
        users_config: Mapping[str, str] | None = None,
    ) -> Lake:
        """New 3-partition topics on ``broker`` (the users topic with ``users_config``) and a
        new storage root, named after ``name``."""
        suffix = uuid.uuid4().hex[:8]
        lake = cls(
            users_topic=f"users-{suffix}",
            sensors_topic=f"sensors-{suffix}",
            storage_root=f"s3a://lakehouse/{name[:40]}-{suffix}",
            bootstrap_servers=broker.bootstrap_servers,
            s3_env=s3_env,
            work_dir=work_dir,
        )
        broker.create_topics([lake.users_topic], partitions=3, config=users_config)
        broker.create_topics([lake.sensors_topic], partitions=3)
        return lake

    def producing(self, *args: str, **env: str) -> subprocess.Popen[str]:
        """The generator started with ``args`` (a rate for a duration), not waited for."""
        return subprocess.Popen(
            [sys.executable, "-m", "service", "generate", *args],
            cwd=REPO,
            env={**os.environ, **self.env(INGEST_LOG_LEVEL="WARNING", **env)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def generate(self, *args: str, **env: str) -> str:
        """Run the generator to completion and return its summary line."""
        result = subprocess.run(
            [sys.executable, "-m", "service", "generate", *args],
            cwd=REPO,
            env={**os.environ, **self.env(INGEST_LOG_LEVEL="WARNING", **env)},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert result.returncode == 0, result.stderr + result.stdout
        return result.stdout.strip().splitlines()[-1]

    def reconcile(self) -> tuple[int, dict[str, Any]]:
        """Run the ``reconcile --json`` verb on this lake: its exit code and its report."""
        result = subprocess.run(
            [sys.executable, "-m", "service", "reconcile", "--json"],
            cwd=REPO,
            env={**os.environ, **self.env(INGEST_LOG_LEVEL="WARNING")},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.stdout, result.stderr[-3000:]
        return result.returncode, json.loads(result.stdout)

    def table(self, name: str) -> str:
        """URI of table ``name`` in this lake."""
        return f"{self.storage_root}/{name}"


def copy_storage_root(s3: Any, source: Lake, target: Lake, skip: tuple[str, ...] = ()) -> None:
    """Copy ``source``'s storage root (tables and checkpoints) to ``target``'s, object by
    object on the S3 server, but for keys under the root-relative prefixes ``skip``.

    Delta tables and checkpoints name their files relative to their own location, so
    the copy is the same lake at another root: a test can damage it without touching
    the original.
    """
    bucket, _, prefix = source.storage_root.removeprefix("s3a://").partition("/")
    target_prefix = target.storage_root.removeprefix(f"s3a://{bucket}/")
    skipped = tuple(f"{prefix}/{s}" for s in skip)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/"):
        for item in page.get("Contents", []):
            key = item["Key"]
            if key.startswith(skipped):
                continue
            s3.copy_object(
                Bucket=bucket,
                Key=target_prefix + key.removeprefix(prefix),
                CopySource={"Bucket": bucket, "Key": key},
            )


def table_coordinates(
    spark: SparkSession, uri: str, where: Column | None = None
) -> tuple[Coordinates, int]:
    """The (topic, partition, offset) set of a Delta table's rows, and the row count."""
    table = spark.read.format("delta").load(uri)
    if where is not None:
        table = table.where(where)
    rows = table.select("kafka_topic", "kafka_partition", "kafka_offset").collect()
    return {(r.kafka_topic, r.kafka_partition, r.kafka_offset) for r in rows}, len(rows)


def assert_bronze_exactly_once(spark: SparkSession, lake: Lake) -> Coordinates:
    """Assert each bronze table holds each produced record exactly once; return sensors'."""
    landed: Coordinates = set()
    for topic, table in (
        (lake.users_topic, "bronze/users"),
        (lake.sensors_topic, "bronze/sensors"),
    ):
        produced = topic_coordinates(lake.bootstrap_servers, topic)
        landed, rows = table_coordinates(spark, lake.table(table))
        missing, extra = len(produced - landed), len(landed - produced)
        assert produced == landed, f"{table}: {missing} missing, {extra} not produced"
        assert len(produced) == rows, f"{table}: {rows - len(produced)} duplicate rows"
    return landed


@dataclass(frozen=True)
class ExpectedUser:
    """The final silver/users row of one user, computed from the topic in plain Python."""

    profile: tuple[Any, ...] | None
    updated_at: datetime | None
    is_deleted: bool
    deleted_at: datetime | None


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).replace(tzinfo=None)


def expected_users(records: list[KafkaRecord]) -> dict[int, ExpectedUser]:
    """Newest upsert gives the profile; a tombstone at least as new as it marks deletion."""
    upserts: dict[int, tuple[datetime, int, int, dict[str, Any]]] = {}
    tombstones: dict[int, datetime] = {}
    for r in records:
        assert r.key is not None
        user_id = int(r.key)
        if r.value is None:
            at = datetime.fromtimestamp(r.timestamp_ms / 1000, UTC).replace(tzinfo=None)
            tombstones[user_id] = max(at, tombstones.get(user_id, at))
            continue
        payload = json.loads(r.value)
        candidate = (parse_time(payload["updated_at"]), r.partition, r.offset, payload)
        if user_id not in upserts or candidate[:3] > upserts[user_id][:3]:
            upserts[user_id] = candidate
    result = {}
    for user_id in upserts.keys() | tombstones.keys():
        upsert = upserts.get(user_id)
        deleted = tombstones.get(user_id)
        is_deleted = deleted is not None and (upsert is None or deleted >= upsert[0])
        result[user_id] = ExpectedUser(
            profile=tuple(upsert[3][f] for f in PROFILE) if upsert else None,
            updated_at=upsert[0] if upsert else None,
            is_deleted=is_deleted,
            deleted_at=deleted if is_deleted else None,
        )
    return result


def silver_users(spark: SparkSession, lake: Lake) -> dict[int, ExpectedUser]:
    """silver/users as `ExpectedUser` rows, by user id."""
    return {
        r.user_id: ExpectedUser(
            profile=None if r.updated_at is None else tuple(
                r.dob.isoformat() if f == "dob" and r.dob else r[f] for f in PROFILE
            ),
            updated_at=r.updated_at,
            is_deleted=r.is_deleted,
            deleted_at=r.deleted_at,
        )
        for r in spark.read.format("delta").load(lake.table("silver/users")).collect()
    }  # fmt: skip
