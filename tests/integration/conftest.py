"""Session-wide real servers on loopback: a Kafka broker and MinIO."""

from collections.abc import Iterator

import pytest
from devstack import KafkaBroker, MinioServer


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
