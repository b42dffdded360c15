"""Kafka over SASL_SSL (SCRAM-SHA-512, a CA made for the test): the service's Java and
librdkafka clients authenticate with awkward credentials, and the password is never logged."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from devstack import KafkaBroker, free_port
from pyspark.sql import SparkSession

from tests.support.lake import Lake

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


def secure(lake: Lake, broker: KafkaBroker, mtls: bool = False) -> tuple[Lake, dict[str, str]]:
    """``lake``'s topics on ``broker``, reached through SASL_SSL, and the settings for it;
    ``mtls``: through the listener that requires a client certificate, and one for it."""
    broker.create_topics([lake.users_topic, lake.sensors_topic], partitions=3)
    settings = {
        "INGEST_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "INGEST_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "INGEST_KAFKA_SASL_USERNAME": USERNAME,
        "INGEST_KAFKA_SASL_PASSWORD": PASSWORD,
        "INGEST_KAFKA_SSL_CA_LOCATION": str(broker.ca_location),
    }
    if not mtls:
        return replace(lake, bootstrap_servers=broker.sasl_ssl_bootstrap_servers), settings
    settings["INGEST_KAFKA_SSL_KEYSTORE_LOCATION"] = str(broker.client_keystore("ingest"))
    return replace(lake, bootstrap_servers=broker.mtls_bootstrap_servers), settings


def _shown(secret: str) -> tuple[str, ...]:
    """The ways a leaked ``secret`` could be printed: as is, JSON-escaped, and its tail."""
    return (secret, json.dumps(secret)[1:-1], secret[-11:])


def _get(url: str) -> str:
    # A driver busy on a loaded machine serves its UI slowly (10 s timed out in a full run).
    with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310 (loopback)
        return str(response.read().decode())


def test_ingests_through_sasl_ssl_and_shows_the_password_nowhere(
    spark: SparkSession, lake: Lake, secure_broker: KafkaBroker, tmp_path: Path
) -> None:
    """A live driver, its Spark UI and its event log on: the password is in no log line,
    not on the UI's environment page or its SQL plans, not in the event log."""
    lake, settings = secure(lake, secure_broker)
    summary = json.loads(lake.generate("--users", "20", "--readings", "300", **settings))
    ui_port = free_port()
    event_log = tmp_path / "event-log"
    event_log.mkdir()
    extra_conf = {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": event_log.as_uri(),
        "spark.eventLog.compress": "false",  # the same events, greppable
    }
    driver = lake.service(
        "sasl",
        "run",
        INGEST_SPARK_UI_ENABLED="true",
        INGEST_SPARK_UI_PORT=str(ui_port),
        INGEST_SPARK_EXTRA_CONF=json.dumps(extra_conf),
        **settings,
    ).start()
    produced = summary["produced"]
    expected = {
        "bronze/sensors": produced[lake.sensors_topic],
        "bronze/users": produced[lake.users_topic],
    }
    try:
        deadline = time.monotonic() + 240
        while {k: lake.delta_rs_rows().get(k, 0) for k in expected} != expected:
            assert driver.alive(), driver.log_text()[-4000:]
            assert time.monotonic() < deadline, lake.delta_rs_rows()
            time.sleep(2)
        ui = f"http://127.0.0.1:{ui_port}"
        [app] = json.loads(_get(f"{ui}/api/v1/applications"))
        api = f"{ui}/api/v1/applications/{app['id']}"
        pages = {
            "environment": _get(f"{api}/environment"),
            "environment page": _get(f"{ui}/environment/"),
            "sql": _get(f"{api}/sql?details=true&planDescription=true"),
        }
        driver.terminate()
        assert 0 == driver.wait(timeout=120), driver.log_text()[-4000:]
    finally:
        driver.cleanup()

    assert "spark.eventLog.dir" in pages["environment"]  # the page under test, in full
    # The plans of the sensors query's batches are shown.
    executions = json.loads(pages["sql"])
    assert [] != [
        e["planDescription"]
        for e in executions
        if e["description"].startswith("ingest_sensors") and "Project" in e["planDescription"]
    ], executions
    events = "".join(f.read_text() for f in event_log.rglob("events_*"))
    assert '"Event":"SparkListenerEnvironmentUpdate"' in events
    assert "SparkListenerSQLExecutionStart" in events
    assert '"spark.job.description":"ingest_sensors' in events  # its batches' jobs
    log = driver.log_text()
    assert '"event": "stopped"' in log
    for where, text in {"log": log, "event log": events, **pages}.items():
        for shown in _shown(PASSWORD):
            assert shown not in text, where


def test_ingests_with_a_client_certificate(
    spark: SparkSession, lake: Lake, secure_broker: KafkaBroker
) -> None:
    """mTLS: the generator (librdkafka) and the driver (Spark's Java client) present the
    certificate of one PEM keystore to a listener that requires it."""
    lake, settings = secure(lake, secure_broker, mtls=True)
    summary = json.loads(lake.generate("--users", "10", "--readings", "100", **settings))
    driver = lake.service("mtls", "run", "--available-now", **settings).start()
    try:
        assert 0 == driver.wait(timeout=300), driver.log_text()[-4000:]
    finally:
        driver.cleanup()

    produced = summary["produced"]
    assert produced[lake.sensors_topic] == 100
    for topic, table in (
        (lake.sensors_topic, "bronze/sensors"),
        (lake.users_topic, "bronze/users"),
    ):
        assert produced[topic] == spark.read.format("delta").load(lake.table(table)).count()
    assert '"event": "stopped"' in driver.log_text()


def another_ca(directory: Path) -> Path:
    """A CA certificate that did not sign the broker's."""
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
         "-out", "ca.pem", "-days", "1", "-subj", "/CN=another CA"],
        cwd=directory, check=True, capture_output=True,
    )  # fmt: skip
    return directory / "ca.pem"


@pytest.mark.parametrize(
    "refusal", ["wrong password", "untrusted certificate", "no client certificate"]
)
def test_a_refused_connection_is_one_clear_error_line_and_exit_2(
    lake: Lake, secure_broker: KafkaBroker, tmp_path: Path, refusal: str
) -> None:
    lake, settings = secure(lake, secure_broker, mtls=refusal == "no client certificate")
    if refusal == "wrong password":
        settings["INGEST_KAFKA_SASL_PASSWORD"] = "not-" + PASSWORD
        expected = "SASL authentication error"
    elif refusal == "untrusted certificate":
        settings["INGEST_KAFKA_SSL_CA_LOCATION"] = str(another_ca(tmp_path))
        expected = "certificate verify failed"
    else:
        del settings["INGEST_KAFKA_SSL_KEYSTORE_LOCATION"]
        expected = "alert bad certificate"
    # A refusal ends the access check's wait at once: the broker is never waited for 300 s.
    settings["INGEST_KAFKA_CONNECT_TIMEOUT_SECONDS"] = "300"
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
    assert lake.bootstrap_servers in refused["error"]
    assert "secret-7f3a" not in log
