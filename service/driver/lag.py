"""The driver's lag poller: every ingest query's Kafka lag, exported on a timer.

Spark reports a Kafka source's lag only when a micro-batch ends, so a slow batch
hid a growing backlog (the gauge read 0 while 8,180 records waited). The poller
measures it from the brokers and each checkpoint (`service.kafka.offsets`) every
``INGEST_LAG_POLL_SECONDS`` instead, and with it the retention headroom: how far the
next offset to read is from the log start, which retention moves up.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import structlog

from service.background import PeriodicWorker
from service.kafka.offsets import KAFKA_TIMEOUT_SECONDS, partition_lag, retention_headroom
from service.lake.checkpoints import CheckpointFiles, QueryTarget, read_checkpoint

log = structlog.get_logger(__name__)


class LagSink(Protocol):
    """Where polled lag goes (`service.driver.metrics.IngestMetrics` in the driver)."""

    def kafka_lag_declared(self, query: str) -> None: ...
    def kafka_lag_polled(
        self, query: str, topic: str, lags: Sequence[int], headroom: int | None
    ) -> None: ...


class LagPoller:
    """Export every ingest query's lag every ``interval_seconds`` (a `PeriodicWorker`).

    A poll that cannot reach the brokers updates nothing (the gauges' polled
    timestamp shows how old they are). A checkpoint that cannot be read (a storage
    outage) is measured from the offsets last read from it: no batch can commit
    while its checkpoint is unreachable, so the backlog keeps showing. Either
    problem is logged once until it clears (``kafka_lag_poll_failed``, then
    ``kafka_lag_poll_recovered``).
    """

    def __init__(
        self,
        queries: Sequence[QueryTarget],
        offsets: Callable[[Sequence[str]], Mapping[str, Any]],
        files: CheckpointFiles,
        sink: LagSink,
        from_earliest: bool,
        interval_seconds: float,
    ) -> None:
        self._queries = list(queries)
        self._offsets = offsets
        self._files = files
        self._sink = sink
        self._from_earliest = from_earliest
        self._committed: dict[str, dict[int, int]] = {}
        self._worker = PeriodicWorker(
            "kafka-lag-poller",
            interval_seconds,
            self._measure,
            failed_event="kafka_lag_poll_failed",
            recovered_event="kafka_lag_poll_recovered",
            traceback=True,
            stop_timeout_seconds=KAFKA_TIMEOUT_SECONDS * 2,
        )

    def _measure(self) -> list[str]:
        """Export each query's lag; return the problems met."""
        latest = self._offsets([q.topic for q in self._queries])
        problems = [latest["_error"]] if "_error" in latest else []
        for query in self._queries if not problems else []:
            try:
                state = read_checkpoint(self._files, query.checkpoint)
                self._committed[query.name] = state.kafka_offsets.get(query.topic, {})
            except (OSError, ValueError) as e:
                problems.append(f"{query.name}: checkpoint unreadable: {e}")
                if query.name not in self._committed:
                    continue
            committed, ends = self._committed[query.name], latest.get(query.topic)
            partitions = partition_lag(committed, ends, self._from_earliest)
            lags = [p.lag for p in partitions if p.lag is not None]
            if partitions and len(lags) == len(partitions):
                headroom = retention_headroom(committed, ends, self._from_earliest)
                self._sink.kafka_lag_polled(query.name, query.topic, lags, headroom)
            else:
                problems.append(f"{query.name}: no offsets from the brokers for {query.topic}")
        return problems

    def poll(self) -> bool:
        """Poll once now; return whether every query's lag was exported."""
        return self._worker.run_once()

    def start(self) -> None:
        """Declare every query's lag as polled now (a restart whose polls never succeed
        ages it: KafkaLagStale), then poll now and every interval until `stop`."""
        for query in self._queries:
            self._sink.kafka_lag_declared(query.name)
        self._worker.start()

    def stop(self) -> None:
        """Stop polling (waits at most two Kafka timeouts for a poll in progress)."""
        self._worker.stop()
