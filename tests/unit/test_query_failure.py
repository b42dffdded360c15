"""The line a failed query stops the driver with."""

from service.app import query_failure
from service.errors import QueryFailedError, StorageAccessDeniedError

# What Spark reported when MinIO's credentials were rotated under a running driver.
REVOKED = (
    "[STREAM_FAILED] Query [id = 2da3, runId = a6aa] terminated with exception: "
    "java.nio.file.AccessDeniedException: s3a://lakehouse/lake/_checkpoints/ingest_sensors/"
    "commits/.2.7f71.tmp: getFileStatus on s3a://lakehouse/lake/_checkpoints/ingest_sensors/"
    "commits/.2.7f71.tmp: software.amazon.awssdk.services.s3.model.S3Exception: null "
    "(Service: S3, Status Code: 403, Request ID: 18EA):null\n=== Streaming Query ===\n..."
)


def test_a_refused_storage_request_names_the_store_status_and_runbook() -> None:
    error = query_failure("ingest_sensors", REVOKED)
    assert isinstance(error, StorageAccessDeniedError)
    assert str(error) == (
        "query ingest_sensors stopped: the storage s3a://lakehouse refused this driver "
        "(HTTP 403: its credentials were revoked or rotated, or lack permission) on "
        "s3a://lakehouse/lake/_checkpoints/ingest_sensors/commits/.2.7f71.tmp. The batch is "
        "not committed to its checkpoint and replays exactly once on restart; restore access "
        "and restart (docs/runbooks/StorageUnreachable.md)"
    )


def test_a_local_permission_denial_is_named_as_such() -> None:
    error = query_failure(
        "ingest_users", "java.nio.file.AccessDeniedException: /lake/bronze/users: denied"
    )
    assert isinstance(error, StorageAccessDeniedError)
    assert "the storage /lake/bronze/users refused this driver (permission denied)" in str(error)


def test_any_other_failure_keeps_spark_s_report() -> None:
    error = query_failure("ingest_users", "java.lang.OutOfMemoryError: Java heap space")
    assert type(error) is QueryFailedError
    assert str(error) == "query ingest_users failed: java.lang.OutOfMemoryError: Java heap space"
