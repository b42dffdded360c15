"""Typed, frozen settings: the only module that reads the environment.

Sources, highest priority first: environment variables (``INGEST_*`` and the
standard ``AWS_*`` names), then an optional YAML file named by
``INGEST_CONFIG_FILE`` whose keys are the field names below. Invalid input fails
once, at start, with a `ConfigError` naming the offending variable.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import AliasChoices, BaseModel, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    YamlConfigSettingsSource,
)

from service.contracts.loading import Contracts, load_contracts
from service.errors import ConfigError

_ENV_PREFIX = "INGEST_"
# Fields read from standard (unprefixed) variable names.
_AWS_FIELDS = {
    "aws_endpoint_url": "AWS_ENDPOINT_URL",
    "aws_access_key_id": "AWS_ACCESS_KEY_ID",
    "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
    "aws_region": "AWS_REGION",
}
_INTERVAL = r"^\d+ (second|minute|hour)s?$"
# Delta's default delta.deletedFileRetentionDuration (7 days), which its VACUUM retention
# check (spark.databricks.delta.retentionDurationCheck.enabled, kept on) enforces.
VACUUM_MIN_RETENTION_HOURS = 168
# Where the checkpoints live under the storage root unless INGEST_CHECKPOINT_ROOT says.
CHECKPOINTS_DIR = "_checkpoints"
_TOPIC_VARIABLE = re.compile(r"^INGEST_([A-Z][A-Z0-9_]*)_TOPIC$")
_BOOTSTRAP_RE = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+:\d{1,5}$")


# Shuffle partitions on a cluster unless set: twice the default executors' cores
# (docs/deploy.md, "Sizing").
_CLUSTER_SHUFFLE_PARTITIONS = 4
# ``local``, ``local[N]``, ``local[*]``, with or without ``,maxFailures``.
_LOCAL_MASTER = re.compile(r"local(?:\[(\d+|\*)(?:,\d+)?\])?")


def is_local_master(master: str) -> bool:
    """Whether ``master`` runs the executor in the driver's JVM (not ``local-cluster``)."""
    return _LOCAL_MASTER.fullmatch(master) is not None


def default_shuffle_partitions(master: str) -> int:
    """One shuffle partition per core of a local ``master`` (``local[*]``: `available_cores`),
    else `_CLUSTER_SHUFFLE_PARTITIONS`.

    Each task of a stateful stage pays its state stores' load and commit and Spark's fixed
    cost of a task whatever its rows: on two cores, gold's batches took 1.2-1.4 times as long
    with four as with two (`make run`, docs/performance.md).
    """
    match = _LOCAL_MASTER.fullmatch(master)
    if match is None:
        return _CLUSTER_SHUFFLE_PARTITIONS
    cores = match.group(1)
    if cores is None:
        return 1
    return available_cores() if cores == "*" else int(cores)


