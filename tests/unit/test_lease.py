"""DriverLease: one live driver per storage root; crashed owners are taken over."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from service.errors import LeaseHeldError
from service.lease import DriverLease

URI = "file:/lake/_checkpoints/_driver_lease.json"


class MemoryFiles:
    """In-memory stand-in for HadoopFiles (the lease's only dependency)."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}

    def read_text(self, uri: str) -> str | None:
        return self.files.get(uri)

    def write_text(self, uri: str, text: str) -> None:
        self.files[uri] = text

    def delete(self, uri: str) -> None:
        self.files.pop(uri, None)


def owner_record(host: str, pid: int, heartbeat_at: float) -> str:
    return json.dumps(
        {
            "owner": "other",
            "host": host,
            "pid": pid,
            "started_at": 0.0,
            "heartbeat_at": heartbeat_at,
        }
    )


def dead_pid() -> int:
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(child.stdout)


def test_a_free_root_is_acquired_and_released() -> None:
    files = MemoryFiles()
    lease = DriverLease(files, URI, ttl_seconds=10, renew_seconds=1)
    lease.acquire()
    assert lease.record.owner == json.loads(files.files[URI])["owner"]
    lease.release()
    assert URI not in files.files


def test_a_dead_owner_on_this_host_is_taken_over_at_once() -> None:
    files = MemoryFiles()
    files.write_text(URI, owner_record(socket.gethostname(), dead_pid(), 1e12))
    lease = DriverLease(files, URI, ttl_seconds=3600, renew_seconds=1)
    lease.acquire(poll_seconds=0.01)
    assert os.getpid() == json.loads(files.files[URI])["pid"]


def test_a_silent_owner_elsewhere_is_taken_over_after_the_ttl() -> None:
    files = MemoryFiles()
    files.write_text(URI, owner_record("another-host", 1, 100.0))
    lease = DriverLease(files, URI, ttl_seconds=0.2, renew_seconds=0.1)
    lease.acquire(poll_seconds=0.05)
    assert socket.gethostname() == json.loads(files.files[URI])["host"]


def test_a_live_owner_that_keeps_renewing_makes_the_start_fail() -> None:
    files = MemoryFiles()
    files.write_text(URI, owner_record("another-host", 4242, 100.0))
    stop = threading.Event()

    def renew() -> None:
        beat = 100.0
        while not stop.wait(0.02):
            beat += 1
            files.write_text(URI, owner_record("another-host", 4242, beat))

    renewer = threading.Thread(target=renew)
    renewer.start()
    try:
        lease = DriverLease(files, URI, ttl_seconds=5, renew_seconds=1)
        with pytest.raises(LeaseHeldError, match="another-host pid 4242"):
            lease.acquire(poll_seconds=0.05)
    finally:
        stop.set()
        renewer.join()


def test_a_lease_taken_over_while_running_is_reported_lost() -> None:
    files = MemoryFiles()
    lease = DriverLease(files, URI, ttl_seconds=0.2, renew_seconds=0.05)
    lease.acquire()
    lease.start_renewing()
    files.write_text(URI, owner_record("another-host", 1, 1e12))
    assert lease.lost.wait(timeout=5)
    lease.release()
    assert "another-host" == json.loads(files.files[URI])["host"]


class FailingWrites(MemoryFiles):
    """Storage that answers every write with a fast error (revoked credentials, 403)."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = False

    def write_text(self, uri: str, text: str) -> None:
        if self.failing:
            raise PermissionError("403 Forbidden")
        super().write_text(uri, text)


def test_a_failed_renewal_does_not_count_as_a_heartbeat() -> None:
    files = FailingWrites()
    lease = DriverLease(files, URI, ttl_seconds=1, renew_seconds=0.05)
    lease.acquire()
    acquired_at = lease.record.heartbeat_at
    files.failing = True
    lease.start_renewing()
    threading.Event().wait(0.5)  # about ten failed renewals
    lease.release()
    assert acquired_at == lease.record.heartbeat_at
