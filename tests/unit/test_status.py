"""The status verb's reading of a checkpoint, its lag arithmetic and its report."""

from __future__ import annotations

import json

from service.status import (
    CheckpointLog,
    LeaseStatus,
    PartitionStatus,
    QueryStatus,
    Status,
    TableStatus,
    partition_lag,
    read_checkpoint_log,
)

CHECKPOINT = "s3a://lake/_checkpoints/ingest_sensors"


class Files:
    """An in-memory stand-in for `HadoopFiles` (read_text, list_names)."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files

    def read_text(self, uri: str) -> str | None:
        return self.files.get(uri)

    def list_names(self, uri: str) -> list[str]:
        prefix = uri.rstrip("/") + "/"
        return sorted({k[len(prefix) :].split("/")[0] for k in self.files if k.startswith(prefix)})


def offsets_file(batch_ms: int, offsets: dict[str, object]) -> str:
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": batch_ms, "conf": {}}
    return "\n".join(["v1", json.dumps(meta), json.dumps(offsets)])


def test_checkpoint_log_is_the_last_committed_batch_and_its_offsets() -> None:
    files = Files(
        {
            f"{CHECKPOINT}/metadata": '{"id":"3f1c"}',
            f"{CHECKPOINT}/offsets/0": offsets_file(1_700_000_000_000, {"sensors": {"0": 5}}),
            f"{CHECKPOINT}/offsets/1": offsets_file(
                1_700_000_060_000, {"sensors": {"0": 9, "1": 4}}
            ),
            f"{CHECKPOINT}/offsets/2": offsets_file(1_700_000_120_000, {"sensors": {"0": 12}}),
            f"{CHECKPOINT}/commits/0": "v1\n{}",
            f"{CHECKPOINT}/commits/1": "v1\n{}",
        }
    )

    log = read_checkpoint_log(files, CHECKPOINT, lambda uri: 1_700_000_070.0)

    assert (
        CheckpointLog(
            query_id="3f1c",
            last_committed_batch=1,
            last_batch_time="2023-11-14T22:14:20+00:00",
            committed_at="2023-11-14T22:14:30+00:00",
            planned_batch=2,
            offsets={"sensors": {0: 9, 1: 4}},
        )
        == log
    )


def test_new_checkpoint_has_no_committed_batch() -> None:
    assert CheckpointLog() == read_checkpoint_log(Files({}), CHECKPOINT)


def test_lag_is_latest_minus_committed_and_unread_partitions_lag_from_their_start() -> None:
    lag = partition_lag({0: 9, 1: 4}, {0: (0, 12), 1: (0, 4), 2: (3, 10)})

    assert [
        PartitionStatus(0, 9, 12, 3),
        PartitionStatus(1, 4, 4, 0),
        PartitionStatus(2, None, 10, 7),
    ] == lag


def test_lag_is_unknown_without_the_broker() -> None:
    assert [PartitionStatus(0, 9, None, None)] == partition_lag({0: 9}, None)


def test_report_lists_queries_and_tables_as_text_and_json() -> None:
    status = Status(
        storage_root="s3a://lake",
        checkpoint_root="s3a://lake/_checkpoints",
        generated_at="2024-05-01T12:00:00+00:00",
        lease=LeaseStatus(held=False),
        queries=[
            QueryStatus(
                query="ingest_sensors",
                topic="sensors",
                checkpoint=CHECKPOINT,
                query_id="3f1c",
                last_committed_batch=41,
                last_batch_time="2024-05-01T11:59:50+00:00",
                committed_at="2024-05-01T11:59:52+00:00",
                planned_batch=None,
                lag=3,
                partitions=[PartitionStatus(0, 9, 12, 3)],
                errors=[],
            )
        ],
        tables=[
            TableStatus("bronze/sensors", "s3a://lake/bronze/sensors", True, 42, "t", "WRITE", 9),
            TableStatus("silver/sensor_readings", "s3a://lake/silver/sensor_readings", False),
        ],
    )

    text = status.to_text()

    assert status.ok
    assert "no driver holds the lease" in text
    [query_row] = [line for line in text.splitlines() if line.startswith("ingest_sensors")]
    assert ["ingest_sensors", "sensors", "41", "2024-05-01T11:59:50+00:00", "9", "12", "3"] == (
        query_row.split()
    )
    [table_row] = [line for line in text.splitlines() if line.startswith("bronze/sensors")]
    assert ["bronze/sensors", "42", "9", "t", "WRITE"] == table_row.split()
    assert "(no table)" in text
    assert 3 == json.loads(status.to_json())["queries"][0]["lag"]


def test_non_kafka_source_offsets_are_skipped() -> None:
    delta_offset = {"sourceVersion": 1, "reservoirId": "abc", "reservoirVersion": 7, "index": -1}
    files = Files(
        {
            f"{CHECKPOINT}/offsets/0": offsets_file(1_700_000_000_000, delta_offset),
            f"{CHECKPOINT}/commits/0": "v1\n{}",
        }
    )

    log = read_checkpoint_log(files, CHECKPOINT)

    assert (0, {}) == (log.last_committed_batch, log.offsets)
