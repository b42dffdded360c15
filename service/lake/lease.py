"""Single-driver lease on the storage root: at most one live driver writes a lakehouse.

Delta on S3 (and MinIO) is safe with a single writer only. The lease is a small
JSON file under the checkpoint root that the owner rewrites every
``renew_seconds``. A starting driver takes it over when the file is absent,
when its owner is a dead process on this host, or when its heartbeat has not
advanced for ``ttl_seconds``; a heartbeat that keeps advancing means another
driver is alive, and the start fails with `LeaseHeldError`.

Every write is a compare-and-swap (`service.lake.lease_store`): creating succeeds only if
there is no lease, renewing and taking over only if nobody wrote it since it was
read. Two drivers starting at the same instant cannot both win: the loser gets
`LeaseHeldError`. A running driver whose renewal or `fence` finds the lease taken
stops with `LeaseLostError`; the writers call `fence` before each table write, so a
deposed driver commits at most the write it is in.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass

import structlog
from botocore.exceptions import BotoCoreError, ClientError

from service.background import Finished, PeriodicWorker
from service.config import Settings
from service.errors import LeaseHeldError, LeaseLostError, StorageUnreachableError
from service.failures import storage_refused
from service.lake.lease_store import STORE_ERRORS, LeaseStore, lease_store

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class LeaseRecord:
    """Who holds the lease and when they last renewed it."""

    owner: str
    host: str
    pid: int
    started_at: float
    heartbeat_at: float


def lease_location(checkpoint_uri: str) -> str:
    """The lease file of the lakehouse whose checkpoints are under ``checkpoint_uri``."""
    return f"{checkpoint_uri}/_driver_lease.json"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class DriverLease:
    """Acquire, renew, fence and release the driver lease in ``store``."""

    def __init__(
        self,
        store: LeaseStore,
        ttl_seconds: float,
        renew_seconds: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._ttl = ttl_seconds
        self._renew = renew_seconds
        self._clock = clock
        now = clock()
        self.record = LeaseRecord(uuid.uuid4().hex, socket.gethostname(), os.getpid(), now, now)
        self._version: str | None = None
        self._writing = threading.Lock()  # a version and the store agree under it
        self.lost = threading.Event()
        self._worker: PeriodicWorker | None = None

    def _read(self) -> tuple[LeaseRecord | None, str] | None:
        """The lease's record (None if unreadable) and version, or None if there is none."""
        found = self._store.read()
        if found is None:
            return None
        text, version = found
        try:
            return LeaseRecord(**json.loads(text)), version
        except (ValueError, TypeError):
            log.warning("lease_unreadable", uri=self._store.uri)
            return None, version

    def _write(self, expected: str | None) -> bool:
        """Write a renewed record if the lease is still at ``expected`` (None: absent)."""
        with self._writing:
            return self._write_locked(expected)

    def _write_locked(self, expected: str | None) -> bool:
        renewed = LeaseRecord(**{**asdict(self.record), "heartbeat_at": self._clock()})
        text = json.dumps(asdict(renewed))
        if expected is None:
            version = self._store.create(text)
        else:
            version = self._store.replace(text, expected)
        if version is None:  # lost the race, unless a retried request of ours had won it
            current = self._store.read()
            if current is None or current[0] != text:
                return False
            version = current[1]
        # Only a write that succeeded counts as a heartbeat (readiness and alerts read it).
        self.record, self._version = renewed, version
        return True

    def _is_stale_on_sight(self, other: LeaseRecord) -> bool:
        if other.host != self.record.host:
            return False
        return other.pid == self.record.pid or not _pid_alive(other.pid)

    def _held_error(self, other: LeaseRecord | None) -> LeaseHeldError:
        who = f"{other.host} pid {other.pid}" if other else "another driver"
        age = f", renewed {self._clock() - other.heartbeat_at:.1f}s ago" if other else ""
        return LeaseHeldError(
            f"another driver is running on this storage root: {who}, lease {self._store.uri}"
            f"{age}. Only one driver may write a lakehouse; stop the other one first."
        )

    def acquire(self, poll_seconds: float = 1.0) -> None:
        """Take the lease, waiting up to the TTL for a silent owner; fail if it is alive."""
        seen = self._read()
        if seen is not None:
            other, version = seen
            if other is not None and not self._is_stale_on_sight(other):
                deadline = self._clock() + self._ttl
                while self._clock() < deadline:
                    time.sleep(poll_seconds)
                    latest = self._read()
                    if latest is None:
                        seen = None
                        break
                    if latest[1] != version:
                        raise self._held_error(latest[0])
            if seen is not None:
                log.warning(
                    "lease_taken_over",
                    uri=self._store.uri,
                    previous_owner=asdict(other) if other is not None else None,
                )
        if not self._write(seen[1] if seen is not None else None):
            current = self._read()
            raise self._held_error(current[0] if current is not None else None)
        log.info("lease_acquired", uri=self._store.uri, owner=self.record.owner)

    def start_renewing(self) -> None:
        """Renew the lease every renew interval (a `PeriodicWorker`); set `lost` and stop
        renewing if another driver took it. A renewal the storage refuses is logged once
        (``lease_renew_failed``) until one succeeds (``lease_renewed_again``)."""
        self._worker = PeriodicWorker(
            "lease-renew",
            self._renew,
            self._renew_once,
            failed_event="lease_renew_failed",
            recovered_event="lease_renewed_again",
            first_now=False,
            traceback=True,
            stop_timeout_seconds=self._renew + 5,
            uri=self._store.uri,
        )
        self._worker.start()

    def _renew_once(self) -> list[str]:
        if not self._write(self._version):
            current = self._read()
            log.error(
                "lease_lost",
                uri=self._store.uri,
                new_owner=asdict(current[0]) if current and current[0] else None,
            )
            self.lost.set()
            raise Finished
        return []

    def check(self) -> None:
        """Raise `LeaseLostError` if another driver has taken the lease."""
        if self.lost.is_set():
            raise LeaseLostError(f"lease {self._store.uri} was taken over by another driver")

    def fence(self, retry_seconds: float = 5.0) -> None:
        """Before a table write: raise `LeaseLostError` unless the lease is still ours.

        One read of the lease object. If the storage does not answer, the write may go
        ahead while our last renewal is younger than the TTL (no other driver can
        have taken the lease over yet: it waits that long for silence); after that,
        it waits for the storage to answer, as the write itself would, and checks.
        """
        self.check()
        unverifiable_logged = False
        while True:
            try:
                with self._writing:
                    current = self._store.read()
                    held = current is not None and current[1] == self._version
                break
            except STORE_ERRORS as e:
                if self._clock() - self.record.heartbeat_at < self._ttl:
                    return
                if not unverifiable_logged:
                    log.warning("lease_unverifiable", uri=self._store.uri, error=str(e))
                    unverifiable_logged = True
                time.sleep(retry_seconds)
        if not held:
            self.lost.set()
            raise LeaseLostError(
                f"lease {self._store.uri} is no longer held by this driver: a table write "
                "was refused so that a second driver's tables stay consistent"
            )

    def release(self) -> None:
        """Stop renewing and remove the lease if it is still ours."""
        if self._worker is not None:
            self._worker.stop()
        if self._version is not None and not self.lost.is_set():
            try:
                self._store.delete(self._version)
            except STORE_ERRORS as e:  # left behind: the next start takes it over
                log.warning("lease_release_failed", uri=self._store.uri, error=str(e))
                return
            log.info("lease_released", uri=self._store.uri)


def acquire_driver_lease(settings: Settings) -> DriverLease:
    """The storage root's driver lease, acquired and renewing: what the driver and every
    verb that writes the tables hold (`DriverLease.release` it when done)."""
    store = lease_store(settings, lease_location(settings.checkpoint_uri))
    lease = DriverLease(store, settings.lease_ttl_seconds, settings.lease_renew_seconds)
    started = time.monotonic()
    try:
        lease.acquire()
    except ClientError as e:
        refused = storage_refused(e, store.uri)
        if refused is None:
            raise
        raise refused from e
    except BotoCoreError as e:
        endpoint = settings.aws_endpoint_url or "the AWS default S3 endpoint"
        raise StorageUnreachableError(
            f"the storage at {endpoint} (AWS_ENDPOINT_URL) did not answer: tried for "
            f"{time.monotonic() - started:.0f} s to read the driver lease {store.uri} "
            f"({type(e).__name__}: {str(e).splitlines()[0][:200]}). Check the endpoint, "
            "the network path to it and the store itself (docs/runbooks/StorageUnreachable.md)."
        ) from None
    lease.start_renewing()
    return lease
