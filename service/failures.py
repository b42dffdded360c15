"""What a failure stops the driver with: the few an operator can act on, named in one line.

Spark reports a failed job or query as one long text (the JVM exception, its causes and
the query plan). Two causes in it have a clear remedy and get their own error and
message: the storage refusing the driver (HTTP 401/403) and a full local directory.
Which storage client meets a refusal first is a race, so each one's wording is read
into the same error: s3a's (Spark's tables and checkpoints), pyarrow's (the checkpoint
files the writers read, `service.lake.object_files`), delta-rs's, and boto3's (the
lease, taken before any Spark job).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from botocore.exceptions import ClientError

from service.config import Location
from service.errors import LocalDiskFullError, QueryFailedError, StorageAccessDeniedError

# s3a's translation of an HTTP 401/403 (and the JVM's for a local permission denial).
_ACCESS_DENIED = re.compile(r"java\.nio\.file\.AccessDeniedException: (\S+?): ")
_HTTP_STATUS = re.compile(r"Status Code: (\d{3})")
# A streaming query's own checkpoint writes report the same refusal without the class
# name: "s3a://…/offsets/4: getFileStatus on …: S3Exception: … Status Code: 403 …".
_HTTP_DENIED = re.compile(r"Status Code: 40[13]\b")
_S3A_PATH = re.compile(r"s3a://[^\s:]+")
# pyarrow's S3 filesystem: "When reading information for key 'K' in bucket 'B': AWS Error
# ACCESS_DENIED during HeadObject operation" (its codes for an HTTP 403).
_PYARROW_DENIED = re.compile(
    r"for key '([^']*)' in bucket '([^']*)': AWS Error "
    r"(ACCESS_DENIED|SIGNATURE_DOES_NOT_MATCH|INVALID_ACCESS_KEY_ID)\b"
)
# delta-rs (object_store): "lacked the necessary privileges to complete for path K …
# 403 Forbidden … <Code>SignatureDoesNotMatch</Code>".
_DELTA_RS_DENIED = re.compile(
    r"lacked the necessary privileges to complete for path (\S+).*?\b(40[13]) "
    r"(?:Forbidden|Unauthorized)(?:.*?<Code>(\w+)</Code>)?",
    re.S,
)
_NO_SPACE = "No space left on device"
# Spark's default when neither spark.local.dir nor SPARK_LOCAL_DIRS is set.
_DEFAULT_LOCAL_DIR = "/tmp"


def storage_access_denied(error: str, roots: Sequence[str]) -> StorageAccessDeniedError | None:
    """The storage refused a request in ``error``: the store, the status and the runbook.

    ``roots`` are the lake's storage and checkpoint roots (URIs).
    """
    outcome = "The batch is not committed to its checkpoint and replays exactly once on restart"
    if (pyarrow := _PYARROW_DENIED.search(error)) is not None:
        key, bucket, code = pyarrow.groups()
        return _refused(f"s3a://{bucket}/{key}", f"403 {_camel(code)}", outcome)
    if (delta_rs := _DELTA_RS_DENIED.search(error)) is not None:
        key, status_code, code = delta_rs.groups()
        status_text = f"{status_code} {code}" if code else status_code
        return _refused(_with_bucket(key, roots), status_text, outcome)
    denied = _ACCESS_DENIED.search(error)
    if denied is not None:
        path = _with_bucket(denied.group(1), roots)
    elif _HTTP_DENIED.search(error) and (s3a := _S3A_PATH.search(error)):
        path = s3a.group(0)
    else:
        return None
    status = _HTTP_STATUS.search(error)
    return _refused(path, status.group(1) if status else None, outcome)


def _camel(code: str) -> str:
    """pyarrow's error code as S3 spells it (``SIGNATURE_DOES_NOT_MATCH`` →
    ``SignatureDoesNotMatch``; ``ACCESS_DENIED`` → ``AccessDenied``)."""
    return "".join(word.capitalize() for word in code.split("_"))


def _with_bucket(path: str, roots: Sequence[str]) -> str:
    """``path`` as an s3a URI when s3a named the refused object by its key alone (a task's
    data file, a Delta commit) and the key lies under one of the lake's s3a ``roots``."""
    if "://" in path or path.startswith("/"):
        return path
    for root in map(Location, roots):
        prefix = root.key.rstrip("/")
        if root.on_s3 and (not prefix or path.startswith(prefix + "/")):
            return f"s3a://{root.bucket}/{path}"
    return path


def _refused(path: str, status: str | None, outcome: str) -> StorageAccessDeniedError:
    """The one wording of a refusal: the store, the status, what became of the work."""
    store = "/".join(path.split("/")[:3]) if "://" in path else path
    why = (
        f"HTTP {status}: its credentials were revoked or rotated, or lack permission"
        if status
        else "permission denied"
    )
    return StorageAccessDeniedError(
        f"the storage {store} refused this driver ({why}) on {path}. {outcome}; "
        "restore access and restart (docs/runbooks/StorageUnreachable.md)"
    )


def local_disk_full(error: str, local_dir: str | None) -> LocalDiskFullError | None:
    """A write to Spark's local directory (shuffle and spill files) found no space."""
    if _NO_SPACE not in error:
        return None
    where = local_dir or f"{_DEFAULT_LOCAL_DIR} (Spark's default)"
    return LocalDiskFullError(
        f"Spark's local directory {where} has no space left: its shuffle and spill files "
        "could not be written. The batch is not committed to its checkpoint and replays "
        "exactly once on restart: free space there, or set INGEST_SPARK_LOCAL_DIR to a "
        "larger volume, and restart (docs/runbooks/DriverRestarting.md)"
    )


def named_failure(
    error: str, local_dir: str | None, roots: Sequence[str]
) -> QueryFailedError | None:
    """The failure with a named remedy that Spark's report ``error`` shows, if any
    (``roots``: the lake's storage and checkpoint roots)."""
    return storage_access_denied(error, roots) or local_disk_full(error, local_dir)


def storage_refused(error: ClientError, uri: str) -> StorageAccessDeniedError | None:
    """A request to ``uri`` that the storage refused (HTTP 401/403), named like s3a's."""
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if status not in (401, 403):
        return None
    code = error.response.get("Error", {}).get("Code", "")
    return _refused(uri, f"{status} {code}".strip(), "Nothing was written")


def query_failure(
    query: str, error: str, local_dir: str | None, roots: Sequence[str]
) -> QueryFailedError:
    """The error a failed query stops the driver with (`named_failure`)."""
    named = named_failure(error, local_dir, roots)
    if named is None:
        return QueryFailedError(f"query {query} failed: {error}")
    return type(named)(f"query {query} stopped: {named}")
