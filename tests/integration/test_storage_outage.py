"""The S3 server stopped for 30 s and for 3 min, and its credentials revoked, under load.

A MinIO of its own (the session's serves the other tests), restarted on the same port
and data directory; "revoked" is the same server restarted with other root
credentials, so every request of the driver is answered 403. The generator produces
throughout and a continuous driver ingests. During each fault /readyz answers 503;
after it the driver is ready again (or, had it exited 1, a restart would resume).
Ends reconciled by Kafka coordinates: bronze holds every produced record once and
silver + quarantine + duplicates = bronze (the reconcile verb), every table readable
by delta-rs.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from devstack import KafkaBroker, MinioServer, free_port

from service.config import Location
from service.lake.lakeview import LakeReader, run_sql
from service.lake.tables import BRONZE_SENSORS, BRONZE_USERS
from tests.support.kafka import topic_coordinates
from tests.support.lake import Lake, generator_summary, storage_env
from tests.support.service_process import ServiceProcess

pytestmark = pytest.mark.integration


def _readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def _watch(port: int, seconds: float, driver: ServiceProcess) -> list[int]:
    """``driver``'s /readyz every second for ``seconds``; 0 once it has exited. Its port is
    free then, and another lane's process may bind it (a driver of another test, whose
    /readyz answered 200 here in a fresh-clone run)."""
    seen = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen.append(_readyz(port) if driver.alive() else 0)
        time.sleep(1)
    return seen


def _until_ready(port: int, driver: ServiceProcess, timeout: float) -> float:
    """Seconds until /readyz answers 200 again."""
    started = time.monotonic()
    while _readyz(port) != 200:
        assert driver.alive(), driver.log_text()[-4000:]
        assert time.monotonic() - started < timeout, driver.log_text()[-4000:]
        time.sleep(1)
    return time.monotonic() - started


def _settled(port: int, driver: ServiceProcess, timeout: float) -> int | None:
    """After a fault: None once /readyz has answered 200 for 5 s in a row with the driver
    alive, or the driver's exit code if it exits first. A write that was retrying S3
    through the fault can still fail just after the storage is back (the driver then
    exits 1 with one line, as the test allows), so one 200 does not settle it.
    """
    started, ready = time.monotonic(), 0
    while ready < 5:
        if not driver.alive():
            return driver.wait(timeout=5)
        assert time.monotonic() - started < timeout, driver.log_text()[-4000:]
        ready = ready + 1 if _readyz(port) == 200 else 0
        time.sleep(1)
    return None


def _outage(minio: MinioServer, seconds: float, port: int, driver: ServiceProcess) -> list[int]:
    minio.stop()
    return _watch(port, seconds, driver)


def _revoked(minio: MinioServer, seconds: float, port: int, driver: ServiceProcess) -> list[int]:
    minio.stop()
    good = (minio.access_key, minio.secret_key)
    minio.access_key, minio.secret_key = "rotated-admin", "rotated-secret-1234"
    try:
        minio.start()
        return _watch(port, seconds, driver)
    finally:
        minio.stop()
        minio.access_key, minio.secret_key = good


def test_storage_outages_and_revoked_credentials_under_load_lose_and_double_nothing(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    with MinioServer(tmp_path / "minio") as minio:
        minio.create_bucket("lakehouse")
        s3_env = storage_env(minio)
        lake = Lake.fresh("storage-outage", kafka_broker, s3_env, tmp_path)
        producer = lake.producing(
            "--users", "10", "--rate", "40", "--duration", "600", "--seed", "5",
            "--bad-fraction", "0.05", "--duplicate-fraction", "0.05",
        )  # fmt: skip
        port = free_port()
        drivers = [lake.service("driver-0", "run", INGEST_HTTP_PORT=str(port)).start()]
        faults: list[tuple[str, Callable[[], list[int]]]] = [
            ("stopped 30 s", lambda: _outage(minio, 30, port, drivers[-1])),
            ("credentials revoked 20 s", lambda: _revoked(minio, 20, port, drivers[-1])),
            ("stopped 3 min", lambda: _outage(minio, 180, port, drivers[-1])),
        ]
        report: dict[str, dict[str, Any]] = {}
        try:
            drivers[0].wait_for_log('"event": "batch_written"', timeout=180)
            _until_ready(port, drivers[0], 60)
            for name, fault in faults:
                time.sleep(5)
                statuses = fault()
                minio.start()
                restored = time.monotonic()
                driver = drivers[-1]
                exit_code = _settled(port, driver, 180)
                if exit_code is not None:  # it stopped; the platform would restart it
                    drivers.append(
                        lake.service(f"driver-{len(drivers)}", "run", INGEST_HTTP_PORT=str(port))
                        .start()
                    )  # fmt: skip
                    _until_ready(port, drivers[-1], 180)
                report[name] = {
                    "not_ready_s": sum(1 for c in statuses if c != 200),
                    "watched_s": len(statuses),
                    "exit": exit_code,
                    "failed": [(e["error_class"], e["error"]) for e in driver.events("failed")],
                    "ready_again_s": round(time.monotonic() - restored, 1),
                }
                # Not ready from the lease TTL (8 s) on, to the end of the fault.
                assert 200 not in statuses[10:], (name, statuses)
            time.sleep(10)  # and under load after the last one too
            assert producer.poll() is None, "the generator stopped before the faults ended"
            producer.terminate()  # it stops producing, flushes and reports
            summary = generator_summary(producer, timeout=120)
            drivers[-1].terminate()
            assert 0 == drivers[-1].wait(timeout=120), drivers[-1].log_text()[-4000:]
        finally:
            if producer.poll() is None:
                producer.kill()
            for driver in drivers:
                driver.cleanup()
        print(json.dumps(report))
        revoked = report["credentials revoked 20 s"]
        # Under load the first write after the rotation meets the 403 and stops the driver,
        # with one line that names the store and the status; then a restart resumes.
        assert 1 == revoked["exit"], revoked
        [(error_class, failed)] = revoked["failed"]
        assert "StorageAccessDeniedError" == error_class, failed
        assert "the storage s3a://lakehouse refused this driver (HTTP 403" in failed, failed
        assert "StorageUnreachable.md" in failed
        for name in ("stopped 30 s", "stopped 3 min"):
            outcome = report[name]
            # Ridden out, or stopped with exit 1 and one line saying why.
            assert (outcome["exit"], len(outcome["failed"])) in ((None, 0), (1, 1)), outcome
        for driver in drivers:
            levels = {e.get("level") for e in driver.events()}
            assert levels <= {"debug", "info", "warn", "warning", "error"}, levels
        assert 0 == summary["delivery_errors"]
        drain = lake.service("drain", "run", "--available-now").start()
        try:
            assert 0 == drain.wait(timeout=300), drain.log_text()[-4000:]
        finally:
            drain.cleanup()

        reader = LakeReader(
            Location(lake.storage_root).for_delta_rs(), {**s3_env, "AWS_ALLOW_HTTP": "true"}
        )
        for topic, table in (
            (lake.users_topic, BRONZE_USERS),
            (lake.sensors_topic, BRONZE_SENSORS),
        ):
            rows = run_sql(
                {"t": reader.open(table)},
                "SELECT kafka_topic, kafka_partition, kafka_offset FROM t",
            ).to_pylist()
            landed = {(r["kafka_topic"], r["kafka_partition"], r["kafka_offset"]) for r in rows}
            assert topic_coordinates(lake.bootstrap_servers, topic) == landed, table.name
            assert len(landed) == len(rows), table.name
            sensors = landed
        code, reconciled = lake.reconcile()
        assert 0 == code, reconciled
        # Every table reads whole with delta-rs, Arrow-validated.
        tables = lake.delta_rs_rows()
        assert tables["bronze/sensors"] == len(sensors), tables
