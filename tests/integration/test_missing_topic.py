"""A contract's topic that does not exist on the brokers: ``run`` refuses to start (exit 2,
one line naming the topic, the contract and its variable) before the lease or a JVM,
creates nothing, and ``status`` still reports.

Without the check the driver started Spark and the ingest query failed with
UnknownTopicOrPartitionException (exit 1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from confluent_kafka.admin import AdminClient

from tests.support.lake import Lake
from tests.support.repo import REPO

pytestmark = pytest.mark.integration


def cli(lake: Lake, *args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """``python -m service ARGS`` on ``lake`` with ``env``, and its wall time."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "service", *args],
        cwd=REPO,
        env={**os.environ, **lake.env(INGEST_LOG_LEVEL="WARNING", **env)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done, time.monotonic() - started


def test_run_refuses_a_contracts_topic_missing_on_the_brokers_and_status_still_reports(
    lake: Lake,
) -> None:
    missing = f"{lake.users_topic}-absent"

    run, seconds = cli(lake, "run", INGEST_USERS_TOPIC=missing)

    assert "" == run.stderr
    lines = run.stdout.strip().splitlines()
    assert (2, 1) == (run.returncode, len(lines)), run.stdout[-3000:]
    [line] = [json.loads(line) for line in lines]
    assert ("invalid_configuration", "error") == (line["event"], line["level"])
    for needle in (
        f"topic {missing!r} of contract users (INGEST_USERS_TOPIC) does not exist",
        lake.bootstrap_servers,
        "create it first",
    ):
        assert needle in line["error"], line["error"]
    assert lake.sensors_topic not in line["error"]  # it exists
    # Found by the start's Kafka check: no lease taken, no JVM started (10 s and more here).
    assert seconds < 20, seconds
    admin = AdminClient({"bootstrap.servers": lake.bootstrap_servers})
    assert missing not in admin.list_topics(timeout=10).topics  # nothing created it

    status, _ = cli(lake, "status", INGEST_USERS_TOPIC=missing)

    assert status.returncode in (0, 1), status.stdout + status.stderr
    assert "Traceback" not in status.stderr, status.stderr
    assert missing in status.stdout and lake.sensors_topic in status.stdout, status.stdout
