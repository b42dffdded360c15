"""DriverLease: one live driver per storage root; crashed owners are taken over.

The lease runs on `LocalLeaseStore` over a temporary directory (real files and
locks); the S3 store's conditional writes are tested against MinIO in
tests/integration/test_lease_s3.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from service.errors import LeaseHeldError, LeaseLostError
from service.lake.lease import DriverLease
from service.lake.lease_store import LocalLeaseStore
from tests.support.lease_race import race


@pytest.fixture
def store(tmp_path: Path) -> LocalLeaseStore:
    return LocalLeaseStore(f"file:{tmp_path}/_checkpoints/_driver_lease.json")


def put(store: LocalLeaseStore, text: str) -> None:
    """Another driver's write (unconditional, as a test's stand-in), atomic as the store's
    own: a reader never sees it half-written."""
    path = Path(store.uri.removeprefix("file:"))
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.put")
    staged.write_text(text)
    staged.replace(path)


def held(store: LocalLeaseStore) -> dict[str, object] | None:
    found = store.read()
    return json.loads(found[0]) if found else None


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


def test_a_free_root_is_acquired_and_released(store: LocalLeaseStore) -> None:
    lease = DriverLease(store, ttl_seconds=10, renew_seconds=1)
    lease.acquire()
    assert lease.record.owner == (held(store) or {})["owner"]
    lease.release()
    assert held(store) is None


def test_a_dead_owner_on_this_host_is_taken_over_at_once(store: LocalLeaseStore) -> None:
    put(store, owner_record(socket.gethostname(), dead_pid(), 1e12))
    lease = DriverLease(store, ttl_seconds=3600, renew_seconds=1)
    lease.acquire(poll_seconds=0.01)
    assert os.getpid() == (held(store) or {})["pid"]


def test_a_silent_owner_elsewhere_is_taken_over_after_the_ttl(store: LocalLeaseStore) -> None:
    put(store, owner_record("another-host", 1, 100.0))
    lease = DriverLease(store, ttl_seconds=0.2, renew_seconds=0.1)
    lease.acquire(poll_seconds=0.05)
    assert socket.gethostname() == (held(store) or {})["host"]


def test_a_live_owner_that_keeps_renewing_makes_the_start_fail(store: LocalLeaseStore) -> None:
    put(store, owner_record("another-host", 4242, 100.0))
    stop = threading.Event()

    def renew() -> None:
        beat = 100.0
        while not stop.wait(0.02):
            beat += 1
            put(store, owner_record("another-host", 4242, beat))

    renewer = threading.Thread(target=renew)
    renewer.start()
    try:
        lease = DriverLease(store, ttl_seconds=5, renew_seconds=1)
        with pytest.raises(LeaseHeldError, match="another-host pid 4242"):
            lease.acquire(poll_seconds=0.05)
    finally:
        stop.set()
        renewer.join()


def test_of_drivers_starting_at_the_same_instant_exactly_one_wins(
    store: LocalLeaseStore,
) -> None:
    for _ in range(3):
        outcomes = race(store.uri, drivers=4, start_in=1.5, hold=1.5, env={})
        winners = [owner for owner, code in outcomes if code == 0]
        assert 1 == len(winners), outcomes
        assert 3 == sum(1 for outcome in outcomes if outcome == ("refused", 3)), outcomes
        assert held(store) is None, "the winner released its lease"


def test_a_lease_taken_over_while_running_is_reported_lost(store: LocalLeaseStore) -> None:
    lease = DriverLease(store, ttl_seconds=0.2, renew_seconds=0.05)
    lease.acquire()
    lease.start_renewing()
    put(store, owner_record("another-host", 1, 1e12))
    assert lease.lost.wait(timeout=5)
    lease.release()
    assert "another-host" == (held(store) or {})["host"]


def test_a_deposed_driver_is_fenced_before_its_next_table_write(store: LocalLeaseStore) -> None:
    lease = DriverLease(store, ttl_seconds=30, renew_seconds=10)  # no renewal in the test
    lease.acquire()
    lease.fence()  # still ours: the write may go ahead
    put(store, owner_record("another-host", 1, 1e12))

    with pytest.raises(LeaseLostError, match="no longer held by this driver"):
        lease.fence()
    with pytest.raises(LeaseLostError):
        lease.check()  # the main loop stops the driver too
    lease.release()
    assert "another-host" == (held(store) or {})["host"], "a deposed driver deletes nothing"


class FailingWrites(LocalLeaseStore):
    """Storage that answers every write with a fast error (revoked credentials, 403)."""

    failing = False

    def replace(self, text: str, version: str) -> str | None:
        if self.failing:
            raise PermissionError("403 Forbidden")
        return super().replace(text, version)


def test_a_failed_renewal_does_not_count_as_a_heartbeat(tmp_path: Path) -> None:
    store = FailingWrites(f"file:{tmp_path}/_driver_lease.json")
    lease = DriverLease(store, ttl_seconds=1, renew_seconds=0.05)
    lease.acquire()
    acquired_at = lease.record.heartbeat_at
    store.failing = True
    with capture_logs() as logs:
        lease.start_renewing()
        threading.Event().wait(0.5)  # about ten failed renewals
        assert acquired_at == lease.record.heartbeat_at
        store.failing = False
        threading.Event().wait(0.2)
        lease.release()
    assert not lease.lost.is_set(), "an unreachable store is not a lost lease"
    events = [e["event"] for e in logs]
    assert 1 == events.count("lease_renew_failed"), "an outage is logged once, not per renewal"
    assert 1 == events.count("lease_renewed_again")


class Unreachable(LocalLeaseStore):
    """Storage that stops answering (an outage) while `down` is set."""

    down = False

    def read(self) -> tuple[str, str] | None:
        if self.down:
            raise ConnectionError("could not connect to the endpoint")
        return super().read()

    def delete(self, version: str) -> None:
        if self.down:
            raise ConnectionError("could not connect to the endpoint")
        super().delete(version)


def test_an_unreachable_store_lets_writes_through_only_while_the_lease_cannot_have_expired(
    tmp_path: Path,
) -> None:
    now = [1000.0]
    store = Unreachable(f"file:{tmp_path}/_driver_lease.json")
    lease = DriverLease(store, ttl_seconds=30, renew_seconds=5, clock=lambda: now[0])
    lease.acquire()
    store.down = True
    now[0] += 29
    lease.fence()  # renewed 29 s ago: nobody may have taken it over yet

    now[0] += 2  # now it might have been: wait for the storage, then check
    put(store, owner_record("another-host", 1, 1e12))
    verdict: list[BaseException] = []

    def write() -> None:
        try:
            lease.fence(retry_seconds=0.01)
        except LeaseLostError as e:
            verdict.append(e)

    writer = threading.Thread(target=write)
    writer.start()
    writer.join(0.3)
    assert writer.is_alive(), "the write waits while the lease cannot be checked"
    store.down = False
    writer.join(5)
    assert 1 == len(verdict)


def test_a_release_the_storage_refuses_leaves_the_lease_without_raising(tmp_path: Path) -> None:
    store = Unreachable(f"file:{tmp_path}/_driver_lease.json")
    lease = DriverLease(store, ttl_seconds=30, renew_seconds=5)
    lease.acquire()
    store.down = True
    lease.release()
    store.down = False
    assert lease.record.owner == (held(store) or {})["owner"]
