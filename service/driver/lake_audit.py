"""The driver's periodic reconcile: the reconcile verb over what was ingested since the last check.

Every ``INGEST_RECONCILE_INTERVAL_SECONDS`` a daemon thread reads each ingest
query's checkpoint and checks the Kafka offsets from where the previous check ended
up to the last committed batch's end. A committed batch is in every table it
writes, so a batch still being written is never mistaken for a loss; the silver
snapshots are read before bronze's (`service.lake.invariants.reconcile`). Checking only
the new offsets keeps the cost proportional to what was ingested (the per-reading
gold tables are read by the same offsets); the gold window-key checks and "one row
per user id" still read those tables whole.

The first check starts at the offsets committed when the driver started
(`lakehouse-ingest reconcile` covers the whole lake). Each later check starts one
past the last offset the previous check found in bronze and expects that offset to
be there, so a gap at the boundary is found too. A check that cannot read the lake
or a checkpoint changes nothing and is retried, with the same start, at the next
interval. Violations are logged (``lake_invariant_broken``, level error) and
counted in ``lakehouse_ingest_reconcile_problems``, which the ``LakeInvariantBroken``
alert watches.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from service.background import PeriodicWorker
from service.lake.checkpoints import CheckpointFiles, QueryTarget, read_checkpoint
from service.lake.invariants import Increment, Increments, Reconciliation

log = structlog.get_logger(__name__)

# How long `stop` waits for a check in progress (it reads with delta-rs, not Spark).
_STOP_WAIT_SECONDS = 10.0
_MAX_PROBLEMS_LOGGED = 20


class ReconcileSink(Protocol):
    """Where check outcomes go (`service.driver.metrics.IngestMetrics`)."""

    def reconcile_checked(
        self, records: Mapping[str, int], problems: int, duration_seconds: float
    ) -> None: ...

    def reconcile_failed(self) -> None: ...

    def reconcile_declared(self) -> None: ...


@dataclass(frozen=True)
class Cursor:
    """Where the next check of one partition starts, and whether that offset must exist."""

    offset: int
    expect: bool


def plan(
    cursors: Mapping[str, Mapping[int, Cursor]], committed: Mapping[str, Mapping[int, int]]
) -> dict[str, dict[int, Increment]]:
    """The increments from ``cursors`` to the ``committed`` end offsets. A partition
    without a cursor is new since the driver started: checked from offset 0, without
    expecting offset 0 (retention may have removed it before it was ever read)."""
    increments: dict[str, dict[int, Increment]] = {}
    for topic, ends in committed.items():
        for partition, end in ends.items():
            cursor = cursors.get(topic, {}).get(partition, Cursor(0, expect=False))
            if end > cursor.offset:
                increments.setdefault(topic, {})[partition] = Increment(
                    cursor.offset, end, cursor.expect
                )
    return increments


def advance(
    cursors: Mapping[str, Mapping[int, Cursor]],
    increments: Increments,
    report: Reconciliation,
) -> dict[str, dict[int, Cursor]]:
    """The cursors after a check of ``increments``: one past the last offset bronze
    holds in each, or the increment's end when it held none (its gap was reported if
    it was expected)."""
    last = {(p.topic, p.partition): p.last_offset for p in report.bronze if p.rows}
    moved = {topic: dict(partitions) for topic, partitions in cursors.items()}
    for topic, partitions in increments.items():
        for partition, increment in partitions.items():
            seen = last.get((topic, partition))
            offset = seen + 1 if seen is not None else increment.end
            moved.setdefault(topic, {})[partition] = Cursor(offset, expect=True)
    return moved


class LakeAuditor:
    """Run ``check`` on the increments since the last check, every ``interval_seconds``
    (a `PeriodicWorker`, its first check one interval after `start`).

    A check that raises counts as ``result="error"`` and is logged once until one
    succeeds again (``lake_reconcile_failed``, then ``lake_reconcile_recovered``).
    """

    def __init__(
        self,
        queries: Sequence[QueryTarget],
        files: CheckpointFiles,
        check: Callable[[Increments], Reconciliation],
        sink: ReconcileSink,
        interval_seconds: float,
    ) -> None:
        self._queries = list(queries)
        self._files = files
        self._check = check
        self._sink = sink
        self._cursors: dict[str, dict[int, Cursor]] = {}
        self._worker = PeriodicWorker(
            "lake-auditor",
            interval_seconds,
            self._tick,
            failed_event="lake_reconcile_failed",
            recovered_event="lake_reconcile_recovered",
            first_now=False,
            on_error=lambda _error: sink.reconcile_failed(),
            stop_timeout_seconds=_STOP_WAIT_SECONDS,
        )

    def _committed(self) -> dict[str, dict[int, int]]:
        committed: dict[str, dict[int, int]] = {}
        for query in self._queries:
            offsets = read_checkpoint(self._files, query.checkpoint).kafka_offsets
            committed[query.topic] = dict(offsets.get(query.topic, {}))
        return committed

    def start_from_committed(self) -> None:
        """Begin after the offsets committed now (call before the queries start)."""
        self._cursors = {
            topic: {p: Cursor(offset, expect=True) for p, offset in ends.items()}
            for topic, ends in self._committed().items()
        }

    def _tick(self) -> list[str]:
        self.check_once()
        return []

    def check_once(self) -> Reconciliation | None:
        """Check what was committed since the last check; None when nothing new was."""
        increments = plan(self._cursors, self._committed())
        if not increments:
            return None
        started = time.monotonic()
        report = self._check(increments)
        self._cursors = advance(self._cursors, increments, report)
        records = report.records
        self._sink.reconcile_checked(records, len(report.problems), time.monotonic() - started)
        if report.problems:
            log.error(
                "lake_invariant_broken",
                problems=report.problems[:_MAX_PROBLEMS_LOGGED],
                problem_count=len(report.problems),
                runbook="docs/runbooks/LakeInvariantBroken.md",
            )
        else:
            log.info("lake_reconciled", records=records, tables=report.tables)
        return report

    def start(self) -> None:
        """Check every interval until `stop` (the first check after one interval); the
        start counts as the last check, so a first check that hangs ages it (ReconcileStale)."""
        self._sink.reconcile_declared()
        self._worker.start()

    def stop(self) -> None:
        """Stop checking; a check in progress is given a few seconds to end."""
        self._worker.stop()
