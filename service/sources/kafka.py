"""Spark Kafka source options and the streaming read of one topic."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from service.config import Settings


def kafka_client_options(settings: Settings) -> dict[str, str]:
    """Kafka client properties (security included) shared by Spark and admin clients."""
    options = {
        "bootstrap.servers": settings.kafka_bootstrap_servers,
        "security.protocol": settings.kafka_security_protocol,
    }
    if settings.kafka_sasl_mechanism and settings.kafka_sasl_password is not None:
        module = (
            "org.apache.kafka.common.security.plain.PlainLoginModule"
            if settings.kafka_sasl_mechanism == "PLAIN"
            else "org.apache.kafka.common.security.scram.ScramLoginModule"
        )
        password = settings.kafka_sasl_password.get_secret_value().replace('"', '\\"')
        options["sasl.mechanism"] = settings.kafka_sasl_mechanism
        options["sasl.jaas.config"] = (
            f'{module} required username="{settings.kafka_sasl_username}" password="{password}";'
        )
    if settings.kafka_ssl_ca_location:
        options["ssl.truststore.type"] = "PEM"
        options["ssl.truststore.location"] = settings.kafka_ssl_ca_location
    return options


def source_options(settings: Settings, topic: str) -> dict[str, str]:
    """Options of Spark's Kafka source for ``topic`` (pure)."""
    options = {f"kafka.{k}": v for k, v in kafka_client_options(settings).items()}
    options.update(
        {
            "subscribe": topic,
            "startingOffsets": settings.kafka_starting_offsets,
            "maxOffsetsPerTrigger": str(settings.kafka_max_offsets_per_trigger),
            "includeHeaders": "true",
            # Offsets that vanished (retention, topic recreated) must stop the query loudly.
            "failOnDataLoss": "true",
        }
    )
    return options


def read_topic(spark: SparkSession, settings: Settings, topic: str) -> DataFrame:
    """The streaming DataFrame of every record of ``topic``."""
    return spark.readStream.format("kafka").options(**source_options(settings, topic)).load()
