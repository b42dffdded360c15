"""Kafka administration through confluent-kafka: client configuration and topic creation."""

from __future__ import annotations

import structlog
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from service.config import Settings
from service.errors import IngestError

log = structlog.get_logger(__name__)


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
