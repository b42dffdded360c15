"""A broker or an S3 server that does not answer at start: exit 4 and one line saying which,
well before a JVM would have started; ``status`` says an unreadable storage once.

Nothing listens on the port each test names (a free loopback port), as when an address
or a port is wrong or the network path is cut.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from devstack import KafkaBroker, free_port

from tests.support.lake import Lake, Run

pytestmark = pytest.mark.integration


def one_line(run: Run) -> dict[str, Any]:
    """The one JSON log line ``run`` printed on stdout (stderr stays empty)."""
    assert "" == run.err
    lines = run.out.strip().splitlines()
    assert 1 == len(lines), lines
    line: dict[str, Any] = json.loads(lines[0])
    return line


def test_an_unreachable_broker_is_exit_4_and_one_line_naming_it(lake: Lake) -> None:
    address = f"127.0.0.1:{free_port()}"
    run = lake.cli(
        "run", INGEST_KAFKA_BOOTSTRAP_SERVERS=address, INGEST_KAFKA_CONNECT_TIMEOUT_SECONDS="3"
    )
    assert 4 == run.code, run.out
    line = one_line(run)
    assert "kafka_unreachable" == line["event"]
    for needle in (address, "INGEST_KAFKA_BOOTSTRAP_SERVERS", "within 3 s", "Connection refused"):
        assert needle in line["error"], line["error"]
    assert run.seconds < 30, "it waits INGEST_KAFKA_CONNECT_TIMEOUT_SECONDS, not a JVM start"


def test_an_unreachable_s3_server_is_exit_4_and_one_line_and_status_says_so_once(
    lake: Lake, kafka_broker: KafkaBroker
) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    run = lake.cli("run", AWS_ENDPOINT_URL=endpoint)
    assert 4 == run.code, run.out
    line = one_line(run)
    assert "storage_unreachable" == line["event"]
    for needle in (endpoint, "AWS_ENDPOINT_URL", lake.storage_root):
        assert needle in line["error"], line["error"]
    # Found by the lease, before Spark: no JVM ever started (they take 10 s and more here).
    assert run.seconds < 60

    status = lake.cli("status", AWS_ENDPOINT_URL=endpoint)
    assert (1, "") == (status.code, status.err), status.out
    out = status.out
    # The broker answered: its offsets are there; the storage is named unreadable once,
    # and nothing else was read from it (each read would have retried for seconds).
    assert 1 == out.count("UNREADABLE"), out
    assert f"storage     {lake.storage_root} (UNREADABLE: " in out
    assert lake.sensors_topic in out
    assert status.seconds < 40, status.seconds
