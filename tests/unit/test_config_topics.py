"""Settings: which setting names a contract's topic (INGEST_<NAME>_TOPIC, the most specific,
wins over the `topics` mapping from INGEST_TOPICS or the YAML file), and a complex setting
that cannot be parsed (JSON in the environment, the YAML file) stops with exit 2 and one line
naming it instead of a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.config import load_settings
from service.errors import ConfigError
from tests.support.repo import REPO

pytestmark = pytest.mark.usefixtures("clean_env")

ORDERS = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["order_id"],
    "properties": {"order_id": {"type": "string"}},
    "x-lakehouse": {"name": "orders", "topic": "shop.orders", "mode": "events", "id": "order_id"},
}


@pytest.fixture
def orders_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """INGEST_CONTRACTS_DIR with an `orders` contract (topic shop.orders)."""
    directory = tmp_path / "contracts"
    directory.mkdir()
    (directory / "orders.json").write_text(json.dumps(ORDERS))
    monkeypatch.setenv("INGEST_CONTRACTS_DIR", str(directory))
    return directory


# --- topic precedence -----------------------------------------------------------------------


def test_a_topic_variable_wins_over_ingest_topics(
    monkeypatch: pytest.MonkeyPatch, orders_dir: Path
) -> None:
    monkeypatch.setenv("INGEST_TOPICS", '{"orders": "from-topics", "sensors": "readings"}')
    monkeypatch.setenv("INGEST_ORDERS_TOPIC", "from-variable")

    settings = load_settings()

    assert "from-variable" == settings.contracts["orders"].topic
    # The other entries of the mapping still apply.
    assert "readings" == settings.contracts["sensors"].topic


def test_a_topic_variable_wins_over_the_yaml_files_topics(
    monkeypatch: pytest.MonkeyPatch, orders_dir: Path, tmp_path: Path
) -> None:
    config = tmp_path / "ingest.yaml"
    config.write_text("topics:\n  orders: from-file\n  users: people\n")
    monkeypatch.setenv("INGEST_CONFIG_FILE", str(config))
    assert "from-file" == load_settings().contracts["orders"].topic

    monkeypatch.setenv("INGEST_ORDERS_TOPIC", "from-variable")
    settings = load_settings()

    assert "from-variable" == settings.contracts["orders"].topic
    assert "people" == settings.contracts["users"].topic


def test_the_shipped_contracts_variables_win_over_the_topics_mapping(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("INGEST_TOPICS", '{"users": "from-topics", "sensors": "from-topics-2"}')
    monkeypatch.setenv("INGEST_USERS_TOPIC", "from-variable")

    contracts = load_settings().contracts

    assert ("from-variable", "from-topics-2") == (
        contracts["users"].topic,
        contracts["sensors"].topic,
    )


def test_a_topics_mapping_that_is_not_an_object_names_ingest_topics_beside_a_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("INGEST_TOPICS", '["orders"]')
    monkeypatch.setenv("INGEST_ORDERS_TOPIC", "shop.orders")
    with pytest.raises(ConfigError) as raised:
        load_settings()
    assert str(raised.value).startswith("invalid configuration: INGEST_TOPICS: "), raised.value


# --- complex settings that cannot be parsed -------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("INGEST_TOPICS", '{"orders": "shop.orders",}'),
        ("INGEST_SPARK_EXTRA_CONF", "{spark.sql.ansi.enabled: true}"),
    ],
)
def test_invalid_json_in_a_complex_variable_is_a_configuration_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as raised:
        load_settings()
    message = str(raised.value)
    assert message.startswith(f"invalid configuration: {variable}: not valid JSON: "), message
    assert 1 == len(message.splitlines())
    assert value not in message  # the value may hold a secret: it is not repeated


def test_a_yaml_file_that_does_not_parse_is_a_configuration_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "ingest.yaml"
    config.write_text("topics: {orders: [\n")
    monkeypatch.setenv("INGEST_CONFIG_FILE", str(config))
    with pytest.raises(ConfigError) as raised:
        load_settings()
    message = str(raised.value)
    assert message.startswith(
        f"invalid configuration: INGEST_CONFIG_FILE: {config} is not valid YAML at line 2"
    ), message
    assert 1 == len(message.splitlines())


@pytest.mark.parametrize("variable", ["INGEST_TOPICS", "INGEST_SPARK_EXTRA_CONF"])
def test_the_command_line_exits_2_with_one_line_naming_the_variable(
    tmp_path: Path, variable: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INGEST_", "AWS_"))}
    env |= {
        variable: "{not json",
        "INGEST_STORAGE_ROOT": str(tmp_path / "lake"),
        "INGEST_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9",
    }
    done = subprocess.run(
        [sys.executable, "-m", "service", "status"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert 2 == done.returncode, done.stdout + done.stderr
    # As for every setting that fails to load: one line on stderr, before logging is set up.
    assert "" == done.stdout
    [line] = done.stderr.splitlines()
    assert line.startswith(f"lakehouse-ingest: invalid configuration: {variable}: not valid JSON")
    assert not (tmp_path / "lake").exists()


# --- the start's topic check ----------------------------------------------------------------


class _Metadata:
    def __init__(self, topics: set[str]) -> None:
        self.topics = {t: object() for t in topics}


def _brokers_with(monkeypatch: pytest.MonkeyPatch, topics: set[str]) -> None:
    """An AdminClient whose brokers answer and list ``topics``."""

    class _Admin:
        def __init__(self, config: dict[str, object]) -> None:
            pass

        def list_topics(self, timeout: float) -> _Metadata:
            return _Metadata(topics)

    monkeypatch.setattr("service.kafka.admin.AdminClient", _Admin)


def test_the_start_refuses_a_contracts_topic_the_brokers_do_not_list(
    monkeypatch: pytest.MonkeyPatch, orders_dir: Path
) -> None:
    from service.kafka.admin import check_kafka_access

    _brokers_with(monkeypatch, {"users", "sensors", "shop.orders"})
    check_kafka_access(load_settings())  # every topic there

    monkeypatch.setenv("INGEST_ORDERS_TOPIC", "shop.orders.v2")
    monkeypatch.setenv("INGEST_USERS_TOPIC", "people")
    with pytest.raises(ConfigError) as raised:
        check_kafka_access(load_settings())

    assert (
        "topic 'people' of contract users (INGEST_USERS_TOPIC) does not exist on the brokers at"
        " localhost:9092; topic 'shop.orders.v2' of contract orders (INGEST_ORDERS_TOPIC) does"
        " not exist on the brokers at localhost:9092: create them first (the driver reads a"
        " contract's topic, it does not create it), or set the variable to the topic the"
        " producers write"
    ) == str(raised.value)


def test_the_start_checks_only_the_contracts_the_deployment_runs(
    monkeypatch: pytest.MonkeyPatch, orders_dir: Path
) -> None:
    from service.kafka.admin import check_kafka_access

    _brokers_with(monkeypatch, {"shop.orders"})
    monkeypatch.setenv("INGEST_CONTRACT_NAMES", "orders")
    check_kafka_access(load_settings())
