"""Where the driver lease lives: one small object changed only by compare-and-swap.

The lease (`service.lake.lease`) is safe only if two drivers can never both believe they
wrote it. Each store offers the atomic primitive its storage really has:

- S3 (and MinIO): conditional writes. Creating uses ``If-None-Match: *`` (fails if the
  object exists), renewing and taking over use ``If-Match: <ETag>`` (fails if anyone
  wrote it since it was read). The version is the ETag.
- A local filesystem: an exclusive ``flock`` on a sidecar ``.lock`` file around each
  read-compare-write, the write itself an atomic rename. The version is the content's
  SHA-256. This serialises the drivers of one host, which is what a local lake has.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from service.config import Location, Settings

# What a store raises when the storage does not answer or refuses (not a lost race).
STORE_ERRORS = (OSError, BotoCoreError, ClientError)
# S3's answers to a conditional write that lost: 412, or 409 for a concurrent one.
_CONDITION_FAILED = {"PreconditionFailed", "ConditionalRequestConflict"}


class LeaseStore(Protocol):
    """Versioned reads and compare-and-swap writes of one small text object."""

    uri: str

    def read(self) -> tuple[str, str] | None:
        """The text and its version, or None if there is no lease."""
        ...

    def create(self, text: str) -> str | None:
        """Write ``text`` if there is no lease; its version, or None if there is one."""
        ...

    def replace(self, text: str, version: str) -> str | None:
        """Write ``text`` if the lease is still at ``version``; the new version or None."""
        ...

    def delete(self, version: str) -> None:
        """Remove the lease if it is still at ``version``."""
        ...


def lease_store(settings: Settings, uri: str) -> LeaseStore:
    """The store for a lease at ``uri`` (``s3a://bucket/key`` or ``file:/path``)."""
    if Location(uri).on_s3:
        return S3LeaseStore(settings, uri)
    return LocalLeaseStore(uri)


class S3LeaseStore:
    """The lease as an S3 object, written with conditional PUTs."""

    def __init__(self, settings: Settings, uri: str) -> None:
        self.uri = uri
        location = Location(uri)
        self._bucket, self._key = location.bucket, location.key
        self._s3: Any = boto3.client(
            "s3",
            **settings.storage.boto3_options(),
            config=Config(
                s3={"addressing_style": "path"},  # as the driver's s3a (MinIO)
                connect_timeout=5,
                read_timeout=10,
                retries={"max_attempts": 3, "mode": "standard"},
            ),
        )

    def read(self) -> tuple[str, str] | None:
        try:
            answer = self._s3.get_object(Bucket=self._bucket, Key=self._key)
        except ClientError as e:
            if e.response["Error"]["Code"] in {"NoSuchKey", "404"}:
                return None
            raise
        return answer["Body"].read().decode("utf-8"), str(answer["ETag"])

    def _put(self, text: str, **condition: str) -> str | None:
        try:
            answer = self._s3.put_object(
                Bucket=self._bucket, Key=self._key, Body=text.encode("utf-8"), **condition
            )
        except ClientError as e:
            if e.response["Error"]["Code"] in _CONDITION_FAILED:
                return None
            raise
        return str(answer["ETag"])

    def create(self, text: str) -> str | None:
        return self._put(text, IfNoneMatch="*")

    def replace(self, text: str, version: str) -> str | None:
        return self._put(text, IfMatch=version)

    def delete(self, version: str) -> None:
        current = self.read()
        if current is not None and current[1] == version:
            self._s3.delete_object(Bucket=self._bucket, Key=self._key)


class LocalLeaseStore:
    """The lease as a local file, changed under an exclusive lock."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._path = Path(Location(uri).key)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        with Path(f"{self._path}.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> tuple[str, str] | None:
        try:
            text = self._path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        return text, hashlib.sha256(text.encode("utf-8")).hexdigest()

    def _write(self, text: str) -> str:
        tmp = self._path.with_name(f".{self._path.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(self._path)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def read(self) -> tuple[str, str] | None:
        with self._locked():
            return self._read()

    def create(self, text: str) -> str | None:
        with self._locked():
            return None if self._read() is not None else self._write(text)

    def replace(self, text: str, version: str) -> str | None:
        with self._locked():
            current = self._read()
            return self._write(text) if current and current[1] == version else None

    def delete(self, version: str) -> None:
        with self._locked():
            current = self._read()
            if current is not None and current[1] == version:
                self._path.unlink()
