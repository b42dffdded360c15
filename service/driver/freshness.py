"""When each ingest query last caught up with Kafka, kept in its checkpoint across restarts.

``lakehouse_ingest_freshness_timestamp_seconds{basis="caught_up"}`` is the last time a
query had read everything Kafka had. A driver that restarts into a backlog it never
clears would export none (nothing caught up since it started), and the
FreshnessSLOBreached alert would stay silent exactly then. So the time is written to
the query's checkpoint (`CAUGHT_UP_FILE`) as it advances, and each start seeds the
gauge from it; a checkpoint that never caught up records its first driver's start.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Protocol

from service.background import PeriodicWorker
from service.lake.object_files import CheckpointTexts

# Our file in an ingest query's checkpoint: unix seconds of its last caught-up moment.
CAUGHT_UP_FILE = "lakehouse-ingest-caught-up"
# How often the time is written when it advances (a small write per query).
KEEP_SECONDS = 30.0


class CaughtUpSink(Protocol):
    """The caught-up times (`service.driver.metrics.IngestMetrics`)."""

    def caught_up(self, query: str) -> float | None: ...
    def freshness_seeded(self, query: str, at: float) -> None: ...


class CaughtUpKeeper:
    """Seed each query's caught-up time from its checkpoint at `start`, then keep writing it
    there as it advances (a `PeriodicWorker`); ``checkpoints`` maps query → checkpoint."""

    def __init__(
        self,
        checkpoints: Mapping[str, str],
        files: CheckpointTexts,
        metrics: CaughtUpSink,
        interval_seconds: float = KEEP_SECONDS,
    ) -> None:
        self._checkpoints = dict(checkpoints)
        self._files = files
        self._metrics = metrics
        self._written: dict[str, float] = {}
        self._worker = PeriodicWorker(
            "caught-up-keeper",
            interval_seconds,
            self.keep,
            failed_event="caught_up_write_failed",
            recovered_event="caught_up_write_recovered",
            first_now=False,
        )

    def seed(self) -> None:
        """Start each query's caught-up time from its checkpoint (its first start: now)."""
        for query, checkpoint in self._checkpoints.items():
            uri = f"{checkpoint}/{CAUGHT_UP_FILE}"
            text = self._files.read_text(uri)
            try:
                at = float(text) if text is not None else None
            except ValueError:
                at = None
            if at is None:
                at = time.time()
                self._files.write_text(uri, f"{at}\n")
            self._written[query] = at
            self._metrics.freshness_seeded(query, at)

    def keep(self) -> list[str]:
        """Write each query's caught-up time that advanced since it was last written."""
        for query, checkpoint in self._checkpoints.items():
            at = self._metrics.caught_up(query)
            if at is not None and at > self._written.get(query, 0.0):
                self._files.write_text(f"{checkpoint}/{CAUGHT_UP_FILE}", f"{at}\n")
                self._written[query] = at
        return []

    def start(self) -> None:
        """Seed, then keep the times every interval until `stop`."""
        self.seed()
        self._worker.start()

    def stop(self) -> None:
        """Stop, writing the latest times once more."""
        self._worker.stop()
        self._worker.run_once()
