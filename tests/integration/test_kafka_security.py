"""Kafka over SASL_SSL (SCRAM-SHA-512, a CA made for the test): the service's Java and
librdkafka clients authenticate with awkward credentials, and the password is never logged."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from devstack import KafkaBroker
from pyspark.sql import SparkSession

from tests.integration.harness import Lake

pytestmark = pytest.mark.integration

# Quotes, a backslash, '=' and ';': what breaks a JAAS line or a properties file.
USERNAME = 'o\'brien "x" \\ y'
PASSWORD = "p\"a's\\s w=rd; secret-7f3a"  # noqa: S105 (the test broker's user)


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A broker with a SASL_SSL listener and the SCRAM user, stopped after the module."""
    with KafkaBroker(tmp_path_factory.mktemp("kafka-sasl"), sasl_ssl=True) as broker:
        broker.add_scram_user(USERNAME, PASSWORD)
        yield broker


def secure(lake: Lake, broker: KafkaBroker) -> tuple[Lake, dict[str, str]]:
    """``lake``'s topics on ``broker``, reached through SASL_SSL, and the settings for it."""
    broker.create_topics([lake.users_topic, lake.sensors_topic], partitions=3)
    settings = {
        "INGEST_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "INGEST_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "INGEST_KAFKA_SASL_USERNAME": USERNAME,
        "INGEST_KAFKA_SASL_PASSWORD": PASSWORD,
        "INGEST_KAFKA_SSL_CA_LOCATION": str(broker.ca_location),
    }
    return replace(lake, bootstrap_servers=broker.sasl_ssl_bootstrap_servers), settings


def test_ingests_through_sasl_ssl_and_logs_no_password(
    spark: SparkSession, lake: Lake, secure_broker: KafkaBroker
) -> None:
    lake, settings = secure(lake, secure_broker)
    summary = json.loads(lake.generate("--users", "20", "--readings", "300", **settings))
    driver = lake.service("sasl", "run", "--available-now", **settings).start()
    try:
        assert 0 == driver.wait(timeout=300), driver.log_text()[-4000:]
    finally:
        driver.cleanup()

    produced = summary["produced"]
    for topic, table in (
        (lake.sensors_topic, "bronze/sensors"),
        (lake.users_topic, "bronze/users"),
    ):
        assert produced[topic] == spark.read.format("delta").load(lake.table(table)).count()
    log = driver.log_text()
    assert '"event": "stopped"' in log
    for shown in (PASSWORD, json.dumps(PASSWORD)[1:-1], "secret-7f3a"):
        assert shown not in log


def another_ca(directory: Path) -> Path:
    """A CA certificate that did not sign the broker's."""
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
         "-out", "ca.pem", "-days", "1", "-subj", "/CN=another CA"],
        cwd=directory, check=True, capture_output=True,
    )  # fmt: skip
    return directory / "ca.pem"


@pytest.mark.parametrize("refusal", ["wrong password", "untrusted certificate"])
def test_a_refused_connection_is_one_clear_error_line_and_exit_2(
    lake: Lake, secure_broker: KafkaBroker, tmp_path: Path, refusal: str
) -> None:
    lake, settings = secure(lake, secure_broker)
    if refusal == "wrong password":
        settings["INGEST_KAFKA_SASL_PASSWORD"] = "not-" + PASSWORD
        expected = "SASL authentication error"
    else:
        settings["INGEST_KAFKA_SSL_CA_LOCATION"] = str(another_ca(tmp_path))
        expected = "certificate verify failed"
    driver = lake.service("refused", "run", **settings).start()
    try:
        assert 2 == driver.wait(timeout=120), driver.log_text()[-4000:]
    finally:
        driver.cleanup()

    log = driver.log_text()
    errors = [
        line for line in log.splitlines() if '"level": "error"' in line or '"level":"error"' in line
    ]
    assert 1 == len(errors), errors
    [refused] = driver.events("kafka_access_refused")
    assert expected in refused["error"]
    assert secure_broker.sasl_ssl_bootstrap_servers in refused["error"]
    assert "secret-7f3a" not in log
