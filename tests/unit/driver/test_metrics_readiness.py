"""Readiness and liveness verdicts and the operations HTTP endpoint."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from service.driver.http import liveness_verdict, readiness_verdict, serve_http
from service.driver_status import DriverView, QueryNow, fetch_driver_view

VIEW = DriverView(
    pid=4242,
    ready=True,
    ready_reason="ok",
    alive=True,
    alive_reason="ok",
    lease_heartbeat_age_seconds=1.5,
    queries=[QueryNow("ingest_sensors", True, 41, 3.2, 40, 0.4, 1200)],
)
BOTH = {"ingest_users": True, "ingest_sensors": True}


def verdict(
    active: dict[str, bool] = BOTH,
    ages: dict[str, float | None] | None = None,
    storage_age: float | None = 1.0,
) -> tuple[bool, str]:
    return readiness_verdict(
        active=active,
        progress_age=ages if ages is not None else {"ingest_users": 5.0, "ingest_sensors": 9.0},
        max_progress_age=120.0,
        storage_age=storage_age,
        max_storage_age=30.0,
    )


def test_active_progressing_queries_with_writable_storage_are_ready() -> None:
    assert (True, "ok") == verdict()


def test_a_stopped_query_is_not_ready() -> None:
    ready, detail = verdict(active={**BOTH, "ingest_sensors": False})
    assert (False, "queries not active: ingest_sensors") == (ready, detail)


def test_a_query_silent_beyond_the_threshold_is_not_ready() -> None:
    ready, detail = verdict(ages={"ingest_users": 5.0, "ingest_sensors": 121.0})
    assert not ready
    assert "no progress for over 120s: ingest_sensors (121s)" == detail


def test_a_query_not_yet_reported_started_is_not_ready() -> None:
    assert (False, "queries starting: ingest_users") == verdict(
        ages={"ingest_users": None, "ingest_sensors": 1.0}
    )


def test_unreachable_storage_is_not_ready() -> None:
    ready, detail = verdict(storage_age=31.0)
    assert (False, "storage unreachable: no successful write for 31s") == (ready, detail)


def test_no_queries_is_not_ready() -> None:
    assert not verdict(active={})[0]


def test_a_query_with_records_waiting_and_no_batch_for_too_long_is_wedged() -> None:
    alive, reason = liveness_verdict(
        {"ingest_users": 50.0, "ingest_sensors": 901.0, "gold_sensor_stats": 30.0},
        {"ingest_users": 7, "ingest_sensors": 1200},
        max_wedged_age=900.0,
    )
    assert not alive
    assert "wedged: no batch finished for over 900s: ingest_sensors (901s, 1200 records" in reason


@pytest.mark.parametrize(
    ("ages", "waiting"),
    [
        ({"ingest_sensors": 901.0}, {"ingest_sensors": 0}),  # nothing to read: not wedged
        ({"ingest_sensors": None}, {"ingest_sensors": 10}),  # not started yet
        ({"ingest_sensors": 899.0}, {"ingest_sensors": 10}),  # a long batch, not yet wedged
    ],
)
def test_idle_starting_or_merely_slow_queries_are_alive(
    ages: dict[str, float | None], waiting: dict[str, int | None]
) -> None:
    assert (True, "ok") == liveness_verdict(ages, waiting, max_wedged_age=900.0)


def test_a_silent_query_whose_backlog_is_unknown_counts_as_wedged() -> None:
    alive, reason = liveness_verdict({"gold_sensor_stats": 1000.0}, {}, max_wedged_age=900.0)
    assert not alive
    assert "gold_sensor_stats (1000s, unknown records waiting)" in reason


@pytest.fixture
def endpoint() -> Iterator[tuple[str, dict[str, object]]]:
    registry = CollectorRegistry()
    Counter("lakehouse_ingest_demo_total", "A demo counter.", registry=registry).inc(3)
    state: dict[str, object] = {
        "ready": (False, "starting: 0 of 2 queries started"),
        "alive": (True, "ok"),
    }

    def probe(name: str) -> tuple[bool, str]:
        verdict = state[name]
        assert isinstance(verdict, tuple)
        return bool(verdict[0]), str(verdict[1])

    server = serve_http(
        0, registry, lambda: probe("ready"), lambda: probe("alive"), lambda: VIEW.to_json()
    )
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback
            return int(response.status), bytes(response.read()).decode()
    except urllib.error.HTTPError as e:
        return e.code, bytes(e.read()).decode()


def test_endpoint_serves_metrics_health_and_readiness(
    endpoint: tuple[str, dict[str, object]],
) -> None:
    base, state = endpoint

    status, body = get(f"{base}/metrics")
    assert 200 == status
    assert "lakehouse_ingest_demo_total 3.0" in body
    assert (200, "ok\n") == get(f"{base}/healthz")
    assert (503, "starting: 0 of 2 queries started\n") == get(f"{base}/readyz")
    state["ready"] = (True, "ok")
    assert (200, "ok\n") == get(f"{base}/readyz")
    assert (VIEW, None) == fetch_driver_view(int(base.rsplit(":", 1)[1]))
    state["alive"] = (False, "wedged: ingest_sensors")
    assert (503, "wedged: ingest_sensors\n") == get(f"{base}/healthz")
    assert 404 == get(f"{base}/nope")[0]


def test_status_names_a_driver_that_does_not_answer() -> None:
    view, reason = fetch_driver_view(1)  # nothing listens on port 1
    assert view is None
    assert reason is not None
    assert "no driver answering at http://127.0.0.1:1/status" in reason
