"""Kafka administration through confluent-kafka: access check and topic creation."""

from __future__ import annotations

from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from service.config import Settings
from service.errors import ConfigError, IngestError, KafkaAccessRefusedError

log = structlog.get_logger(__name__)

# How long the start-up access check waits for the brokers' metadata.
ACCESS_CHECK_SECONDS = 10.0


def check_kafka_access(settings: Settings, timeout: float = ACCESS_CHECK_SECONDS) -> None:
    """Raise `KafkaAccessRefusedError` when the brokers reject the SASL credentials or their
    certificate is not trusted; brokers that are only unreachable are Spark's to retry.

    Without this, a wrong password surfaced as a streaming query's failure after the
    JVM started, behind dozens of librdkafka retry lines.
    """
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
    try:
        admin.list_topics(timeout=timeout)
        return
    except KafkaException:
        admin.poll(1)  # serves the error callbacks
    refused = [e for e in errors if _refusal(e)]
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
    existing = set(admin.list_topics(timeout=30).topics)
    brokers = len(admin.list_topics(timeout=30).brokers)
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
