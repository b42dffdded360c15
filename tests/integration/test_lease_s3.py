"""The driver lease on MinIO: S3 conditional writes make taking it atomic and fence writers."""

from __future__ import annotations

import json
import uuid

import pytest

from service.config import Settings
from service.errors import LeaseLostError
from service.lake.lease import DriverLease, lease_location
from service.lake.lease_store import S3LeaseStore
from tests.support.lake import Lake
from tests.support.lease_race import race

pytestmark = pytest.mark.integration


@pytest.fixture
def uri() -> str:
    return f"s3a://lakehouse/lease-{uuid.uuid4().hex[:8]}/_checkpoints/_driver_lease.json"


def test_conditional_writes_refuse_a_second_create_and_a_stale_replace(
    s3_env: dict[str, str], uri: str
) -> None:
    store = S3LeaseStore(Settings.model_validate(s3_env), uri)

    first = store.create("a")
    assert first is not None
    assert store.create("b") is None
    second = store.replace("c", first)
    assert second is not None
    assert store.replace("d", first) is None  # someone wrote since `first` was read
    assert ("c", second) == store.read()
    store.delete(first)  # not ours any more: kept
    assert store.read() is not None
    store.delete(second)
    assert store.read() is None


def test_of_drivers_starting_at_the_same_instant_on_s3_exactly_one_wins(
    s3_env: dict[str, str], uri: str
) -> None:
    outcomes = race(uri, drivers=4, start_in=3.0, hold=2.0, env=s3_env)

    winners = [owner for owner, code in outcomes if code == 0]
    assert 1 == len(winners), outcomes
    assert 3 == sum(1 for outcome in outcomes if outcome == ("refused", 3)), outcomes


def test_a_driver_deposed_on_s3_is_fenced_and_deletes_nothing(
    s3_env: dict[str, str], uri: str
) -> None:
    store = S3LeaseStore(Settings.model_validate(s3_env), uri)
    lease = DriverLease(store, ttl_seconds=30, renew_seconds=10)
    lease.acquire()
    lease.fence()
    found = store.read()
    assert found is not None
    usurper = json.dumps(
        {"owner": "other", "host": "h", "pid": 1, "started_at": 0.0, "heartbeat_at": 0.0}
    )
    assert store.replace(usurper, found[1]) is not None

    with pytest.raises(LeaseLostError):
        lease.fence()
    lease.release()
    assert usurper == (store.read() or ("", ""))[0]


def test_a_start_with_revoked_credentials_is_one_clear_line_and_exit_1(lake: Lake) -> None:
    rotated = {"AWS_SECRET_ACCESS_KEY": "a-rotated-away-secret-key"}
    driver = lake.service("refused", "run", **rotated).start()
    try:
        assert 1 == driver.wait(timeout=120), driver.log_text()[-4000:]
    finally:
        driver.cleanup()

    errors = [line for line in driver.events() if line.get("level") == "error"]
    assert ["failed"] == [line["event"] for line in errors], errors
    assert "StorageAccessDeniedError" == errors[0]["error_class"]
    lease = lease_location(f"{lake.storage_root}/_checkpoints")
    assert errors[0]["error"] == (
        "the storage s3a://lakehouse refused this driver (HTTP 403 SignatureDoesNotMatch: its "
        f"credentials were revoked or rotated, or lack permission) on {lease}. Nothing was "
        "written; restore access and restart (docs/runbooks/StorageUnreachable.md)"
    )
    assert "Traceback" not in driver.log_text()
