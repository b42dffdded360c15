"""The line a failed query stops the driver with."""

from botocore.exceptions import ClientError

from service.driver.running import with_causes
from service.errors import LocalDiskFullError, QueryFailedError, StorageAccessDeniedError
from service.failures import local_disk_full, named_failure, query_failure, storage_refused

# The lake's storage and checkpoint roots.
ROOTS = ("s3a://lakehouse/lake", "s3a://lakehouse/lake/_checkpoints")
# What Spark reported when MinIO's credentials were rotated under a running driver.
REVOKED = (
    "[STREAM_FAILED] Query [id = 2da3, runId = a6aa] terminated with exception: "
    "java.nio.file.AccessDeniedException: s3a://lakehouse/lake/_checkpoints/ingest_sensors/"
    "commits/.2.7f71.tmp: getFileStatus on s3a://lakehouse/lake/_checkpoints/ingest_sensors/"
    "commits/.2.7f71.tmp: software.amazon.awssdk.services.s3.model.S3Exception: null "
    "(Service: S3, Status Code: 403, Request ID: 18EA):null\n=== Streaming Query ===\n..."
)


def test_a_refused_storage_request_names_the_store_status_and_runbook() -> None:
    error = query_failure("ingest_sensors", REVOKED, None, ROOTS)
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
        "ingest_users",
        "java.nio.file.AccessDeniedException: /lake/bronze/users: denied",
        None,
        ("/lake", "/lake/_checkpoints"),
    )
    assert isinstance(error, StorageAccessDeniedError)
    assert "the storage /lake/bronze/users refused this driver (permission denied)" in str(error)


def test_any_other_failure_keeps_spark_s_report() -> None:
    error = query_failure(
        "ingest_users", "java.lang.OutOfMemoryError: Java heap space", "/x", ROOTS
    )
    assert type(error) is QueryFailedError
    assert str(error) == "query ingest_users failed: java.lang.OutOfMemoryError: Java heap space"


def test_a_full_local_dir_names_the_directory_and_the_setting() -> None:
    spark_error = (
        "Job aborted due to stage failure: Task 0 in stage 0.0 failed 1 times, most recent "
        "failure: Lost task 0.0 (TID 0): java.io.IOException: No space left on device"
    )
    error = query_failure("ingest_sensors", spark_error, "/scratch/spark", ROOTS)
    assert isinstance(error, LocalDiskFullError)
    assert str(error).startswith(
        "query ingest_sensors stopped: Spark's local directory /scratch/spark has no space left"
    )
    assert "INGEST_SPARK_LOCAL_DIR" in str(error)
    default = local_disk_full(spark_error, None)
    assert default is not None and "/tmp (Spark's default)" in str(default)
    assert local_disk_full("java.io.IOException: Connection reset", None) is None


