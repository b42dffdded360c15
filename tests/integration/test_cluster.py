"""The service on a real Spark standalone cluster: a master and two workers on loopback.

Executors run in their own JVMs (children of the workers), read the real Kafka
and write the real S3 server; the driver's /metrics counts both executors, as many as
its configuration asks for; one worker is killed with SIGKILL mid-run, the driver counts
one executor left, and bronze still holds every produced record exactly once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyspark
import pytest
from devstack import free_port
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql import SparkSession

from service.config import Settings
from tests.support.lake import Lake, assert_bronze_exactly_once

pytestmark = pytest.mark.integration

SPARK_HOME = Path(pyspark.__file__).resolve().parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"


def get_json(port: int) -> Any:
    """The JSON status page of a standalone master or worker web UI."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/", timeout=5) as response:
        return json.load(response)


@dataclass
class SparkDaemon:
    """A Spark standalone master or worker JVM in its own process group."""

    name: str
    args: list[str]
    env: Mapping[str, str]
    log_path: Path
    webui_port: int
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> None:
        """Launch ``spark-class`` in the foreground of a new session."""
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(SPARK_CLASS), *self.args],
                env={**os.environ, **self.env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill9(self) -> None:
        """SIGKILL the daemon and everything it launched (a worker's executors)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def status(self) -> Any:
        """This daemon's JSON status page."""
        return get_json(self.webui_port)


@dataclass
class StandaloneCluster:
    """A master and its workers; ``url`` is what ``INGEST_SPARK_MASTER`` gets."""

    master: SparkDaemon
    workers: list[SparkDaemon]
    work_dirs: list[Path]
    url: str

    def wait_for_workers(self, timeout: float = 90) -> None:
        """Block until every worker has registered with the master."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                alive = [w for w in self.master.status()["workers"] if w["state"] == "ALIVE"]
                if len(alive) == len(self.workers):
                    return
            time.sleep(0.5)
        logs = "\n".join(d.log_path.read_text()[-2000:] for d in [self.master, *self.workers])
        raise AssertionError(f"workers did not register within {timeout}s:\n{logs}")

    def app_ids(self) -> list[str]:
        """Ids of the applications the master knows (running or finished)."""
        status = self.master.status()
        return [app["id"] for app in status["activeapps"] + status["completedapps"]]


@pytest.fixture
def cluster(tmp_path: Path, s3_env: dict[str, str]) -> Iterator[StandaloneCluster]:
    """One master and two 1-core / 1 GiB workers on 127.0.0.1, killed after the test."""
    daemon_env = {
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_DAEMON_MEMORY": "256m",
        # Executors inherit the worker's environment: S3 credentials reach them this
        # way, never through the Spark configuration (as pods get them from a Secret).
        **s3_env,
        "PYSPARK_PYTHON": sys.executable,
    }
    port, master_webui = free_port(), free_port()
    master = SparkDaemon(
        "master",
        [
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(master_webui),
        ],
        daemon_env,
        tmp_path / "spark-master.log",
        master_webui,
    )
    url = f"spark://127.0.0.1:{port}"
    workers: list[SparkDaemon] = []
    work_dirs: list[Path] = []
    for n in (1, 2):
        work_dir = tmp_path / f"worker-{n}"
        work_dir.mkdir()
        webui = free_port()
        workers.append(
            SparkDaemon(
                f"worker-{n}",
                [
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    "127.0.0.1",
                    "--webui-port",
                    str(webui),
                    "--cores",
                    "1",
                    "--memory",
                    "1g",
                    "--work-dir",
                    str(work_dir),
                    url,
                ],
                {**daemon_env, "SPARK_LOCAL_DIRS": str(work_dir / "scratch")},
                tmp_path / f"spark-worker-{n}.log",
                webui,
            )
        )
        work_dirs.append(work_dir)
    started = StandaloneCluster(master, workers, work_dirs, url)
    try:
        master.start()
        for worker in workers:
            worker.start()
        started.wait_for_workers()
        yield started
    finally:
        for daemon in [*workers, master]:
            daemon.kill9()


def executor_dirs(work_dir: Path, app_id: str) -> list[Path]:
    """The executor directories a worker created for ``app_id`` (one per executor JVM)."""
    app_dir = work_dir / app_id
    return sorted(p for p in app_dir.iterdir() if p.is_dir()) if app_dir.is_dir() else []


def wait_for_executors_on_every_worker(
    cluster: StandaloneCluster, timeout: float
) -> tuple[str, list[int]]:
    """Block until the app runs an executor on each worker; return its id and executor ids."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, KeyError):
            apps = cluster.app_ids()
            if apps:
                per_worker = [
                    [e["id"] for e in w.status()["executors"] if e["appid"] == apps[0]]
                    for w in cluster.workers
                ]
                if all(per_worker):
                    return apps[0], [ids[0] for ids in per_worker]
        time.sleep(0.5)
    raise AssertionError(f"the app did not get an executor on both workers within {timeout}s")


def executor_gauges(http_port: int) -> tuple[float | None, float | None]:
    """The driver's executors registered and expected, from its /metrics (None: absent)."""
    url = f"http://127.0.0.1:{http_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    return (
        samples.get("lakehouse_ingest_executors"),
        samples.get("lakehouse_ingest_executors_expected"),
    )


