"""A broker or an S3 server that does not answer at start: exit 4 and one line saying which,
well before a JVM would have started; ``status`` says an unreadable storage once.

Nothing listens on the port each test names (a free loopback port), as when an address
or a port is wrong or the network path is cut.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from devstack import KafkaBroker, free_port

from tests.support.lake import Lake
from tests.support.repo import REPO

pytestmark = pytest.mark.integration


def run(lake: Lake, *args: str, **env: str) -> tuple[int, list[str], str, float]:
    """``python -m service ARGS``: exit code, its output's lines (the log is JSON lines on
    stdout; stderr must stay empty), the output as text, its wall time."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "service", *args],
        cwd=REPO,
        env={**os.environ, **lake.env(INGEST_LOG_LEVEL="WARNING", **env)},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert "" == result.stderr
    lines = result.stdout.strip().splitlines()
    return result.returncode, lines, result.stdout, time.monotonic() - started


def test_an_unreachable_broker_is_exit_4_and_one_line_naming_it(lake: Lake) -> None:
    address = f"127.0.0.1:{free_port()}"
    code, lines, _, seconds = run(
        lake,
        "run",
        INGEST_KAFKA_BOOTSTRAP_SERVERS=address,
        INGEST_KAFKA_CONNECT_TIMEOUT_SECONDS="3",
    )
    assert (4, 1) == (code, len(lines)), lines
    [line] = [json.loads(line) for line in lines]
    assert "kafka_unreachable" == line["event"]
    for needle in (address, "INGEST_KAFKA_BOOTSTRAP_SERVERS", "within 3 s", "Connection refused"):
        assert needle in line["error"], line["error"]
    assert seconds < 30, "it waits INGEST_KAFKA_CONNECT_TIMEOUT_SECONDS, not a JVM start"


def test_an_unreachable_s3_server_is_exit_4_and_one_line_and_status_says_so_once(
    lake: Lake, kafka_broker: KafkaBroker
) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    code, lines, _, seconds = run(lake, "run", AWS_ENDPOINT_URL=endpoint)
    assert (4, 1) == (code, len(lines)), lines
    [line] = [json.loads(line) for line in lines]
    assert "storage_unreachable" == line["event"]
    for needle in (endpoint, "AWS_ENDPOINT_URL", lake.storage_root):
        assert needle in line["error"], line["error"]
    # Found by the lease, before Spark: no JVM ever started (they take 10 s and more here).
    assert seconds < 60

    code, lines, out, seconds = run(lake, "status", AWS_ENDPOINT_URL=endpoint)
    assert 1 == code, out
    # The broker answered: its offsets are there; the storage is named unreadable once,
    # and nothing else was read from it (each read would have retried for seconds).
    assert 1 == out.count("UNREADABLE"), out
    assert f"storage     {lake.storage_root} (UNREADABLE: " in out
    assert lake.sensors_topic in out
    assert seconds < 40, seconds
