"""The start-up check for Kafka offsets a checkpoint still needs that the brokers lost."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from service.errors import KafkaOffsetsLostError
from service.kafka.lost_offsets import (
    LostOffsets,
    check_lost_offsets,
    find_lost,
    skipped_rows,
)
from service.lake.checkpoints import QueryTarget
from tests.support.checkpoints import DictFiles

SENSORS = QueryTarget("ingest_sensors", "sensors", "cp/sensors")
USERS = QueryTarget("ingest_users", "users", "cp/users")


def committed(uri: str, topic: str, offsets: Mapping[int, int]) -> dict[str, str]:
    """A checkpoint whose batch 0 committed with ``offsets`` next."""
    meta = '{"batchWatermarkMs":0,"batchTimestampMs":1700000000000,"conf":{}}'
    by_partition = ",".join(f'"{p}":{o}' for p, o in offsets.items())
    return {
        f"{uri}/metadata": '{"id":"q-1"}',
        f"{uri}/offsets/0": f'v1\n{meta}\n{{"{topic}":{{{by_partition}}}}}',
        f"{uri}/commits/0": 'v1\n{"nextBatchWatermarkMs":0}',
    }


FILES = DictFiles(
    committed("cp/sensors", "sensors", {0: 100, 1: 50}) | committed("cp/users", "users", {0: 7})
)


def brokers(**topics: dict[int, tuple[int, int]]) -> Any:
    return lambda names: {name: topics.get(name, {}) for name in names}


def test_a_partition_is_lost_below_the_earliest_offset_or_beyond_the_end() -> None:
    lost = find_lost(SENSORS, {0: 100, 1: 50, 2: 9, 3: 0}, {0: (120, 300), 1: (0, 50), 2: (0, 4)})

    assert [
        LostOffsets("ingest_sensors", "sensors", 0, 100, 120, 300),
        LostOffsets("ingest_sensors", "sensors", 2, 9, 0, 4),
    ] == lost
    assert (False, 20) == (lost[0].rewound, lost[0].count)
    assert lost[1].rewound
    # A partition the broker no longer has at all is rewound too (it ends at 0).
    assert find_lost(SENSORS, {5: 3}, {0: (0, 1)})[0].rewound


def test_expired_offsets_refuse_the_start_naming_the_partition_range_setting_and_runbook() -> None:
    with pytest.raises(KafkaOffsetsLostError) as refused:
        check_lost_offsets([USERS, SENSORS], FILES,
                           brokers(sensors={0: (120, 300), 1: (0, 80)}, users={0: (0, 7)}),
                           skip=False)  # fmt: skip
    message = str(refused.value)
    assert "topic sensors partition 0: offsets 100-119 (20) are no longer in Kafka" in message
    assert "partition 1" not in message and "topic users" not in message
    assert "INGEST_KAFKA_SKIP_LOST_OFFSETS=true" in message
    assert "bronze/skipped_offsets" in message
    assert "docs/runbooks/KafkaOffsetsLost.md" in message


def test_with_the_skip_setting_expired_ranges_are_returned_to_record() -> None:
    lost = check_lost_offsets([USERS, SENSORS], FILES,
                              brokers(sensors={0: (120, 300), 1: (60, 80)}, users={0: (0, 9)}),
                              skip=True)  # fmt: skip

    assert [(0, 100, 120), (1, 50, 60)] == [(r.partition, r.next_offset, r.earliest) for r in lost]


def test_a_recreated_topic_is_refused_even_with_the_skip_setting() -> None:
    with pytest.raises(KafkaOffsetsLostError) as refused:
        check_lost_offsets([USERS, SENSORS], FILES,
                           brokers(sensors={0: (0, 12), 1: (0, 80)}, users={0: (0, 7)}),
                           skip=True)  # fmt: skip
    message = str(refused.value)
    assert "reads on from offset 100 but the partition ends at 12" in message
    assert "INGEST_KAFKA_SKIP_LOST_OFFSETS" not in message  # it cannot help here
    assert "docs/runbooks/KafkaOffsetsLost.md" in message


def test_a_checkpoint_inside_an_open_transaction_is_refused_and_one_before_it_is_not() -> None:
    """sensors/0's checkpoint reads on from 100; the log ends at 300 but a transaction open
    since offset 90 holds the last stable offset there: the checkpoint read into it
    uncommitted. sensors/1 is at the stable offset: nothing is wrong there."""
    ends = brokers(sensors={0: (0, 300), 1: (0, 80)}, users={0: (0, 7)})
    stable = brokers(sensors={0: (0, 90), 1: (0, 50)}, users={0: (0, 7)})

    with pytest.raises(KafkaOffsetsLostError) as refused:
        check_lost_offsets([USERS, SENSORS], FILES, ends, skip=True, stable_offsets=stable)

    message = str(refused.value)
    assert (
        "partition 0: the checkpoint of ingest_sensors reads on from offset 100, past the"
        in message
    )
    assert "last stable offset 90: a transaction is still open there" in message
    assert "partition 1" not in message
    assert [] == check_lost_offsets(
        [USERS, SENSORS], FILES, ends, skip=False, stable_offsets=brokers(
            sensors={0: (0, 100), 1: (0, 50)}, users={0: (0, 7)}
        )
    )  # fmt: skip


def test_nothing_to_check_without_commits_or_without_an_answer_from_the_brokers() -> None:
    asked: list[list[str]] = []

    def record(names: list[str]) -> dict[str, Any]:
        asked.append(names)
        return {}

    assert [] == check_lost_offsets([QueryTarget("q", "t", "cp/none")], FILES, record, False)
    assert [] == asked
    unreachable = check_lost_offsets(
        [SENSORS], FILES, lambda names: {"_error": "Kafka unreachable"}, skip=False
    )
    assert [] == unreachable  # Spark's source still fails on lost offsets itself


def test_a_range_already_recorded_is_not_recorded_again() -> None:
    lost = [
        LostOffsets("ingest_sensors", "sensors", 0, 100, 120, 300),
        LostOffsets("ingest_sensors", "sensors", 1, 50, 60, 80),
    ]

    rows = skipped_rows(lost, {("sensors", 0, 100, 119)})

    assert [("sensors", 1, 50, 59, 10, "ingest_sensors")] == [
        (r["kafka_topic"], r["kafka_partition"], r["first_offset"], r["last_offset"],
         r["offsets"], r["query"])
        for r in rows
    ]  # fmt: skip
    assert rows[0]["reason"].startswith("topic sensors partition 1: offsets 50-59 (10)")