def wait_for_executor_gauges(
    http_port: int,
    expected: tuple[float, float],
    timeout: float,
    running: Callable[[], bool] = lambda: True,
) -> None:
    """Block until the driver exports ``expected`` (executors registered, expected); fail
    after ``timeout`` or once the driver is no longer ``running``."""
    deadline = time.monotonic() + timeout
    seen: tuple[float | None, float | None] | str = "no answer"
    while time.monotonic() < deadline and running():
        with contextlib.suppress(OSError):
            seen = executor_gauges(http_port)
            if expected == seen:
                return
        time.sleep(0.5)
    ended = "" if running() else " (the driver ended)"
    raise AssertionError(f"the driver last exported {seen}, not {expected}{ended}")


@pytest.mark.timeout(1800)
def test_standalone_cluster_run_survives_a_worker_kill_with_bronze_exactly_once(
    spark: SparkSession, lake: Lake, cluster: StandaloneCluster
) -> None:
    lake.generate("--users", "2000", "--readings", "60000", "--seed", "17")
    http_port = free_port()
    driver = lake.service(
        "cluster-driver",
        "run",
        "--available-now",
        INGEST_HTTP_PORT=str(http_port),
        INGEST_SPARK_MASTER=cluster.url,
        INGEST_SPARK_DRIVER_HOST="127.0.0.1",
        INGEST_SPARK_EXECUTOR_MEMORY="1g",
        INGEST_SPARK_EXECUTOR_CORES="1",
        INGEST_SPARK_CORES_MAX="2",
        # Executors read the jars from the machine's cache, as pods read the image's.
        INGEST_SPARK_EXECUTOR_JARS_DIR=Settings().jars_dir,
        INGEST_KAFKA_MAX_OFFSETS_PER_TRIGGER="10000",
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
    ).start()
    try:
        app_id, executor_ids = wait_for_executors_on_every_worker(cluster, timeout=300)
        # Both registered with the driver, which asks for 2 (cores max 2, 1 per executor).
        wait_for_executor_gauges(http_port, (2.0, 2.0), timeout=120)
        # Several sensors batches remain after the first: the kill lands mid-run.
        driver.wait_for_log('"event": "batch_written"', timeout=600)
        assert driver.alive(), "the run finished before a worker could be killed"
        cluster.workers[0].kill9()
        # The driver counts the executor lost with its worker while the run goes on (here,
        # under a CI's load: within 4 s of the kill, some 45 s before the run ended).
        wait_for_executor_gauges(http_port, (1.0, 2.0), timeout=120, running=driver.alive)
        assert driver.wait(timeout=900) == 0, driver.log_text()[-4000:]
    finally:
        driver.cleanup()

    # Each worker launched its own executor JVM for the app, and both ran tasks.
    for work_dir, executor_id in zip(cluster.work_dirs, executor_ids, strict=True):
        dirs = executor_dirs(work_dir, app_id)
        assert str(executor_id) in [d.name for d in dirs], f"{work_dir}: {dirs}"
        stderr = (work_dir / app_id / str(executor_id) / "stderr").read_text(errors="replace")
        assert "Successfully registered with driver" in stderr
        assert "Running task" in stderr, stderr[-2000:]
        # The jars are copied once per executor, into its directory, not also into a cache
        # in the worker's local directory (~680 MB each).
        assert [] == [p.name for p in (work_dir / "scratch").rglob("*.jar")]
    assert_bronze_exactly_once(spark, lake)
