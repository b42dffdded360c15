"""Single-driver lease on the storage root: at most one live driver writes a lakehouse.

Delta on S3 (and MinIO) is safe with a single writer only. The lease is a small
JSON file under the checkpoint root that the owner rewrites every
``renew_seconds``. A starting driver takes it over when the file is absent,
when its owner is a dead process on this host, or when its heartbeat has not
advanced for ``ttl_seconds``; a heartbeat that keeps advancing means another
driver is alive, and the start fails with `LeaseHeldError`. A running driver
that finds its lease taken stops with `LeaseLostError`.
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
from typing import Protocol

import structlog

from service.errors import LeaseHeldError, LeaseLostError

log = structlog.get_logger(__name__)


class TextFiles(Protocol):
    """The file operations the lease needs (`service.hadoop_fs.HadoopFiles` in production)."""

    def read_text(self, uri: str) -> str | None: ...
    def write_text(self, uri: str, text: str) -> None: ...
    def delete(self, uri: str) -> None: ...


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
    """Acquire, renew and release the driver lease at ``uri``."""

    def __init__(
        self,
        files: TextFiles,
        uri: str,
        ttl_seconds: float,
        renew_seconds: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._files = files
        self._uri = uri
        self._ttl = ttl_seconds
        self._renew = renew_seconds
        self._clock = clock
        now = clock()
        self.record = LeaseRecord(uuid.uuid4().hex, socket.gethostname(), os.getpid(), now, now)
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> LeaseRecord | None:
        text = self._files.read_text(self._uri)
        if not text:
            return None
        try:
            return LeaseRecord(**json.loads(text))
        except (ValueError, TypeError):
            log.warning("lease_unreadable", uri=self._uri)
            return None

    def _write(self) -> None:
        renewed = LeaseRecord(**{**asdict(self.record), "heartbeat_at": self._clock()})
        self._files.write_text(self._uri, json.dumps(asdict(renewed)))
        # Only a write that succeeded counts as a heartbeat (readiness and alerts read it).
        self.record = renewed

    def _is_stale_on_sight(self, other: LeaseRecord) -> bool:
        if other.host != self.record.host:
            return False
        return other.pid == self.record.pid or not _pid_alive(other.pid)

    def acquire(self, poll_seconds: float = 1.0) -> None:
        """Take the lease, waiting up to the TTL for a silent owner; fail if it is alive."""
        other = self._read()
        if other is not None and not self._is_stale_on_sight(other):
            deadline = self._clock() + self._ttl
            while self._clock() < deadline:
                time.sleep(poll_seconds)
                latest = self._read()
                if latest is None:
                    break
                if latest.heartbeat_at != other.heartbeat_at or latest.owner != other.owner:
                    raise LeaseHeldError(
                        f"another driver is running on this storage root: {latest.host} "
                        f"pid {latest.pid}, lease {self._uri} renewed "
                        f"{self._clock() - latest.heartbeat_at:.1f}s ago. Only one driver may "
                        "write a lakehouse; stop the other one first."
                    )
            log.warning("lease_taken_over", uri=self._uri, previous_owner=asdict(other))
        self._write()
        log.info("lease_acquired", uri=self._uri, owner=self.record.owner)

    def start_renewing(self) -> None:
        """Renew the lease in a daemon thread; set `lost` if another driver took it."""
        self._thread = threading.Thread(target=self._renew_loop, name="lease-renew", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self._renew):
            try:
                current = self._read()
                if current is not None and current.owner != self.record.owner:
                    log.error("lease_lost", uri=self._uri, new_owner=asdict(current))
                    self.lost.set()
                    return
                self._write()
            except Exception:
                log.exception("lease_renew_failed", uri=self._uri)

    def check(self) -> None:
        """Raise `LeaseLostError` if another driver has taken the lease."""
        if self.lost.is_set():
            raise LeaseLostError(f"lease {self._uri} was taken over by another driver")

    def release(self) -> None:
        """Stop renewing and remove the lease if it is still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._renew + 5)
        current = self._read()
        if current is not None and current.owner == self.record.owner:
            self._files.delete(self._uri)
            log.info("lease_released", uri=self._uri)
