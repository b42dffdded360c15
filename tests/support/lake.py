"""One test's lake: its topics and storage root, the service's environment for them, and
what the service wrote there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from devstack import KafkaBroker, MinioServer
from pyspark.sql import Column, SparkSession

from service.config import Location, Settings
from service.lake.lakeview import LakeReader
from service.lake.object_files import ObjectFiles
from service.lake.tables import SHIPPED
from tests.support.kafka import Coordinates, topic_coordinates
from tests.support.repo import REPO
from tests.support.service_process import TEST_JVM_OPTIONS, ServiceProcess

# Files of a local lake (no S3 settings).
LOCAL_FILES = ObjectFiles(Settings(storage_root="/nowhere", checkpoint_root="/nowhere"))


@dataclass(frozen=True)
class Run:
    """A finished command: exit code, stdout, stderr and wall time."""

    code: int
    out: str
    err: str
    seconds: float

    def json_lines(self) -> list[dict[str, Any]]:
        """Its stdout's lines, each a JSON document."""
        return [json.loads(line) for line in self.out.splitlines()]


@dataclass(frozen=True)
class Lake:
    """One test's topics, storage root and the environment that points the service at them."""

    users_topic: str
    sensors_topic: str
    storage_root: str
    bootstrap_servers: str
    s3_env: Mapping[str, str]
    work_dir: Path
    alerts_topic: str

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

    @property
    def consumer_group(self) -> str:
        """The consumer group the service copies this lake's offsets to (its default)."""
        return Settings(storage_root=self.storage_root).consumer_group

    def _delta_rs_options(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.s3_env["AWS_ENDPOINT_URL"],
            "AWS_ACCESS_KEY_ID": self.s3_env["AWS_ACCESS_KEY_ID"],
            "AWS_SECRET_ACCESS_KEY": self.s3_env["AWS_SECRET_ACCESS_KEY"],
            "AWS_REGION": self.s3_env["AWS_REGION"],
            "AWS_ALLOW_HTTP": "true",
        }

    def rows(self, table: str) -> int:
        """The rows of ``table`` (a name under the storage root, ``silver/orders``) by its
        log's file statistics, read with delta-rs: no Spark job, for a test that polls
        while a driver shares the cores; -1 before the table exists."""
        uri = f"{Location(self.storage_root).for_delta_rs()}/{table}"
        try:
            delta = DeltaTable(uri, storage_options=self._delta_rs_options())
        except TableNotFoundError:
            return -1
        counts = delta.get_add_actions(flatten=True).column("num_records").to_pylist()
        assert None not in counts, f"{table}: a file without statistics"
        return sum(counts)

    def delta_rs_rows(self) -> dict[str, int]:
        """Rows of every table of the lake, read whole by delta-rs into Arrow and validated
        in full (UTF-8 of every string included), as a reader other than Spark would."""
        reader = LakeReader(Location(self.storage_root).for_delta_rs(), self._delta_rs_options())
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

    def killed_at(
        self,
        name: str,
        phase: str,
        env: Mapping[str, str],
        args: tuple[str, ...] = ("run",),
        timeout: float = 300,
    ) -> ServiceProcess:
        """The service (``args``) with ``env`` SIGKILLed at the commit ``phase``
        (`tests.support.crash_at`), logging to ``<work_dir>/<name>.log``; returned once it
        died there."""
        driver = ServiceProcess(
            self.env(CRASH_AT=phase, **env),
            self.work_dir / f"{name}.log",
            args,
            module="tests.support.crash_at",
        ).start()
        try:
            assert -9 == driver.wait(timeout=timeout), driver.log_text()[-4000:]
            assert [phase] == [e["phase"] for e in driver.events("crash_point")]
        finally:
            driver.cleanup()
        return driver

    @classmethod
    def fresh(
        cls,
        name: str,
        broker: KafkaBroker,
        s3_env: Mapping[str, str],
        work_dir: Path,
        users_config: Mapping[str, str] | None = None,
    ) -> Lake:
        """New 3-partition topics on ``broker`` (the users topic with ``users_config``), a
        new storage root named after ``name`` and an alerts topic of its own (the service
        creates it when gold runs)."""
        suffix = uuid.uuid4().hex[:8]
        lake = cls(
            users_topic=f"users-{suffix}",
            sensors_topic=f"sensors-{suffix}",
            storage_root=f"s3a://lakehouse/{name[:40]}-{suffix}",
            bootstrap_servers=broker.bootstrap_servers,
            s3_env=s3_env,
            work_dir=work_dir,
            alerts_topic=f"alerts-{suffix}",
        )
        broker.create_topics([lake.users_topic], partitions=3, config=users_config)
        broker.create_topics([lake.sensors_topic], partitions=3)
        return lake

    def at_new_root(self, name: str, work_dir: Path) -> Lake:
        """A second lake reading this one's topics: a new storage root named after
        ``name`` and an alerts topic of its own."""
        suffix = uuid.uuid4().hex[:8]
        return replace(
            self,
            storage_root=f"s3a://lakehouse/{name[:40]}-{suffix}",
            work_dir=work_dir,
            alerts_topic=f"alerts-{suffix}",
        )

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
        result = self._run(("generate", *args), env, timeout=600)
        return _summary_line(result.code, result.out, result.err)

    def cli(self, *args: str, **env: str) -> Run:
        """``python -m service ARGS`` on this lake as an operator runs it (``env`` overrides
        its settings; logs at WARNING), to completion."""
        return self._run(args, env, timeout=240)

    def reconcile(self) -> tuple[int, dict[str, Any]]:
        """Run the ``reconcile --json`` verb on this lake: its exit code and its report."""
        result = self._run(("reconcile", "--json"), {}, timeout=120)
        assert result.out, result.err[-3000:]
        return result.code, json.loads(result.out)

    def _run(self, args: tuple[str, ...], env: Mapping[str, str], timeout: float) -> Run:
        """``python -m service ARGS`` on this lake at WARNING, to completion."""
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "service", *args],
            cwd=REPO,
            env={**os.environ, **self.env(INGEST_LOG_LEVEL="WARNING", **env)},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return Run(result.returncode, result.stdout, result.stderr, time.monotonic() - started)

    def table(self, name: str) -> str:
        """URI of table ``name`` in this lake."""
        return f"{self.storage_root}/{name}"


