"""A contract's topic that does not exist on the brokers: ``run`` refuses to start (exit 2,
one line naming the topic, the contract and its variable) before the lease or a JVM,
creates nothing, and ``status`` still reports.

Without the check the driver started Spark and the ingest query failed with
UnknownTopicOrPartitionException (exit 1).
"""

from __future__ import annotations

import json

import pytest
from confluent_kafka.admin import AdminClient

from tests.support.lake import Lake

pytestmark = pytest.mark.integration


def test_run_refuses_a_contracts_topic_missing_on_the_brokers_and_status_still_reports(
    lake: Lake,
) -> None:
    missing = f"{lake.users_topic}-absent"

    run = lake.cli("run", INGEST_USERS_TOPIC=missing)

    assert "" == run.err
    lines = run.out.strip().splitlines()
    assert (2, 1) == (run.code, len(lines)), run.out[-3000:]
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
    assert run.seconds < 20, run.seconds
    admin = AdminClient({"bootstrap.servers": lake.bootstrap_servers})
    assert missing not in admin.list_topics(timeout=10).topics  # nothing created it

    status = lake.cli("status", INGEST_USERS_TOPIC=missing)

    assert status.code in (0, 1), status.out + status.err
    assert "Traceback" not in status.err, status.err
    assert missing in status.out and lake.sensors_topic in status.out, status.out