def test_a_refused_lease_request_is_named_and_other_answers_are_not() -> None:
    def answer(status: int, code: str) -> ClientError:
        return ClientError(
            {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject"
        )

    uri = "s3a://lakehouse/lake/_checkpoints/_driver_lease.json"
    refused = storage_refused(answer(403, "AccessDenied"), uri)
    assert isinstance(refused, StorageAccessDeniedError)
    assert str(refused).startswith(
        "the storage s3a://lakehouse refused this driver (HTTP 403 AccessDenied: its credentials"
    )
    assert f"on {uri}. Nothing was written" in str(refused)
    assert storage_refused(answer(503, "SlowDown"), uri) is None
    assert named_failure("java.lang.OutOfMemoryError: Java heap space", None, ROOTS) is None


def test_a_refused_checkpoint_write_without_the_exception_class_is_named_too() -> None:
    # What Spark reported when the 403 met the query's offset log, not a table write.
    spark_error = (
        "s3a://lakehouse/lake/_checkpoints/ingest_sensors/offsets/4: getFileStatus on "
        "s3a://lakehouse/lake/_checkpoints/ingest_sensors/offsets/4: software.amazon.awssdk."
        "services.s3.model.S3Exception: null (Service: S3, Status Code: 403, Request ID: 18E)"
        ":null\n=== Streaming Query ===\n..."
    )
    error = query_failure("ingest_sensors", spark_error, None, ROOTS)
    assert isinstance(error, StorageAccessDeniedError)
    assert str(error).startswith(
        "query ingest_sensors stopped: the storage s3a://lakehouse refused this driver (HTTP 403: "
        "its credentials were revoked or rotated, or lack permission) on "
        "s3a://lakehouse/lake/_checkpoints/ingest_sensors/offsets/4. The batch"
    )
    throttled = spark_error.replace("Status Code: 403", "Status Code: 503")
    assert type(query_failure("ingest_sensors", throttled, None, ROOTS)) is QueryFailedError


def test_a_refused_write_named_by_its_key_alone_is_named_with_the_lake_s_bucket() -> None:
    # What Spark reported when the 403 met a task writing a silver file, and a Delta commit.
    for key in (
        "lake/silver/sensor_readings/event_date=2026-11-24/part-00000-b9af.c000.snappy.parquet",
        "lake/silver/sensor_duplicates/_delta_log/00000000000000000004.json",
    ):
        spark_error = (
            f"java.nio.file.AccessDeniedException: {key}: Writing Object on {key}: "
            "software.amazon.awssdk.services.s3.model.S3Exception: The Access Key Id you "
            "provided does not exist in our records. (Service: S3, Status Code: 403)"
        )
        error = query_failure("ingest_sensors", spark_error, None, ROOTS)
        assert isinstance(error, StorageAccessDeniedError)
        assert str(error).startswith(
            "query ingest_sensors stopped: the storage s3a://lakehouse refused this driver "
            "(HTTP 403: its credentials were revoked or rotated, or lack permission) on "
            f"s3a://lakehouse/{key}. "
        )
    elsewhere = query_failure("q", spark_error, None, ("s3a://other/elsewhere",))
    assert "the storage lake/silver/sensor_duplicates/_delta_log/" in str(elsewhere)


# What pyarrow and delta-rs raised against a real MinIO whose credentials the client did
# not have (tests/integration/test_storage_refusals.py asks them again).
PYARROW_REVOKED = (
    "When reading information for key 'lake/_checkpoints/ingest_sensors/offsets/4' in bucket "
    "'lakehouse': AWS Error ACCESS_DENIED during HeadObject operation: No response body."
)
DELTA_RS_REVOKED = (
    "Kernel error -> The operation lacked the necessary privileges to complete for path "
    "lake/bronze/sensors/_delta_log/_last_checkpoint\n  ↳ Error performing GET "
    "http://127.0.0.1:41799/lakehouse/lake/bronze/sensors/_delta_log/_last_checkpoint in "
    '23ms - Server returned non-2xx status code\n  ↳ 403 Forbidden\n  ↳ <?xml version="1.0" '
    'encoding="UTF-8"?>\n<Error><Code>SignatureDoesNotMatch</Code><Message>The request '
    "signature we calculated does not match"
)


def test_a_refusal_pyarrow_met_in_a_batch_is_the_same_error_as_s3as() -> None:
    # The writer read the batch's offsets file through pyarrow; the query failed with its
    # OSError inside the Python worker's traceback.
    spark_error = (
        "[STREAM_FAILED] Query [id = 2da3, runId = a6aa] terminated with exception: An "
        "exception was thrown from the Python worker. Please see the stack trace below.\n"
        "Traceback (most recent call last):\n  ...\nOSError: " + PYARROW_REVOKED
    )
    error = query_failure("ingest_sensors", spark_error, None, ROOTS)
    assert isinstance(error, StorageAccessDeniedError)
    assert str(error).startswith(
        "query ingest_sensors stopped: the storage s3a://lakehouse refused this driver (HTTP "
        "403 AccessDenied: its credentials were revoked or rotated, or lack permission) on "
        "s3a://lakehouse/lake/_checkpoints/ingest_sensors/offsets/4. The batch"
    )
    signature = PYARROW_REVOKED.replace("ACCESS_DENIED", "SIGNATURE_DOES_NOT_MATCH")
    named = named_failure(signature, None, ROOTS)
    assert isinstance(named, StorageAccessDeniedError)
    assert "(HTTP 403 SignatureDoesNotMatch:" in str(named)
    unreachable = PYARROW_REVOKED.replace("ACCESS_DENIED", "NETWORK_CONNECTION")
    assert named_failure(unreachable, None, ROOTS) is None


def test_a_refusal_delta_rs_met_is_the_same_error_as_s3as() -> None:
    named = named_failure(DELTA_RS_REVOKED, None, ROOTS)
    assert isinstance(named, StorageAccessDeniedError)
    assert str(named).startswith(
        "the storage s3a://lakehouse refused this driver (HTTP 403 SignatureDoesNotMatch: its "
        "credentials were revoked or rotated, or lack permission) on "
        "s3a://lakehouse/lake/bronze/sensors/_delta_log/_last_checkpoint."
    )
    throttled = DELTA_RS_REVOKED.replace("403 Forbidden", "503 Service Unavailable")
    assert named_failure(throttled, None, ROOTS) is None


class _CapturedError(Exception):
    """The shape of pyspark's converted JVM exception: a message and its cause."""

    def __init__(self, desc: str, cause: "_CapturedError | None" = None) -> None:
        super().__init__(desc)
        self._desc = desc
        self._cause = cause


def test_a_wrapper_s_report_carries_its_causes_down_to_the_root() -> None:
    root = _CapturedError(
        "No such file or directory: s3a://lakehouse/lake/_checkpoints/q/state/0/1.delta"
    )
    error = _CapturedError("Exception thrown in awaitResult: ", _CapturedError("Job aborted", root))
    assert with_causes(error) == (
        "Exception thrown in awaitResult: "
        "\ncaused by _CapturedError: Job aborted"
        "\ncaused by _CapturedError: No such file or directory: "
        "s3a://lakehouse/lake/_checkpoints/q/state/0/1.delta"
    )
    assert with_causes(_CapturedError("plain")) == "plain"
