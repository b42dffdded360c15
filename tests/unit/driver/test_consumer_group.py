"""Where a micro-batch ended, as its progress event reports it (for the consumer group)."""

from __future__ import annotations

from types import SimpleNamespace

from service.driver.consumer_group import batch_end_offsets


def test_the_end_offsets_of_a_batch_from_its_kafka_sources() -> None:
    sources = [
        SimpleNamespace(endOffset='{"sensors":{"0":120,"2":7,"1":0}}'),
        SimpleNamespace(endOffset=None),  # a source with no offsets yet
    ]

    assert {"sensors": {0: 120, 1: 0, 2: 7}} == batch_end_offsets(sources)
