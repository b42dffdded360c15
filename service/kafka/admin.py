"""Kafka administration through confluent-kafka: access check and topic creation."""

from __future__ import annotations

import time
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from service.config import Settings
from service.errors import (
    ConfigError,
    IngestError,
    KafkaAccessRefusedError,
    KafkaUnreachableError,
)

log = structlog.get_logger(__name__)


# The access check asks for the brokers' metadata in steps this long, so that a refusal
# ends it at once while an unreachable broker is waited for the whole timeout.
_ACCESS_STEP_SECONDS = 1.0


def check_kafka_access(settings: Settings, timeout: float | None = None) -> None:
    """Raise `KafkaAccessRefusedError` when the brokers reject the SASL credentials or their
    certificate is not trusted, `KafkaUnreachableError` when none answers within
    ``timeout`` (``INGEST_KAFKA_CONNECT_TIMEOUT_SECONDS``), and `ConfigError` when the
    brokers answer but a contract's topic is not among their topics.

    Without this, a wrong password surfaced as a streaming query's failure after the
    JVM started, behind dozens of librdkafka retry lines, a wrong address as a
    traceback from the first admin call, and a missing topic as a query's
    UnknownTopicOrPartitionException (exit 1, after the JVM started).
    """
    timeout = settings.kafka_connect_timeout_seconds if timeout is None else timeout
    errors: list[KafkaError] = []
    config: dict[str, Any] = {
        **settings.kafka.librdkafka_config(),
        "error_cb": errors.append,
        "log_level": 0,  # librdkafka would log each attempt; the one error raised says it
    }
    kafka = settings.kafka
    try:
        admin = AdminClient(config)
    except KafkaException as e:  # e.g. a CA or keystore file that cannot be read
        raise ConfigError(
            f"Kafka client configuration refused: {e.args[0].str()}. Check "
            "INGEST_KAFKA_SSL_CA_LOCATION and INGEST_KAFKA_SSL_KEYSTORE_LOCATION."
        ) from None
    started = time.monotonic()
    deadline = started + timeout
    while True:
        step = min(deadline - time.monotonic(), _ACCESS_STEP_SECONDS)
        try:
            metadata = admin.list_topics(timeout=max(step, 0.1))
        except KafkaException:
            admin.poll(0.2)  # serves the error callbacks
            # A refusal is final: say it now rather than after the whole timeout.
            if any(_refusal(e) for e in errors) or time.monotonic() >= deadline:
                break
        else:
            _check_topics(settings, set(metadata.topics))
            return
    waited = time.monotonic() - started
    refused = [e for e in errors if _refusal(e)]
    if not refused:
        transport = [e for e in errors if e.code() == KafkaError._TRANSPORT]
        seen = (transport or errors)[0].str() if errors else "no answer"
        raise KafkaUnreachableError(
            f"no Kafka broker answered at {kafka.bootstrap_servers} "
            f"(INGEST_KAFKA_BOOTSTRAP_SERVERS, {kafka.security_protocol}) within {waited:.0f} s"
            f" (INGEST_KAFKA_CONNECT_TIMEOUT_SECONDS): {seen}. Check the address, the port and "
            "the network path to the brokers (docs/runbooks/DriverRestarting.md)."
        )
    if refused:
        who = (
            f"user {kafka.sasl_username!r} ({kafka.sasl_mechanism})"
            if kafka.sasl_mechanism
            else "us"
        )
        raise KafkaAccessRefusedError(
            f"Kafka at {kafka.bootstrap_servers} ({kafka.security_protocol}) refused {who}: "
            f"{refused[0].str()}. Check INGEST_KAFKA_SASL_USERNAME, INGEST_KAFKA_SASL_PASSWORD, "
            "INGEST_KAFKA_SSL_CA_LOCATION and INGEST_KAFKA_SSL_KEYSTORE_LOCATION."
        )


def _check_topics(settings: Settings, existing: set[str]) -> None:
    """Raise `ConfigError` naming each contract whose topic is not in ``existing`` (the
    topics the brokers list): the driver reads a contract's topic, it never creates it."""
    missing = [c for c in settings.contracts if c.topic not in existing]
    if not missing:
        return
    at = settings.kafka.bootstrap_servers
    raise ConfigError(
        "; ".join(
            f"topic {c.topic!r} of contract {c.name} (INGEST_{c.name.upper()}_TOPIC) does not"
            f" exist on the brokers at {at}"
            for c in missing
        )
        + f": create {'it' if len(missing) == 1 else 'them'} first (the driver reads a"
        " contract's topic, it does not create it), or set the variable to the topic the"
        " producers write"
    )


def _refusal(error: KafkaError) -> bool:
    """Whether ``error`` is the brokers refusing us rather than their being unreachable:
    SASL or our TLS verification failed, or the broker's TLS stack sent an alert (e.g. a
    client certificate missing or not trusted, "SSL alert number 42")."""
    if error.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL):
        return True
    return error.code() == KafkaError._TRANSPORT and "SSL alert number" in error.str()


def ensure_topics(settings: Settings, topics: list[str], partitions: int) -> None:
    """Create the missing ``topics`` (replication 1 on a single broker, else 3)."""
    admin = AdminClient(settings.kafka.librdkafka_config())
    try:
        metadata = admin.list_topics(timeout=settings.kafka_connect_timeout_seconds)
    except KafkaException as e:
        raise KafkaUnreachableError(
            f"no Kafka broker answered at {settings.kafka.bootstrap_servers} "
            "(INGEST_KAFKA_BOOTSTRAP_SERVERS) within "
            f"{settings.kafka_connect_timeout_seconds:.0f} s "
            f"(INGEST_KAFKA_CONNECT_TIMEOUT_SECONDS): {e.args[0].str()}"
        ) from None
    existing = set(metadata.topics)
    brokers = len(metadata.brokers)
    missing = [t for t in topics if t not in existing]
    if not missing:
        return
    futures = admin.create_topics(
        [
            NewTopic(t, num_partitions=partitions, replication_factor=min(3, brokers))
            for t in missing
        ]
    )
    for topic, future in futures.items():
        try:
            future.result(timeout=30)
            log.info("topic_created", topic=topic, partitions=partitions)
        except Exception as e:
            if "TOPIC_ALREADY_EXISTS" not in str(e):
                raise IngestError(f"cannot create topic {topic}: {e}") from e
