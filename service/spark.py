"""Build the one SparkSession: Delta, the Kafka source and s3a from explicit jars."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from service.config import Settings
from service.errors import ConfigError

# Jars the Spark side needs (deploy/jvm/spark/pom.xml); checked at start so a
# missing `make jars` fails with a hint instead of a ClassNotFoundException later.
REQUIRED_JAR_PREFIXES = (
    "delta-spark_",
    "delta-storage-",
    "spark-sql-kafka-0-10_",
    "spark-token-provider-kafka-0-10_",
    "kafka-clients-",
    "commons-pool2-",
    "hadoop-aws-",
    "bundle-",
)


def runtime_jars(jars_dir: str) -> list[str]:
    """Return the jar paths to put on the classpath, or fail naming what is missing."""
    directory = Path(jars_dir)
    jars = sorted(str(p) for p in directory.glob("*.jar"))
    names = [Path(j).name for j in jars]
    missing = [p for p in REQUIRED_JAR_PREFIXES if not any(n.startswith(p) for n in names)]
    if missing:
        raise ConfigError(
            f"invalid configuration: INGEST_JARS_DIR: {jars_dir} lacks {', '.join(missing)}"
            " (run `make jars` to resolve them from Maven Central)"
        )
    return jars


def spark_conf(settings: Settings) -> dict[str, str]:
    """Return the Spark configuration for ``settings`` (pure: no session is touched).

    Credentials are deliberately absent: s3a reads the standard ``AWS_*`` variables
    from the JVM's environment, so secrets never appear on a command line or in the UI.
    """
    jars = runtime_jars(settings.jars_dir)
    conf = {
        "spark.master": settings.spark_master,
        "spark.app.name": "lakehouse-ingest",
        "spark.jars": ",".join(jars),
        "spark.driver.memory": settings.spark_driver_memory,
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.shuffle.partitions": str(settings.spark_shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": str(settings.spark_ui_enabled).lower(),
        "spark.ui.port": str(settings.spark_ui_port),
        "spark.ui.showConsoleProgress": "false",
        # Exactly-once on Delta needs synchronous offset commits.
        "spark.sql.streaming.asyncProgressTrackingEnabled": "false",
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.databricks.delta.schema.autoMerge.enabled": "false",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.endpoint.region": settings.aws_region,
        "spark.hadoop.fs.s3a.fast.upload": "true",
        "spark.hadoop.fs.s3a.retry.limit": "10",
        "spark.hadoop.fs.s3a.attempts.maximum": "10",
    }
    if settings.aws_endpoint_url:
        conf["spark.hadoop.fs.s3a.endpoint"] = settings.aws_endpoint_url
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(
            settings.aws_endpoint_url.startswith("https://")
        ).lower()
    return conf


def build_spark(settings: Settings) -> SparkSession:
    """Create (or return) the process's SparkSession configured for ``settings``."""
    builder = SparkSession.builder
    for key, value in spark_conf(settings).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
