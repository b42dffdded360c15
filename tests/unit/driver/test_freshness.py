"""The caught-up time kept in each ingest checkpoint: seeded at start, written as it advances."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry

from service.driver.freshness import CAUGHT_UP_FILE, CaughtUpKeeper
from service.driver.metrics import IngestMetrics


class Files:
    """Small files in a dict."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files

    def read_text(self, uri: str) -> str | None:
        return self.files.get(uri)

    def write_text(self, uri: str, text: str) -> None:
        self.files[uri] = text


def freshness(registry: CollectorRegistry, query: str) -> float | None:
    return registry.get_sample_value(
        "lakehouse_ingest_freshness_timestamp_seconds", {"query": query, "basis": "caught_up"}
    )


def test_a_restart_seeds_the_last_caught_up_time_and_a_first_start_records_its_own() -> None:
    registry = CollectorRegistry()
    metrics = IngestMetrics(registry)
    files = Files({f"cp/users/{CAUGHT_UP_FILE}": "1700000000.5\n"})
    keeper = CaughtUpKeeper({"ingest_users": "cp/users", "ingest_sensors": "cp/sensors"},
                            files, metrics)  # fmt: skip

    before = time.time()
    keeper.seed()

    assert 1700000000.5 == freshness(registry, "ingest_users")  # keeps ageing: not reset
    first = freshness(registry, "ingest_sensors")
    assert first is not None and before <= first <= time.time()
    assert float(files.files[f"cp/sensors/{CAUGHT_UP_FILE}"]) == first


def test_a_newer_caught_up_time_is_written_and_an_unchanged_one_is_not() -> None:
    registry = CollectorRegistry()
    metrics = IngestMetrics(registry)
    files = Files({f"cp/users/{CAUGHT_UP_FILE}": "1700000000.0\n"})
    keeper = CaughtUpKeeper({"ingest_users": "cp/users"}, files, metrics)
    keeper.seed()
    metrics.query_idle("ingest_users", watermarked=False)  # caught up now

    keeper.keep()
    written = float(files.files[f"cp/users/{CAUGHT_UP_FILE}"])
    files.files[f"cp/users/{CAUGHT_UP_FILE}"] = "untouched"
    keeper.keep()

    assert written == metrics.caught_up("ingest_users") and written > 1700000000.0
    assert "untouched" == files.files[f"cp/users/{CAUGHT_UP_FILE}"]
    # A seed never goes back on a query that caught up since.
    metrics.freshness_seeded("ingest_users", 1.0)
    assert written == freshness(registry, "ingest_users")
