"""The consumer group's copy of the checkpoints: where a micro-batch ended, as its progress
event reports it, and the offsets a stop commits (a real broker)."""

from __future__ import annotations

import json
import uuid
from types import SimpleNamespace

from devstack import KafkaBroker

from service.config import Settings
from service.driver.consumer_group import ConsumerGroupCommitter, batch_end_offsets
from tests.support.checkpoints import DictFiles
from tests.support.kafka import group_offsets


def test_the_end_offsets_of_a_batch_from_its_kafka_sources() -> None:
    sources = [
        SimpleNamespace(endOffset='{"sensors":{"0":120,"2":7,"1":0}}'),
        SimpleNamespace(endOffset=None),  # a source with no offsets yet
    ]

    assert {"sensors": {0: 120, 1: 0, 2: 7}} == batch_end_offsets(sources)


class Outcomes:
    """The committer's sink: each query's commit outcomes."""

    def __init__(self) -> None:
        self.committed: list[tuple[str, bool]] = []

    def consumer_group_declared(self, query: str) -> None:
        self.committed.append((query, True))

    def consumer_group_committed(self, query: str, ok: bool) -> None:
        self.committed.append((query, ok))


def checkpoint(topic: str, committed: dict[int, dict[int, int]]) -> dict[str, str]:
    """A checkpoint's files (`tests.support.checkpoints.DictFiles`): each batch committed,
    with the next offset of each partition of ``topic``."""
    meta = '{"batchWatermarkMs":0,"batchTimestampMs":1700000000000,"conf":{}}'
    files = {"cp/metadata": '{"id":"q-1"}'}
    for batch, ends in committed.items():
        files[f"cp/offsets/{batch}"] = f"v1\n{meta}\n{json.dumps({topic: ends})}"
        files[f"cp/commits/{batch}"] = 'v1\n{"nextBatchWatermarkMs":0}'
    return files


def test_a_stop_commits_the_checkpoints_offsets_whose_progress_never_came(
    kafka_broker: KafkaBroker,
) -> None:
    # Spark's listener bus is asynchronous: a batch that ends during the stop may never be
    # offered. The stop reads the checkpoint, as the start does.
    topic = f"sensors-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topics([topic], partitions=2)
    settings = Settings(
        kafka_bootstrap_servers=kafka_broker.bootstrap_servers,
        kafka_consumer_group=f"group-{topic}",
    )
    files = DictFiles(checkpoint(topic, {0: {0: 5, 1: 7}}))
    sink = Outcomes()
    committer = ConsumerGroupCommitter(settings, {"ingest_sensors": "cp"}, files, sink)
    committer.start()
    files.files.update(checkpoint(topic, {0: {0: 5, 1: 7}, 1: {0: 9, 1: 8}}))
    committer.stop()

    group = group_offsets(kafka_broker.bootstrap_servers, settings.consumer_group, topic, [0, 1])
    assert {0: 9, 1: 8} == group
    assert ("ingest_sensors", True) == sink.committed[-1]
