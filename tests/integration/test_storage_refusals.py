"""A refused request (HTTP 403) is one error whichever storage client meets it first:
pyarrow (checkpoint files), delta-rs (tables) and boto3 (the lease) against a real MinIO
with a secret key it does not accept; s3a's wording is read the same way
(tests/unit/test_query_failure.py, tests/integration/test_storage_outage.py)."""

from __future__ import annotations

import pytest
from devstack import MinioServer
from pydantic import SecretStr

from service.config import Settings
from service.errors import LakeReadError, StorageAccessDeniedError
from service.failures import named_failure
from service.lake.lakeview import LakeReader
from service.lake.lease import acquire_driver_lease
from service.lake.object_files import ObjectFiles

ROOT = "s3a://lakehouse/refusals"
REFUSED = "the storage s3a://lakehouse refused this driver (HTTP 403"


@pytest.fixture
def refused(minio_server: MinioServer) -> Settings:
    """Settings for a lake on the test MinIO with a secret key it does not accept."""
    return Settings(
        storage_root=ROOT,
        aws_endpoint_url=minio_server.endpoint_url,
        aws_access_key_id=minio_server.access_key,
        aws_secret_access_key=SecretStr("not-the-secret-key"),
    )


def named(error: BaseException, settings: Settings) -> StorageAccessDeniedError:
    failure = named_failure(str(error), None, (settings.storage_uri, settings.checkpoint_uri))
    assert isinstance(failure, StorageAccessDeniedError), str(error)
    return failure


def test_pyarrow_meets_a_refusal_as_storage_access_denied(refused: Settings) -> None:
    offsets = f"{ROOT}/_checkpoints/ingest_sensors/offsets/4"
    with pytest.raises(OSError) as raised:
        ObjectFiles(refused).read_text(offsets)

    failure = named(raised.value, refused)
    assert str(failure).startswith(f"{REFUSED} AccessDenied: ")
    assert f" on {offsets}. " in str(failure)


def test_delta_rs_meets_a_refusal_as_storage_access_denied(refused: Settings) -> None:
    reader = LakeReader.from_settings(refused)
    with pytest.raises(LakeReadError) as raised:
        reader.open(reader.table("bronze/sensors"))

    assert raised.value.__cause__ is not None
    failure = named(raised.value.__cause__, refused)
    assert str(failure).startswith(f"{REFUSED} SignatureDoesNotMatch: ")
    assert f" on {ROOT}/bronze/sensors/_delta_log/" in str(failure)


def test_boto3_meets_a_refusal_as_storage_access_denied(refused: Settings) -> None:
    with pytest.raises(StorageAccessDeniedError) as raised:
        acquire_driver_lease(refused)

    assert str(raised.value).startswith(f"{REFUSED} SignatureDoesNotMatch: ")
    assert f" on {ROOT}/_checkpoints/_driver_lease.json. " in str(raised.value)
