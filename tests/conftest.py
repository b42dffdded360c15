"""Suite-wide set-up: pin the process time zone, so timestamps collected from Spark are
UTC; run the suite in three lanes under ``pytest -n 3`` (`make test`); and the fixtures every
suite shares, each started only when a test asks for it: the one SparkSession, the real
servers on loopback (a Kafka broker and MinIO, once per session) and fresh lakes on them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from devstack import KafkaBroker, MinioServer
from pyspark.sql import SparkSession
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling

from tests.support.lake import Lake, LakeFactory, storage_env
from tests.support.lanes import lane_of
from tests.support.spark import local_spark

os.environ["TZ"] = "UTC"
time.tzset()


class _Lanes(LoadScopeScheduling):  # type: ignore[misc]
    """xdist's scope scheduling with one scope per lane, so each worker takes one lane.

    Not ``--dist loadgroup`` with ``xdist_group`` marks: xdist 3.8.0 groups by renaming
    the nodes through ``Item._nodeid``, which pytest 9.2 no longer reads (tried: it
    spread the tests over both workers).
    """

    def _split_scope(self, nodeid: str) -> str:
        return lane_of(nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> _Lanes:
    """The scheduler of ``pytest -n 3``: the lanes of `tests.support.lanes`."""
    return _Lanes(config, log)


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
    return storage_env(minio_server)


@pytest.fixture(scope="session")
def spark(request: pytest.FixtureRequest) -> Iterator[SparkSession]:
    """The test process's one SparkSession (`local_spark`).

    When a test of this run uses the test MinIO, the session reads it too, whichever test
    asks for Spark first: its JVM takes the AWS variables when it starts.
    """
    uses_minio = any(
        "minio_server" in getattr(item, "fixturenames", ()) for item in request.session.items
    )
    session = local_spark(request.getfixturevalue("s3_env") if uses_minio else None)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def make_lake(
    kafka_broker: KafkaBroker,
    s3_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> LakeFactory:
    """Fresh lakes (`Lake.fresh`) on the session's broker and MinIO."""

    def make(
        name: str,
        users_config: Mapping[str, str] | None = None,
        work_dir: Path | None = None,
    ) -> Lake:
        directory = work_dir or tmp_path_factory.mktemp(name[:30])
        return Lake.fresh(name, kafka_broker, s3_env, directory, users_config)

    return make


@pytest.fixture
def lake(request: pytest.FixtureRequest, make_lake: LakeFactory, tmp_path: Path) -> Lake:
    """Fresh topics (3 partitions) and a fresh s3a storage root for one test."""
    return make_lake(request.node.name, work_dir=tmp_path)
