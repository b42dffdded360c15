"""Fresh Kafka lag: per-partition arithmetic and the driver's poller over a real checkpoint."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from service.config import Settings
from service.driver.lag import LagPoller
from service.driver.metrics import IngestMetrics
from service.kafka.offsets import PartitionStatus, partition_lag, retention_headroom
from service.lake.checkpoints import QueryTarget
from service.lake.object_files import ObjectFiles


class Lags:
    """What the poller exported, per query."""

    def __init__(self) -> None:
        self.polled: dict[str, tuple[str, list[int]]] = {}
        self.headroom: dict[str, int | None] = {}

    def kafka_lag_declared(self, query: str) -> None:
        pass

    def kafka_lag_polled(
        self, query: str, topic: str, lags: Sequence[int], headroom: int | None
    ) -> None:
        self.polled[query] = (topic, list(lags))
        self.headroom[query] = headroom


def write_checkpoint(root: Path, committed: int, offsets: dict[str, dict[str, int]]) -> str:
    """A checkpoint laid out as Spark writes it: metadata, offsets/N, commits/N."""
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    (root / "metadata").write_text(json.dumps({"id": "q-1"}))
    for batch in range(committed + 2):  # the last one is planned, not committed
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1_700_000_000_000 + batch}
        moved = {t: {p: o + batch for p, o in parts.items()} for t, parts in offsets.items()}
        (root / "offsets" / str(batch)).write_text(f"v1\n{json.dumps(meta)}\n{json.dumps(moved)}\n")
        if batch <= committed:
            (root / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    return f"file:{root}"


def test_lag_is_latest_minus_committed_and_unread_partitions_lag_from_their_start() -> None:
    lag = partition_lag({0: 9, 1: 4}, {0: (0, 12), 1: (0, 4), 2: (3, 10)})

    assert [
        PartitionStatus(0, 9, 12, 3),
        PartitionStatus(1, 4, 4, 0),
        PartitionStatus(2, None, 10, 7),
    ] == lag


def test_unread_partitions_do_not_lag_when_the_query_starts_from_latest() -> None:
    assert [PartitionStatus(0, None, 10, 0)] == partition_lag({}, {0: (3, 10)}, False)


def test_retention_headroom_is_the_least_of_the_partitions_with_records_waiting() -> None:
    # 0: reads from 9, the log starts at 5, records wait; 1: read to its end, its log
    # mostly deleted (nothing unread at risk); 2: never read, from the log start.
    watermarks = {0: (5, 12), 1: (3, 4), 2: (7, 10)}
    assert 0 == retention_headroom({0: 9, 1: 4}, watermarks)
    assert 4 == retention_headroom({0: 9, 1: 4, 2: 10}, watermarks)
    # Nothing waiting anywhere: the least retained log, nothing at risk.
    assert 1 == retention_headroom({0: 12, 1: 4, 2: 10}, watermarks)
    # The next offset to read already deleted: negative.
    assert -2 == retention_headroom({0: 3}, {0: (5, 12)})
    assert retention_headroom({0: 3}, None) is None


def test_lag_is_unknown_without_the_broker() -> None:
    assert [PartitionStatus(0, 9, None, None)] == partition_lag({0: 9}, None)


def test_poller_measures_from_the_last_committed_batch_not_the_planned_one(tmp_path: Path) -> None:
    checkpoint = write_checkpoint(tmp_path / "cp", 3, {"sensors": {"0": 100, "1": 40}})
    lags = Lags()
    broker = {"sensors": {0: (90, 150), 1: (40, 43)}}
    poller = LagPoller(
        [QueryTarget("ingest_sensors", "sensors", checkpoint)],
        lambda topics: {t: broker[t] for t in topics},
        ObjectFiles(Settings()),
        lags,
        from_earliest=True,
        interval_seconds=15,
    )

    assert poller.poll()
    # committed batch 3 ends at 103 / 43; batch 4 is only planned
    assert {"ingest_sensors": ("sensors", [47, 0])} == lags.polled
    # partition 0 has records waiting 13 offsets past its log start; 1 is read to its end
    assert {"ingest_sensors": 13} == lags.headroom


@pytest.mark.parametrize(
    ("broker", "problem"),
    [
        ({"_error": "Kafka unreachable: timed out"}, "Kafka unreachable"),
        ({"sensors": {}}, "no offsets from the brokers for sensors"),
    ],
)
def test_a_failed_poll_exports_nothing_and_logs_once_until_it_recovers(
    tmp_path: Path, broker: Mapping[str, Any], problem: str
) -> None:
    checkpoint = write_checkpoint(tmp_path / "cp", 0, {"sensors": {"0": 5}})
    answers = [broker, broker, {"sensors": {0: (0, 9)}}]
    lags = Lags()
    poller = LagPoller(
        [QueryTarget("ingest_sensors", "sensors", checkpoint)],
        lambda _topics: answers.pop(0),
        ObjectFiles(Settings()),
        lags,
        from_earliest=True,
        interval_seconds=15,
    )

    with capture_logs() as logs:
        assert (False, False, True) == (poller.poll(), poller.poll(), poller.poll())

    assert ["kafka_lag_poll_failed", "kafka_lag_poll_recovered"] == [e["event"] for e in logs]
    assert problem in logs[0]["problems"][0]
    assert {"ingest_sensors": ("sensors", [4])} == lags.polled


def test_an_unreadable_checkpoint_is_measured_from_the_offsets_last_read(tmp_path: Path) -> None:
    checkpoint = write_checkpoint(tmp_path / "cp", 0, {"sensors": {"0": 5}})
    lags = Lags()
    poller = LagPoller(
        [QueryTarget("ingest_sensors", "sensors", checkpoint)],
        lambda _topics: {"sensors": {0: (0, 9)}},
        ObjectFiles(Settings()),
        lags,
        from_earliest=True,
        interval_seconds=15,
    )
    assert poller.poll()
    (tmp_path / "cp" / "offsets" / "0").write_text("v1\n{not json")  # storage returns garbage

    with capture_logs() as logs:
        assert not poller.poll()

    assert {"ingest_sensors": ("sensors", [4])} == lags.polled
    assert "ingest_sensors: checkpoint unreadable" in logs[0]["problems"][0]


def test_a_started_poller_whose_polls_fail_exports_its_start_as_the_last_poll(
    tmp_path: Path,
) -> None:
    checkpoint = write_checkpoint(tmp_path / "cp", 0, {"sensors": {"0": 5}})
    registry = CollectorRegistry()
    poller = LagPoller(
        [QueryTarget("ingest_sensors", "sensors", checkpoint)],
        lambda _topics: {"_error": "Kafka unreachable: timed out"},
        ObjectFiles(Settings()),
        IngestMetrics(registry, clock=lambda: 1_800_000_000.0).lag,
        from_earliest=True,
        interval_seconds=300,
    )

    with capture_logs():
        poller.start()
        poller.stop()

    # A restart whose polls never succeed still has a polled time to age (KafkaLagStale).
    assert 1_800_000_000.0 == registry.get_sample_value(
        "lakehouse_ingest_kafka_lag_polled_timestamp_seconds", {"query": "ingest_sensors"}
    )
    assert (
        registry.get_sample_value(
            "lakehouse_ingest_kafka_offsets_behind_latest",
            {"query": "ingest_sensors", "topic": "sensors"},
        )
        is None
    )
