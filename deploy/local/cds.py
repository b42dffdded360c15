"""Build the driver JVM's class-data-sharing archive from a real driver run (`make cds`).

    python deploy/local/cds.py ARCHIVE

A driver start loads and verifies some 20,000 classes (Spark, Delta, the Kafka source,
s3a); an archive of them, mapped at start, saves about a third of a start's CPU. The
archive is made the way the JVM (17) makes one: a driver ingests a few hundred records
from a throwaway local Kafka into a throwaway lake on a throwaway local MinIO (so that
the archive holds s3a's and the AWS SDK's classes too, some 2,500), gold on, with
``-XX:ArchiveClassesAtExit``; the JVM writes the archive when it exits. It is valid for
these jars, this PySpark and this JDK only (``make cds`` rebuilds it when they change);
a driver skips an archive it cannot use (service/streaming/session.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from devstack import KafkaBroker, MinioServer

REPO = Path(__file__).resolve().parents[2]
# Records of every kind, so that quarantine, dedup and the users MERGE load their classes.
MIX = ["--bad-fraction", "0.1", "--duplicate-fraction", "0.05", "--late-fraction", "0.05",
       "--user-update-fraction", "0.1", "--tombstone-fraction", "0.02"]  # fmt: skip


def _wait_for_group_exit(pgid: int, timeout: float) -> None:
    """Block until no process of group ``pgid`` is left (the JVM outlives Python)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    raise SystemExit(f"cds: the driver JVM did not exit within {timeout:.0f}s")


def build(archive: Path) -> None:
    """Run one driver with ``-XX:ArchiveClassesAtExit`` and move its archive to ``archive``."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f"{archive.name}.{os.getpid()}.partial")
    with tempfile.TemporaryDirectory(prefix="lakehouse-cds-") as scratch:
        work = Path(scratch)
        with KafkaBroker(work / "kafka") as broker, MinioServer(work / "minio") as minio:
            broker.create_topics(["users", "sensors"], partitions=3)
            minio.create_bucket("lakehouse")
            env = {
                **os.environ,
                "AWS_ENDPOINT_URL": minio.endpoint_url,
                "AWS_ACCESS_KEY_ID": minio.access_key,
                "AWS_SECRET_ACCESS_KEY": minio.secret_key,
                "AWS_REGION": "us-east-1",
                "INGEST_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
                "INGEST_STORAGE_ROOT": "s3a://lakehouse/cds",
                "INGEST_HTTP_PORT": "0",
                "INGEST_SPARK_UI_ENABLED": "false",
                "INGEST_LOG_LEVEL": "WARNING",
                "INGEST_SPARK_CDS_ARCHIVE": "",  # none to start from: this run makes it
                "INGEST_SPARK_EXTRA_CONF": json.dumps(
                    {
                        "spark.driver.extraJavaOptions": f"-XX:ArchiveClassesAtExit={partial} "
                        "-Xlog:cds=error -Xlog:cds+dynamic=error "
                        # Which classes load does not depend on the JIT or the collector:
                        # C1 only and the serial collector record an archive as complete
                        # (20,400-20,600 classes from it either way; G1 drivers map it too)
                        # for 96 CPU-s against 149 (the code cache sized for gold's code).
                        "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=240m"
                    }
                ),
            }
            service = [sys.executable, "-m", "service"]
            subprocess.run(
                [*service, "generate", "--readings", "300", "--users", "20", *MIX],
                env=env,
                check=True,
                cwd=REPO,
                stdout=subprocess.DEVNULL,
            )
            driver = subprocess.Popen(
                [*service, "run", "--available-now"], env=env, cwd=REPO, start_new_session=True
            )
            if driver.wait(timeout=600) != 0:
                raise SystemExit(f"cds: the driver run exited {driver.returncode}")
            _wait_for_group_exit(driver.pid, timeout=120)
    if not partial.is_file():
        raise SystemExit(f"cds: the driver JVM wrote no archive at {partial}")
    partial.replace(archive)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("archive", type=Path)
    build(parser.parse_args().archive.resolve())


if __name__ == "__main__":
    main()
