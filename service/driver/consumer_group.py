"""Kafka consumer-group offsets standard tools can read: the checkpoint's, after each batch.

Spark never commits offsets to Kafka (SPARK-27549 was closed unmerged), so
``kafka-consumer-groups.sh``, Burrow, kafka-lag-exporter and Kafka UIs saw nothing of
this service. The driver commits each ingest query's checkpoint offsets to the consumer
group ``INGEST_KAFKA_CONSUMER_GROUP`` (default: one per storage root,
`Settings.consumer_group`) after every committed micro-batch (Spark reports a
batch's progress once it is in the checkpoint), and at start and at a stop the offsets
the checkpoint holds then. Best effort: a failed commit is counted, logged once until one
succeeds, and retried with the next; the group's offsets are never read back, the
checkpoint stays the one source of truth.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import structlog
from confluent_kafka import Consumer, TopicPartition

from service.background import PeriodicWorker
from service.config import Settings
from service.kafka.offsets import KAFKA_TIMEOUT_SECONDS
from service.lake.checkpoints import CheckpointFiles, read_checkpoint
from service.streaming.listener import JsonProgressListener

log = structlog.get_logger(__name__)

# How soon after a batch its offsets are committed, at most.
_COMMIT_SECONDS = 1.0
Offsets = Mapping[str, Mapping[int, int]]


class GroupSink(Protocol):
    """Where commit outcomes go (`service.driver.metrics.IngestMetrics`)."""

    def consumer_group_declared(self, query: str) -> None: ...
    def consumer_group_committed(self, query: str, ok: bool) -> None: ...


class ConsumerGroupCommitter:
    """Commit the latest offsets `offer`\\ ed per query (a `PeriodicWorker`, every second).

    ``checkpoints`` maps each ingest query to its checkpoint: `start` offers the offsets
    committed there, so a restart shows in the group at once.
    """

    def __init__(
        self,
        settings: Settings,
        checkpoints: Mapping[str, str],
        files: CheckpointFiles,
        sink: GroupSink,
    ) -> None:
        self.group = settings.consumer_group
        self._consumer = Consumer(
            {
                **settings.kafka.librdkafka_config(),
                "group.id": self.group,
                "enable.auto.commit": False,
            }
        )
        self._checkpoints = dict(checkpoints)
        self._files = files
        self._sink = sink
        self._pending: dict[str, Offsets] = {}
        self._lock = threading.Lock()
        self._worker = PeriodicWorker(
            "consumer-group-committer",
            _COMMIT_SECONDS,
            self._commit_pending,
            failed_event="consumer_group_commit_failed",
            recovered_event="consumer_group_commit_recovered",
            stop_timeout_seconds=KAFKA_TIMEOUT_SECONDS * 2,
            group=self.group,
        )

    def offer(self, query: str, offsets: Offsets) -> None:
        """Commit ``offsets`` (next offset per topic and partition) for ``query`` soon;
        never blocks (a listener calls it)."""
        with self._lock:
            self._pending[query] = offsets

    def _commit_pending(self) -> list[str]:
        with self._lock:
            pending, self._pending = self._pending, {}
        problems = []
        for query, offsets in pending.items():
            partitions = [
                TopicPartition(topic, partition, offset)
                for topic, by_partition in offsets.items()
                for partition, offset in by_partition.items()
            ]
            try:
                answered = self._consumer.commit(offsets=partitions, asynchronous=False) or []
                errors = [str(p.error) for p in answered if p.error is not None]
            except Exception as e:  # noqa: BLE001 - best effort: counted, logged, retried
                errors = [str(e)]
            self._sink.consumer_group_committed(query, ok=not errors)
            if errors:
                problems.append(f"{query}: {errors[0]}")
                with self._lock:  # retried with the next tick, unless newer ones came
                    self._pending.setdefault(query, offsets)
        return problems

    def start(self) -> None:
        """Offer each checkpoint's committed offsets, then commit every second until `stop`."""
        for query in self._checkpoints:
            self._sink.consumer_group_declared(query)
        self._offer_checkpoints()
        self._worker.start()

    def stop(self) -> None:
        """Commit each checkpoint's offsets as the stop leaves them, then stop and close the
        client. Spark's listener bus is asynchronous: the progress of a batch that ended
        during the stop may come after it, or never (the group would trail the checkpoint
        until the next start). Unreadable checkpoints leave what is pending."""
        self._worker.stop()
        try:
            self._offer_checkpoints()
        except Exception as e:  # noqa: BLE001 - best effort, as every commit here
            log.warning("consumer_group_final_offsets_unread", group=self.group, error=str(e))
        self._worker.run_once()
        self._consumer.close()

    def _offer_checkpoints(self) -> None:
        for query, uri in self._checkpoints.items():
            offsets = read_checkpoint(self._files, uri).kafka_offsets
            if offsets:
                self.offer(query, offsets)


def batch_end_offsets(sources: Sequence[Any]) -> dict[str, dict[int, int]]:
    """The Kafka offsets a micro-batch ended at, from its progress' sources (pure)."""
    offsets: dict[str, dict[int, int]] = {}
    for source in sources:
        end = source.endOffset
        parsed = json.loads(end) if isinstance(end, str) else end
        if not isinstance(parsed, dict):
            continue
        for topic, by_partition in parsed.items():
            if isinstance(by_partition, dict):
                offsets[topic] = {int(p): int(o) for p, o in by_partition.items()}
    return offsets


class CommittedOffsetsListener(JsonProgressListener):
    """Offer the offsets each batch of the ``queries`` ended at to the committer."""

    def __init__(self, committer: ConsumerGroupCommitter, queries: Sequence[str]) -> None:
        self._committer = committer
        self._queries = set(queries)

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark's callback names
        """Nothing to commit yet."""

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802
        """A batch is in the checkpoint: offer where it ended."""
        progress = event.progress
        if progress.name in self._queries and (offsets := batch_end_offsets(progress.sources)):
            self._committer.offer(progress.name, offsets)

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        """Nothing new."""

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        """Nothing new."""
