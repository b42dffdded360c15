"""Session-wide real servers on loopback: a Kafka broker and MinIO."""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from devstack import KafkaBroker, MinioServer
from pyspark.sql import SparkSession

from service.config import Settings
from service.streaming.session import build_spark
from tests.support.lake import Lake


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A started single-node KRaft broker, stopped at the end of the session."""
    with KafkaBroker(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker


@pytest.fixture(scope="session")
def minio_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MinioServer]:
    """A started MinIO with the bucket "lakehouse", stopped at the end of the session."""
    with MinioServer(tmp_path_factory.mktemp("minio")) as server:
        server.create_bucket("lakehouse")
        yield server


@pytest.fixture(scope="session")
def s3_env(minio_server: MinioServer) -> dict[str, str]:
    """The standard AWS variables that point s3a (and boto3) at the test MinIO."""
    return {
        "AWS_ENDPOINT_URL": minio_server.endpoint_url,
        "AWS_ACCESS_KEY_ID": minio_server.access_key,
        "AWS_SECRET_ACCESS_KEY": minio_server.secret_key,
        "AWS_REGION": "us-east-1",
    }


@pytest.fixture(scope="session")
def spark(s3_env: dict[str, str]) -> Iterator[SparkSession]:
    """A test-side SparkSession that reads the lakehouse on MinIO or local disk."""
    os.environ.update(s3_env)  # the JVM inherits these at launch; s3a reads them
    settings = Settings(
        spark_master="local[2]",
        spark_ui_enabled=False,
        spark_shuffle_partitions=2,
        aws_endpoint_url=s3_env["AWS_ENDPOINT_URL"],
    )
    session = build_spark(settings)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def lake(
    request: pytest.FixtureRequest,
    kafka_broker: KafkaBroker,
    s3_env: dict[str, str],
    tmp_path: Path,
) -> Lake:
    """Fresh topics (3 partitions) and a fresh s3a storage root for one test."""
    return Lake.fresh(request.node.name, kafka_broker, s3_env, tmp_path)
