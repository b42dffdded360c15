"""Settings: defaults from the contract, environment parsing, one clear error per bad key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import SecretStr

from service.config import Location, Settings, available_cores, is_local_master, load_settings
from service.errors import ConfigError
from service.kafka.admin import check_kafka_access
from service.kafka.source import source_options
from service.lake.tables import BRONZE_USERS

pytestmark = pytest.mark.usefixtures("clean_env")


def test_defaults_follow_the_design_contract() -> None:
    settings = load_settings()
    assert "localhost:9092" == settings.kafka_bootstrap_servers
    assert ("users", "sensors") == tuple(settings.contracts[n].topic for n in ("users", "sensors"))
    assert "file:" + str(Path("var/lakehouse").resolve()) == settings.storage_uri
    assert settings.storage_uri + "/_checkpoints" == settings.checkpoint_uri
    assert "local[*]" == settings.spark_master
    assert 8080 == settings.http_port
    assert ("json", "INFO") == (settings.log_format, settings.log_level)


def test_environment_overrides_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INGEST_KAFKA_BOOTSTRAP_SERVERS", "k1:9092,k2:9093")
    monkeypatch.setenv("INGEST_STORAGE_ROOT", "s3a://bucket/prefix/")
    monkeypatch.setenv("INGEST_CHECKPOINT_ROOT", "s3a://other/cp")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("INGEST_HTTP_PORT", "9100")
    settings = load_settings()
    assert "k1:9092,k2:9093" == settings.kafka_bootstrap_servers
    assert "s3a://bucket/prefix" == settings.storage_uri
    assert "s3a://other/cp" == settings.checkpoint_uri
    assert "s3a://bucket/prefix/bronze/users" == BRONZE_USERS.uri(settings.storage_uri)
    assert ("http://127.0.0.1:9000", "eu-west-1") == (
        settings.aws_endpoint_url,
        settings.aws_region,
    )
    assert 9100 == settings.http_port
    assert settings.uses_s3


def test_the_consumer_group_is_one_per_storage_root_unless_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("INGEST_STORAGE_ROOT", "s3a://bucket/lake-a")
    lake_a = load_settings()
    monkeypatch.setenv("INGEST_STORAGE_ROOT", "s3a://bucket/lake-b")
    lake_b = load_settings()
    assert "lakehouse-ingest:s3a://bucket/lake-a" == lake_a.consumer_group
    assert "lakehouse-ingest:s3a://bucket/lake-b" == lake_b.consumer_group
    # An upgraded deployment keeps the group its lag tools watch by setting it; "" = none.
    monkeypatch.setenv("INGEST_KAFKA_CONSUMER_GROUP", "lakehouse-ingest")
    assert "lakehouse-ingest" == load_settings().consumer_group
    monkeypatch.setenv("INGEST_KAFKA_CONSUMER_GROUP", "")
    assert "" == load_settings().consumer_group


def test_yaml_file_is_read_and_environment_wins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "ingest.yaml"
    config.write_text("users_topic: people\nsensors_topic: readings\nhttp_port: 9000\n")
    monkeypatch.setenv("INGEST_CONFIG_FILE", str(config))
    monkeypatch.setenv("INGEST_HTTP_PORT", "9001")
    settings = load_settings()
    assert ("people", "readings", 9001) == (
        settings.users_topic,
        settings.sensors_topic,
        settings.http_port,
    )


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("INGEST_HTTP_PORT", "eighty", "INGEST_HTTP_PORT: Input should be a valid integer"),
        ("INGEST_HTTP_PORT", "70000", "INGEST_HTTP_PORT: Input should be less than or equal"),
        (
            "INGEST_KAFKA_BOOTSTRAP_SERVERS",
            "kafka",
            "INGEST_KAFKA_BOOTSTRAP_SERVERS: 'kafka' is not",
        ),
        ("INGEST_STORAGE_ROOT", "s3://bucket/x", "INGEST_STORAGE_ROOT: use the s3a:// scheme"),
        ("INGEST_STORAGE_ROOT", "gs://bucket/x", "INGEST_STORAGE_ROOT: unsupported scheme"),
        ("INGEST_LOG_FORMAT", "xml", "INGEST_LOG_FORMAT: Input should be 'json' or 'console'"),
        ("INGEST_KAFKA_SECURITY_PROTOCOL", "SASL_SSL", "INGEST_KAFKA_SASL_MECHANISM: required"),
        ("INGEST_KAFKA_MAX_OFFSETS_PER_TRIGGER", "0", "INGEST_KAFKA_MAX_OFFSETS_PER_TRIGGER:"),
        (
            "INGEST_KAFKA_SSL_KEYSTORE_LOCATION",
            "/etc/client.pem",
            "INGEST_KAFKA_SSL_KEYSTORE_LOCATION: a client certificate needs the SSL or SASL_SSL",
        ),
        ("INGEST_CONFIG_FILE", "/nonexistent.yaml", "INGEST_CONFIG_FILE: no such file"),
    ],
)
def test_invalid_value_fails_with_one_message_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert message in str(error.value)
    assert 1 == len(str(error.value).splitlines())


def test_unknown_yaml_key_is_rejected_by_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "ingest.yaml"
    config.write_text("user_topic: typo\n")
    monkeypatch.setenv("INGEST_CONFIG_FILE", str(config))
    with pytest.raises(ConfigError, match="user_topic"):
        load_settings()


def test_secrets_are_masked_in_the_loggable_form(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value")
    monkeypatch.setenv("INGEST_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("INGEST_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("INGEST_KAFKA_SASL_USERNAME", "ingest")
    monkeypatch.setenv("INGEST_KAFKA_SASL_PASSWORD", "kafka-pa55")
    rendered = repr(load_settings().redacted())
    assert "s3cr3t-value" not in rendered
    assert "kafka-pa55" not in rendered
    assert "**********" in rendered


def test_maintenance_defaults_to_hourly_with_seven_days_of_vacuum_retention() -> None:
    settings = load_settings()
    assert 3600.0 == settings.maintenance_interval_seconds
    assert 32 == settings.maintenance_min_files
    assert 168 == settings.vacuum_retention_hours
    assert settings.compact_min_files is None


def test_maintenance_can_be_turned_off_and_retention_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("INGEST_MAINTENANCE_INTERVAL_SECONDS", "0")
    monkeypatch.setenv("INGEST_VACUUM_RETENTION_HOURS", "720")
    settings = load_settings()
    assert (0.0, 720) == (settings.maintenance_interval_seconds, settings.vacuum_retention_hours)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("INGEST_VACUUM_RETENTION_HOURS", "167"),
        ("INGEST_MAINTENANCE_INTERVAL_SECONDS", "-1"),
        ("INGEST_MAINTENANCE_MIN_FILES", "1"),
    ],
)
def test_unsafe_maintenance_settings_fail_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert f"invalid configuration: {variable}:" in str(error.value)
    assert 1 == len(str(error.value).splitlines())


def test_a_vacuum_retention_below_deltas_check_is_refused_not_forced() -> None:
    with pytest.raises(ConfigError, match="at least 168"):
        load_settings(vacuum_retention_hours=24)


def test_gold_triggers_every_three_ingest_triggers_unless_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("INGEST_TRIGGER_INTERVAL_SECONDS", "4")
    assert 12.0 == load_settings().gold_trigger_seconds
    monkeypatch.setenv("INGEST_GOLD_TRIGGER_INTERVAL_SECONDS", "5")
    assert 5.0 == load_settings().gold_trigger_seconds


@pytest.mark.parametrize(
    ("master", "partitions"),
    [
        ("local", 1),
        ("local[3]", 3),
        ("local[5,2]", 5),
        ("spark://h:7077", 4),
        ("local-cluster[2,1,1024]", 4),
    ],
)
def test_shuffle_partitions_are_one_per_local_core_unless_set(
    monkeypatch: pytest.MonkeyPatch, master: str, partitions: int
) -> None:
    monkeypatch.setenv("INGEST_SPARK_MASTER", master)
    assert partitions == load_settings().spark_shuffle_partitions
    monkeypatch.setenv("INGEST_SPARK_SHUFFLE_PARTITIONS", "7")
    assert 7 == load_settings().spark_shuffle_partitions


def test_local_star_counts_the_cores_as_the_jvm_does(tmp_path: Path) -> None:
    """``local[*]``'s cores: the process's CPU affinity, capped by a cgroup v2 or v1 quota."""
    affinity = len(os.sched_getaffinity(0))
    assert available_cores() == load_settings().spark_shuffle_partitions
    assert affinity == available_cores(tmp_path)  # no cgroup files: no quota
    cpu_max = tmp_path / "v2" / "cpu.max"
    cpu_max.parent.mkdir()
    for text, cores in [("max 100000", affinity), ("100000 100000", 1), ("50000 100000", 1)]:
        cpu_max.write_text(text + "\n")
        assert cores == available_cores(cpu_max.parent)
    cpu_max.write_text("150000 100000\n")  # 1.5 cores: 2, as the JVM rounds up
    assert min(affinity, 2) == available_cores(cpu_max.parent)
    v1 = tmp_path / "v1" / "cpu"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    for text, cores in [("-1", affinity), ("100000", 1), ("150000", min(affinity, 2))]:
        (v1 / "cpu.cfs_quota_us").write_text(text + "\n")
        assert cores == available_cores(v1.parent)


@pytest.mark.parametrize(
    ("master", "local"),
    [
        ("local", True),
        ("local[2]", True),
        ("local[*]", True),
        ("local[4,3]", True),
        ("local-cluster[2,1,1024]", False),
        ("spark://host:7077", False),
        ("k8s://https://api:6443", False),
    ],
)
def test_a_local_master_runs_the_executor_in_the_driver(master: str, local: bool) -> None:
    assert is_local_master(master) is local


def test_a_client_keystore_reaches_both_kafka_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INGEST_KAFKA_SECURITY_PROTOCOL", "SSL")
    monkeypatch.setenv("INGEST_KAFKA_SSL_KEYSTORE_LOCATION", "/etc/kafka-client/tls-combined.pem")
    kafka = load_settings().kafka
    java = kafka.java_client_properties()
    assert (java["ssl.keystore.type"], java["ssl.keystore.location"]) == (
        "PEM",
        "/etc/kafka-client/tls-combined.pem",
    )
    librdkafka = kafka.librdkafka_config()
    assert librdkafka["ssl.certificate.location"] == "/etc/kafka-client/tls-combined.pem"
    assert librdkafka["ssl.key.location"] == "/etc/kafka-client/tls-combined.pem"


def test_an_unreadable_tls_file_is_a_configuration_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("INGEST_KAFKA_SECURITY_PROTOCOL", "SSL")
    monkeypatch.setenv("INGEST_KAFKA_SSL_KEYSTORE_LOCATION", str(tmp_path / "missing.pem"))
    with pytest.raises(ConfigError) as error:
        check_kafka_access(load_settings())
    assert "ssl.certificate.location failed" in str(error.value)
    assert "INGEST_KAFKA_SSL_KEYSTORE_LOCATION" in str(error.value)


def test_the_kafka_source_reads_the_topic_with_the_connection_and_a_short_broker_wait() -> None:
    settings = load_settings(kafka_bootstrap_servers="broker:9092", kafka_security_protocol="SSL")

    options = source_options(settings, "sensors")

    assert "sensors" == options["subscribe"]
    assert ("broker:9092", "SSL") == (
        options["kafka.bootstrap.servers"],
        options["kafka.security.protocol"],
    )
    # A caught-up read must not wait 500 ms per task at the end of the log.
    assert "10" == options["kafka.fetch.max.wait.ms"]
    assert ("true", "false") == (
        options["failOnDataLoss"],
        source_options(settings, "sensors", skip_lost=True)["failOnDataLoss"],
    )


def test_one_storage_connection_spelled_for_each_client() -> None:
    storage = Settings(
        aws_endpoint_url="http://127.0.0.1:9000",
        aws_access_key_id="id",
        aws_secret_access_key=SecretStr("secret"),
        aws_region="eu-west-3",
    ).storage

    assert {
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.endpoint.region": "eu-west-3",
        "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
    } == storage.hadoop_options()
    assert {
        "access_key": "id",
        "secret_key": "secret",
        "region": "eu-west-3",
        "endpoint_override": "127.0.0.1:9000",
        "scheme": "http",
    } == storage.pyarrow_options()
    assert {
        "endpoint_url": "http://127.0.0.1:9000",
        "aws_access_key_id": "id",
        "aws_secret_access_key": "secret",
        "region_name": "eu-west-3",
    } == storage.boto3_options()
    assert {
        "AWS_REGION": "eu-west-3",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "id",
        "AWS_SECRET_ACCESS_KEY": "secret",
    } == storage.delta_rs_options()
    # Unset credentials are left to each client's own chain.
    anonymous = Settings(
        aws_endpoint_url=None, aws_access_key_id=None, aws_secret_access_key=None
    ).storage
    assert "spark.hadoop.fs.s3a.endpoint" not in anonymous.hadoop_options()
    assert (None, None, "https") == tuple(
        anonymous.pyarrow_options()[k] for k in ("access_key", "secret_key", "scheme")
    )
    assert "AWS_SECRET_ACCESS_KEY" not in anonymous.delta_rs_options()


@pytest.mark.parametrize(
    ("uri", "bucket", "key", "pyarrow", "delta_rs"),
    [
        ("s3a://lake/prefix/t", "lake", "prefix/t", "lake/prefix/t", "s3://lake/prefix/t"),
        ("file:/abs/path", "", "/abs/path", "/abs/path", "/abs/path"),
        ("file:///abs/path", "", "/abs/path", "/abs/path", "/abs/path"),
    ],
)
def test_a_location_in_each_client_spelling(
    uri: str, bucket: str, key: str, pyarrow: str, delta_rs: str
) -> None:
    location = Location(uri)
    assert (bucket, key, pyarrow, delta_rs) == (
        location.bucket,
        location.key,
        location.for_pyarrow(),
        location.for_delta_rs(),
    )