def generator_summary(generator: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    """Wait for a generator started by `Lake.producing` and return its JSON summary."""
    out, err = generator.communicate(timeout=timeout)
    return dict(json.loads(_summary_line(generator.returncode, out, err)))


def _summary_line(code: int, out: str, err: str) -> str:
    """A generator's summary (its last line on stdout), or a failure that shows everything
    it printed: its exit code, stdout and stderr."""
    lines = out.strip().splitlines()
    assert code == 0 and lines and lines[-1].startswith('{"by_category"'), (
        f"generator exit {code}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
    )
    return lines[-1]


class LakeFactory(Protocol):
    """`Lake.fresh` on the session's broker and MinIO (the ``make_lake`` fixture)."""

    def __call__(
        self,
        name: str,
        users_config: Mapping[str, str] | None = None,
        work_dir: Path | None = None,
    ) -> Lake:
        """A fresh lake named after ``name`` (``work_dir``: a new temporary directory)."""
        ...


def storage_env(server: MinioServer) -> dict[str, str]:
    """The standard AWS variables that point s3a (and boto3) at ``server``."""
    return {
        "AWS_ENDPOINT_URL": server.endpoint_url,
        "AWS_ACCESS_KEY_ID": server.access_key,
        "AWS_SECRET_ACCESS_KEY": server.secret_key,
        "AWS_REGION": "us-east-1",
    }


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
