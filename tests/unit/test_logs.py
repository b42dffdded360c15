"""Log lines: JSON on the stream, stdlib routed through structlog, secrets never written."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from pydantic import SecretStr

from service.config import Settings
from service.logs import (
    MASK,
    ReconnectThrottle,
    configure_logging,
    jvm_log_config,
    secret_values,
)

SECRET = "s3cr3t-Value-42"  # noqa: S105 - a test value to look for


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    out = io.StringIO()
    configure_logging("json", "INFO", [SECRET], stream=out)
    yield out
    structlog.reset_defaults()
    logging.getLogger().handlers.clear()
    logging.captureWarnings(False)


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_structlog_and_stdlib_records_are_json_lines_with_the_same_keys(
    stream: io.StringIO,
) -> None:
    structlog.get_logger("service.test").info("batch_written", query="ingest_users", rows_in=3)
    logging.getLogger("py4j.clientserver").warning("gateway slow")

    ours, foreign = lines(stream)
    assert {"event": "batch_written", "query": "ingest_users", "rows_in": 3} == {
        k: ours[k] for k in ("event", "query", "rows_in")
    }
    assert ("gateway slow", "warning", "py4j.clientserver") == (
        foreign["event"],
        foreign["level"],
        foreign["logger"],
    )
    for line in (ours, foreign):
        assert {"timestamp", "level", "logger", "event"} <= set(line)


def test_configured_secrets_are_masked_in_fields_messages_and_tracebacks(
    stream: io.StringIO,
) -> None:
    log = structlog.get_logger("service.test")
    log.info("connecting", options={"sasl.jaas.config": f'password="{SECRET}";'}, args=[SECRET])
    logging.getLogger("pyspark").info("conf %s", SECRET)

    def connect(password: str) -> None:
        raise RuntimeError(f"login failed for {password}")

    try:
        connect(SECRET)
    except RuntimeError:
        log.exception("crashed")

    text = stream.getvalue()
    assert SECRET not in text
    assert text.count(MASK) >= 4
    crashed = lines(stream)[-1]
    assert "RuntimeError" == crashed["exception"][0]["exc_type"]
    # Frames carry no locals (where the password argument would be).
    assert all("locals" not in frame for frame in crashed["exception"][0]["frames"])


def test_secret_values_are_every_secret_setting() -> None:
    settings = Settings(
        aws_secret_access_key=SecretStr("aws-secret"),
        kafka_sasl_password=SecretStr("sasl-secret"),
    )

    assert {"aws-secret", "sasl-secret"} == set(secret_values(settings))


def test_jvm_log_config_is_a_json_layout_on_the_chosen_stream(tmp_path: Path) -> None:
    path = jvm_log_config("json", "INFO", target="SYSTEM_ERR", directory=tmp_path)

    properties = dict(
        line.split(" = ", 1) for line in path.read_text().splitlines() if " = " in line
    )
    assert "JsonTemplateLayout" == properties["appender.out.layout.type"]
    assert "SYSTEM_ERR" == properties["appender.out.target"]
    assert "warn" == properties["rootLogger.level"]
    template = json.loads(properties["appender.out.layout.eventTemplate"])
    assert {"timestamp", "level", "logger", "event", "source", "exception"} <= set(template)
    assert path == jvm_log_config("json", "INFO", target="SYSTEM_ERR", directory=tmp_path)


def test_jvm_log_config_for_console_uses_a_pattern(tmp_path: Path) -> None:
    text = jvm_log_config("console", "DEBUG", directory=tmp_path).read_text()

    assert "appender.out.layout.type = PatternLayout" in text
    assert "rootLogger.level = info" in text


def test_librdkafka_connection_failures_are_one_warning_per_client_and_broker_a_minute(
    stream: io.StringIO,
) -> None:
    now = [0.0]
    librdkafka = logging.getLogger("librdkafka")
    [throttle] = [f for f in librdkafka.filters if isinstance(f, ReconnectThrottle)]
    librdkafka.removeFilter(throttle)
    librdkafka.addFilter(ReconnectThrottle(60.0, clock=lambda: now[0]))
    fail = "FAIL [rdkafka#consumer-2] [thrd:127.0.0.1:9092/{}]: 127.0.0.1:9092/{}: Connect to"
    for attempt in range(30):  # a broker down, reconnects every 100 ms
        now[0] = attempt / 10
        librdkafka.error(fail.format("bootstrap", "bootstrap") + f" failed (after {attempt}ms)")
        librdkafka.error(fail.format("1", "1") + " failed: Connection refused")
    librdkafka.error("Some other librdkafka error")
    now[0] = 61.0
    librdkafka.error(fail.format("1", "1") + " failed: Connection refused")

    expected = [("warning", "bootstrap"), ("warning", "1/1"), ("error", "other")]
    expected.append(("warning", "1/1"))  # a minute later
    assert expected == [
        (line["level"], "bootstrap" if "bootstrap" in line["event"]
         else "other" if "other" in line["event"] else "1/1")
        for line in lines(stream)
    ]  # fmt: skip