def available_cores(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may run on (its CPU affinity), capped by its cgroup's CPU
    quota (a container's CPU limit), as the JVM counts them for ``local[*]``."""
    cores = len(os.sched_getaffinity(0))
    quota = _cpu_quota(cgroup)
    return cores if quota is None else max(1, min(cores, quota))


def _cpu_quota(cgroup: Path) -> int | None:
    """The CPU quota of ``cgroup`` in cores, rounded up as the JVM does; None without one.

    cgroup v2 writes ``<quota> <period>`` in ``cpu.max`` (``max`` for none); v1 writes them
    in ``cpu/cpu.cfs_quota_us`` (-1 for none) and ``cpu/cpu.cfs_period_us``.
    """
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()
    except (OSError, ValueError):
        try:
            quota = (cgroup / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (cgroup / "cpu" / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    try:
        microseconds, per = int(quota), int(period)
    except ValueError:  # "max": no quota
        return None
    if microseconds <= 0 or per <= 0:  # v1's -1: no quota
        return None
    return -(-microseconds // per)


def default_cache_dir() -> Path:
    """Return the machine-wide cache of downloaded artefacts (jars, binaries)."""
    return Path(os.environ.get("LAKEHOUSE_CACHE", str(Path.home() / ".cache" / "lakehouse-ingest")))


def env_name(field: str) -> str:
    """Return the environment variable that sets ``field``."""
    return _AWS_FIELDS.get(field, _ENV_PREFIX + field.upper())


_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


@dataclass(frozen=True)
class KafkaConnection:
    """How to reach the Kafka cluster, with one method per client's spelling of it."""

    bootstrap_servers: str
    security_protocol: str
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: str | None = None
    # One PEM file: the client's private key (unencrypted PKCS#8) and its certificate chain.
    ssl_keystore_location: str | None = None

    def java_client_properties(self) -> dict[str, str]:
        """Properties of the Java Kafka client (Spark's source and sink)."""
        props = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
        }
        if self.sasl_mechanism and self.sasl_password is not None:
            username = _jaas_quoted(self.sasl_username or "")
            password = _jaas_quoted(self.sasl_password.get_secret_value())
            props["sasl.mechanism"] = self.sasl_mechanism
            props["sasl.jaas.config"] = (
                f"{_JAAS_MODULES[self.sasl_mechanism]} required"
                f" username={username} password={password};"
            )
        if self.ssl_ca_location:
            props["ssl.truststore.type"] = "PEM"
            props["ssl.truststore.location"] = self.ssl_ca_location
        if self.ssl_keystore_location:
            props["ssl.keystore.type"] = "PEM"
            props["ssl.keystore.location"] = self.ssl_keystore_location
        return props

    def spark_options(self) -> dict[str, str]:
        """The Java client properties as options of Spark's Kafka source and sink."""
        return {f"kafka.{k}": v for k, v in self.java_client_properties().items()}

    def librdkafka_config(self) -> dict[str, Any]:
        """confluent-kafka (librdkafka) configuration.

        librdkafka's own log lines (e.g. a client destroyed with events unserved) go
        through the ``librdkafka`` stdlib logger, so they are JSON like every other
        line, instead of raw text on stderr.
        """
        config: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
            "logger": logging.getLogger("librdkafka"),
        }
        if self.sasl_mechanism and self.sasl_password is not None:
            config["sasl.mechanism"] = self.sasl_mechanism
            config["sasl.username"] = self.sasl_username or ""
            config["sasl.password"] = self.sasl_password.get_secret_value()
        if self.ssl_ca_location:
            config["ssl.ca.location"] = self.ssl_ca_location
        if self.ssl_keystore_location:
            # OpenSSL takes the certificate and the key each from its own PEM block.
            config["ssl.certificate.location"] = self.ssl_keystore_location
            config["ssl.key.location"] = self.ssl_keystore_location
        return config


@dataclass(frozen=True)
class Location:
    """A storage location as the service spells it: ``s3a://bucket/key`` (Hadoop's scheme)
    or a local path (Hadoop's ``file:/abs/path``), with each client's spelling of it."""

    uri: str

    @property
    def on_s3(self) -> bool:
        """Whether the location is on an S3 endpoint."""
        return self.uri.startswith("s3a://")

    @property
    def bucket(self) -> str:
        """The S3 bucket (empty for a local path)."""
        return urlsplit(self.uri).netloc if self.on_s3 else ""

    @property
    def key(self) -> str:
        """The S3 object key, or the local path."""
        if self.on_s3:
            return urlsplit(self.uri).path.lstrip("/")
        return "/" + self.uri.removeprefix("file://").removeprefix("file:").lstrip("/")

    def for_pyarrow(self) -> str:
        """pyarrow's path: ``bucket/key``, or the local path."""
        return f"{self.bucket}/{self.key}" if self.on_s3 else self.key

    def for_delta_rs(self) -> str:
        """delta-rs's URI: ``s3://bucket/key``, or the local path."""
        return f"s3://{self.for_pyarrow()}" if self.on_s3 else self.key


@dataclass(frozen=True)
class StorageConnection:
    """How to reach the object store, with one method per client's spelling of it: Hadoop's
    s3a (the driver's Spark), pyarrow (checkpoint reads), boto3 (the lease), delta-rs
    (`show`, `reconcile`, `status`).

    Unset credentials are left to each client's default chain (environment, web
    identity, instance profile); requests are path-style, as MinIO needs.
    """

    endpoint_url: str | None
    access_key_id: str | None
    secret_access_key: SecretStr | None
    region: str

    @property
    def _secret(self) -> str | None:
        return self.secret_access_key.get_secret_value() if self.secret_access_key else None

    def hadoop_options(self) -> dict[str, str]:
        """Spark configuration of Hadoop's s3a. Credentials are deliberately absent: s3a
        reads the standard ``AWS_*`` variables itself, so they never appear in Spark's
        configuration (UI, event log)."""
        options = {
            "spark.hadoop.fs.s3a.path.style.access": "true",
            "spark.hadoop.fs.s3a.endpoint.region": self.region,
        }
        if self.endpoint_url:
            options["spark.hadoop.fs.s3a.endpoint"] = self.endpoint_url
            options["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(
                self.endpoint_url.startswith("https://")
            ).lower()
        return options

    def pyarrow_options(self) -> dict[str, Any]:
        """Keyword arguments of ``pyarrow.fs.S3FileSystem``."""
        endpoint = urlsplit(self.endpoint_url) if self.endpoint_url else None
        return {
            "access_key": self.access_key_id or None,
            "secret_key": self._secret,
            "region": self.region,
            "endpoint_override": endpoint.netloc if endpoint else None,
            "scheme": endpoint.scheme if endpoint else "https",
        }

    def boto3_options(self) -> dict[str, Any]:
        """Keyword arguments of ``boto3.client("s3", ...)`` but its ``config``."""
        return {
            "endpoint_url": self.endpoint_url or None,
            "aws_access_key_id": self.access_key_id or None,
            "aws_secret_access_key": self._secret,
            "region_name": self.region,
        }

    def delta_rs_options(self) -> dict[str, str]:
        """delta-rs (object_store) storage options."""
        options = {"AWS_REGION": self.region, "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false"}
        if self.endpoint_url:
            options["AWS_ENDPOINT_URL"] = self.endpoint_url
            options["AWS_ALLOW_HTTP"] = str(self.endpoint_url.startswith("http://")).lower()
        if self.access_key_id:
            options["AWS_ACCESS_KEY_ID"] = self.access_key_id
        if self._secret is not None:
            options["AWS_SECRET_ACCESS_KEY"] = self._secret
        return options


def _jaas_quoted(text: str) -> str:
    """``text`` as a JAAS quoted string: backslashes and double quotes escaped."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _aws(field: str) -> Any:
    return Field(default=None, validation_alias=AliasChoices(_AWS_FIELDS[field], field))


class ContractSettings(BaseModel):
    """The contracts a deployment runs and the topic of each."""

    # A directory of contract files (*.json) that add to the shipped ones or replace them.
    contracts_dir: str | None = None
    # The topic of each contract by contract name, where it is not the contract's own:
    # INGEST_TOPICS or `topics:` in the YAML file; INGEST_<NAME>_TOPIC (e.g.
    # INGEST_USERS_TOPIC), the most specific, wins over the contract's entry here.
    topics: dict[str, str] = Field(default_factory=dict)
    # The contracts this deployment runs, comma-separated names (default: every one found).
    contract_names: str | None = None


class KafkaSettings(BaseModel):
    """The brokers, how the service connects and how it reads them."""

    kafka_bootstrap_servers: str = "localhost:9092"
    users_topic: str | None = Field(default=None, min_length=1)
    sensors_topic: str | None = Field(default=None, min_length=1)
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_ca_location: str | None = None
    kafka_ssl_keystore_location: str | None = None
    kafka_starting_offsets: Literal["earliest", "latest"] = "earliest"
    # Committed data only (Kafka's contract for transactional producers): an aborted
    # transaction's records never reach a table, and the end a reader can reach is the
    # last stable offset. read_uncommitted also reads open and aborted transactions.
    kafka_isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed"
    # Start past offsets the brokers no longer have (recorded in bronze/skipped_offsets)
    # instead of refusing to start (`service.kafka.lost_offsets`).
    kafka_skip_lost_offsets: bool = False
    # The consumer group the checkpoint's offsets are committed to after each batch, for
    # Kafka's own lag tools (never read back); unset: one per storage root
    # (`consumer_group`); empty: none.
    kafka_consumer_group: str | None = None
    # How long the start waits for the brokers to answer before it gives up (exit 4).
    kafka_connect_timeout_seconds: float = Field(default=30.0, gt=0)
    kafka_max_offsets_per_trigger: int = Field(default=500_000, gt=0)
    # Offsets one read task covers at most (Spark's maxRecordsPerPartition).
    kafka_max_records_per_task: int = Field(default=50_000, gt=0)


class StorageSettings(BaseModel):
    """Where the lake and the checkpoints live, and the S3 credentials."""

    storage_root: str = "./var/lakehouse"
    checkpoint_root: str | None = None
    aws_endpoint_url: str | None = _aws("aws_endpoint_url")
    aws_access_key_id: str | None = _aws("aws_access_key_id")
    aws_secret_access_key: SecretStr | None = _aws("aws_secret_access_key")
    aws_region: str = Field(default="us-east-1", validation_alias=AliasChoices("AWS_REGION"))


class SparkSettings(BaseModel):
    """The Spark session: local or a cluster, memory, UI, the ingest trigger."""

    spark_master: str = "local[*]"
    spark_driver_memory: str = Field(default="2g", pattern=r"^\d+[kmgt]?$")
    spark_shuffle_partitions: int = Field(
        default_factory=lambda data: default_shuffle_partitions(data["spark_master"]), gt=0
    )
    spark_ui_enabled: bool = True
    spark_ui_port: int = Field(default=4040, ge=1, le=65535)
    jars_dir: str = Field(default_factory=lambda: str(default_cache_dir() / "jars" / "spark"))
    # The driver JVM's class-data-sharing archive (`make cds`): None uses the
    # virtualenv's (service.streaming.session.DEFAULT_CDS_ARCHIVE) when it exists; "" uses none.
    spark_cds_archive: str | None = None
    trigger_interval_seconds: float = Field(default=10.0, ge=0)
    # Spark cluster mode (spark://, k8s://): all optional, unused by local[*].
    spark_driver_host: str | None = None
    spark_driver_bind_address: str | None = None
    spark_driver_port: int | None = Field(default=None, ge=1, le=65535)
    spark_driver_block_manager_port: int | None = Field(default=None, ge=1, le=65535)
    spark_executor_memory: str | None = Field(default=None, pattern=r"^\d+[kmgt]?$")
    spark_executor_cores: int | None = Field(default=None, gt=0)
    spark_executor_instances: int | None = Field(default=None, gt=0)
    spark_cores_max: int | None = Field(default=None, gt=0)
    spark_executor_jars_dir: str | None = None
    spark_local_dir: str | None = None
    spark_kubernetes_container_image: str | None = None
    spark_kubernetes_namespace: str | None = None
    spark_kubernetes_service_account: str | None = None
    spark_kubernetes_executor_pod_template: str | None = None
    spark_extra_conf: dict[str, str] = Field(default_factory=dict)


class GoldSettings(BaseModel):
    """The gold queries: windows, the join, the alerts topic, their state."""

    gold_enabled: bool = True
    # None: three ingest triggers. Gold's windowed rows wait for the watermark anyway;
    # each gold trigger costs every gold query a batch (plan, state stores, commits).
    gold_trigger_interval_seconds: float | None = Field(default=None, ge=0)
    watermark: str = Field(default="10 minutes", pattern=_INTERVAL)
    stats_window: str = Field(default="1 minute", pattern=_INTERVAL)
    heart_rate_window: str = Field(default="5 minutes", pattern=_INTERVAL)
    heart_rate_slide: str = Field(default="1 minute", pattern=_INTERVAL)
    join_tolerance_seconds: int = Field(default=30, gt=0)
    alert_heart_rate_bpm: float = Field(default=180.0, gt=0)
    alerts_topic: str = Field(default="alerts", min_length=1)
    # Silver files per gold micro-batch: bounds a catch-up batch (Delta's own default).
    gold_max_files_per_trigger: int = Field(default=1000, gt=0)
    # Cap on the native memory shared by all RocksDB state stores of one JVM; unset, each
    # store is bounded on its own (and reports its memory in the query progress).
    state_store_memory_mb: int | None = Field(default=None, gt=0)


class MaintenanceSettings(BaseModel):
    """Compaction, VACUUM and Delta checkpoints of the tables."""

    # Table maintenance (service.lake.maintenance): every query compacts (OPTIMIZE) and
    # vacuums the tables it owns between its own batches, once per interval (0 = never).
    maintenance_interval_seconds: float = Field(default=3600.0, ge=0)
    # Compaction runs when a table's snapshot has at least this many files.
    maintenance_min_files: int = Field(default=32, ge=2)
    # VACUUM deletes files unreferenced for longer than this; at least Delta's 7 days.
    vacuum_retention_hours: int = VACUUM_MIN_RETENTION_HOURS
    # Opt-in Delta auto-compaction in the driver, after a write leaves this many small
    # files in a table (or partition); unset, no auto-compaction.
    compact_min_files: int | None = Field(default=None, ge=2)
    # Commits between two Delta checkpoints of a table, which the driver writes after
    # the batches (service.lake.log_checkpoints); each table adds its own 0-4.
    delta_checkpoint_commits: int = Field(default=10, ge=1)


class RecordSettings(BaseModel):
    """Limits every record is checked against, and dedup's horizon."""

    max_payload_bytes: int = Field(default=1024 * 1024, gt=0)
    max_future_seconds: int = Field(default=300, ge=0)
    dedup_horizon_seconds: int = Field(default=3600, ge=0)


class OperationsSettings(BaseModel):
    """HTTP, logs, the lease, health, lag and reconcile checks, the stop."""

    http_port: int = Field(default=8080, ge=0, le=65535)
    log_format: Literal["json", "console"] = "json"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    lease_ttl_seconds: float = Field(default=30.0, gt=0)
    lease_renew_seconds: float = Field(default=5.0, gt=0)
    # /healthz fails (liveness: restart) when a query with data waiting has finished
    # no batch for this long.
    wedged_seconds: float = Field(default=900.0, gt=0)
    # How often the driver polls the brokers' end offsets for the Kafka lag gauges.
    lag_poll_seconds: float = Field(default=15.0, gt=0, le=300)
    # How often the driver reconciles what it ingested since its last check
    # (`service.driver.lake_audit`); 0 turns the periodic check off.
    reconcile_interval_seconds: float = Field(default=300.0, ge=0)
    # The whole graceful stop (SIGTERM, Ctrl-C): the batches in flight finish and
    # commit, no new one starts; past it the queries are interrupted (their batches
    # replay on restart). The chart's terminationGracePeriodSeconds is this plus 30.
    stop_timeout_seconds: float = Field(default=150.0, gt=0)


class Settings(
    OperationsSettings,
    RecordSettings,
    MaintenanceSettings,
    GoldSettings,
    SparkSettings,
    StorageSettings,
    KafkaSettings,
    ContractSettings,
    BaseSettings,
):
    """Every setting of the service, read once; see docs/configuration.md. Its fields are
    declared by group (the bases, listed last group first: pydantic orders the fields
    of the last base first)."""

    model_config = SettingsConfigDict(
        env_prefix=_ENV_PREFIX,
        frozen=True,
        extra="forbid",
        populate_by_name=True,
        case_sensitive=False,
    )

    @model_validator(mode="before")
    @classmethod
    def _topic_variables(cls, data: Any) -> Any:
        """INGEST_<NAME>_TOPIC of any contract (users and sensors are fields of their own):
        the most specific setting, it wins over the contract's entry in `topics`."""
        if not isinstance(data, dict):
            return data
        named = {
            match[1].lower(): value
            for key, value in os.environ.items()
            if (match := _TOPIC_VARIABLE.match(key.upper()))
            and match[1].lower() not in ("users", "sensors", "alerts")
        }
        topics = data.get("topics", {})
        if named and isinstance(topics, dict):  # else pydantic names INGEST_TOPICS
            data = {**data, "topics": {**topics, **named}}
        return data

    @model_validator(mode="after")
    def _check_consistency(self) -> Settings:
        for server in self.kafka_bootstrap_servers.split(","):
            if not _BOOTSTRAP_RE.match(server.strip()):
                raise ValueError(f"kafka_bootstrap_servers: {server.strip()!r} is not host:port")
        for field in ("storage_root", "checkpoint_root"):
            value: str | None = getattr(self, field)
            if value is not None and re.match(r"^(s3|s3n)://", value):
                raise ValueError(f"{field}: use the s3a:// scheme, not {value.split(':')[0]}://")
            if value is not None and "://" in value and not value.startswith(("s3a://", "file:")):
                raise ValueError(f"{field}: unsupported scheme in {value!r} (use a path or s3a://)")
        if self.kafka_security_protocol.startswith("SASL_"):
            if self.kafka_sasl_mechanism is None:
                raise ValueError("kafka_sasl_mechanism: required with SASL security protocols")
            if not self.kafka_sasl_username or self.kafka_sasl_password is None:
                raise ValueError(
                    "kafka_sasl_username: username and password required with SASL protocols"
                )
        if self.kafka_ssl_keystore_location and not self.kafka_security_protocol.endswith("SSL"):
            raise ValueError(
                "kafka_ssl_keystore_location: a client certificate needs the SSL or SASL_SSL"
                " security protocol"
            )
        for key in self.spark_extra_conf:
            if not key.startswith("spark."):
                raise ValueError(f"spark_extra_conf: key {key!r} does not start with 'spark.'")
        if self.spark_master.startswith("k8s://") and not self.spark_kubernetes_container_image:
            raise ValueError(
                "spark_kubernetes_container_image: required with a k8s:// Spark master"
            )
        if self.vacuum_retention_hours < VACUUM_MIN_RETENTION_HOURS:
            raise ValueError(
                f"vacuum_retention_hours: must be at least {VACUUM_MIN_RETENTION_HOURS} (7 days,"
                " Delta's file retention): a shorter VACUUM could delete files that readers and"
                " concurrent writers still need, and the service keeps Delta's check on"
            )
        if self.lease_renew_seconds * 2 > self.lease_ttl_seconds:
            raise ValueError("lease_renew_seconds: must be at most half of lease_ttl_seconds")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        yaml_file = os.environ.get("INGEST_CONFIG_FILE")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if yaml_file:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=yaml_file))
        return tuple(sources)

    @cached_property
    def contracts(self) -> Contracts:
        """The contracts of this deployment: the shipped ones and ``contracts_dir``'s, each on
        its topic (`topics`, INGEST_<NAME>_TOPIC). Read once; `ContractError` if invalid."""
        overrides = {
            name: topic
            for name, topic in (("users", self.users_topic), ("sensors", self.sensors_topic))
            if topic is not None
        }
        names = None
        if self.contract_names is not None:
            names = [n.strip() for n in self.contract_names.split(",") if n.strip()]
        return load_contracts(self.contracts_dir, {**self.topics, **overrides}, names)

    @property
    def gold_trigger_seconds(self) -> float:
        """The gold queries' trigger interval (default: three ingest triggers)."""
        if self.gold_trigger_interval_seconds is not None:
            return self.gold_trigger_interval_seconds
        return 3 * self.trigger_interval_seconds

    @property
    def gold_yield_seconds(self) -> float:
        """How long a gold batch waits for ingest batches in flight (`IngestBatches`)."""
        return self.trigger_interval_seconds / 2

    @property
    def kafka(self) -> KafkaConnection:
        """The Kafka connection settings."""
        return KafkaConnection(
            bootstrap_servers=self.kafka_bootstrap_servers,
            security_protocol=self.kafka_security_protocol,
            sasl_mechanism=self.kafka_sasl_mechanism,
            sasl_username=self.kafka_sasl_username,
            sasl_password=self.kafka_sasl_password,
            ssl_ca_location=self.kafka_ssl_ca_location,
            ssl_keystore_location=self.kafka_ssl_keystore_location,
        )

    @property
    def storage(self) -> StorageConnection:
        """The object store connection settings."""
        return StorageConnection(
            endpoint_url=self.aws_endpoint_url,
            access_key_id=self.aws_access_key_id,
            secret_access_key=self.aws_secret_access_key,
            region=self.aws_region,
        )

    @property
    def uses_s3(self) -> bool:
        """Whether the lakehouse lives on an S3 endpoint."""
        return self.storage_uri.startswith("s3a://") or self.checkpoint_uri.startswith("s3a://")

    @property
    def storage_uri(self) -> str:
        """Storage root as a URI Spark and Hadoop accept (local paths made absolute)."""
        return _as_uri(self.storage_root)

    @property
    def consumer_group(self) -> str:
        """The consumer group the checkpoint's offsets are copied to: the setting, else
        ``lakehouse-ingest:<storage root URI>``, one per lake ("" = none)."""
        if self.kafka_consumer_group is not None:
            return self.kafka_consumer_group
        return f"lakehouse-ingest:{self.storage_uri}"

    @property
    def checkpoint_uri(self) -> str:
        """Checkpoint root URI: ``checkpoint_root``, else ``<storage root>/_checkpoints``."""
        if self.checkpoint_root:
            return _as_uri(self.checkpoint_root)
        return f"{self.storage_uri}/{CHECKPOINTS_DIR}"

    def redacted(self) -> dict[str, Any]:
        """Settings as a dict fit for logging: secrets masked by pydantic's SecretStr."""
        return {k: (str(v) if isinstance(v, SecretStr) else v) for k, v in self}


def _as_uri(location: str) -> str:
    if "://" in location or location.startswith("file:"):
        return location.rstrip("/")
    # Hadoop's qualified form of a local path (file:/abs), which Delta compares against.
    return "file:" + str(Path(location).expanduser().resolve())


def load_settings(**overrides: Any) -> Settings:
    """Read and validate settings once; raise `ConfigError` naming the bad key."""
    if (path := os.environ.get("INGEST_CONFIG_FILE")) and not Path(path).is_file():
        raise ConfigError(f"INGEST_CONFIG_FILE: no such file {path!r}")
    try:
        return Settings(**overrides)
    except SettingsError as e:
        # A source could not read a value: e.g. INGEST_TOPICS or INGEST_SPARK_EXTRA_CONF
        # that is not JSON. The value itself is not repeated (it may hold a secret).
        found = re.search(r'field "(\w+)" from source "(\w+)"', str(e))
        field = found[1] if found else ""
        key = env_name(field) if field in Settings.model_fields else (field or "settings")
        cause = e.__cause__
        why = f"not valid JSON: {cause}" if isinstance(cause, json.JSONDecodeError) else str(e)
        raise ConfigError(f"invalid configuration: {key}: {why}") from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        raise ConfigError(
            f"invalid configuration: INGEST_CONFIG_FILE: {path} is not valid YAML{where}: {problem}"
        ) from e
    except ValidationError as e:
        first = e.errors()[0]
        loc = [str(p) for p in first["loc"]]
        message = first["msg"].removeprefix("Value error, ")
        if loc:
            key = env_name(loc[0]) if loc[0] in Settings.model_fields else loc[0]
            raise ConfigError(f"invalid configuration: {key}: {message}") from e
        field, _, rest = message.partition(": ")
        key = env_name(field) if field in Settings.model_fields else field
        raise ConfigError(f"invalid configuration: {key}: {rest or message}") from e
