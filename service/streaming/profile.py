"""Where a micro-batch's time goes: wall time per phase and the Spark jobs it ran."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark import SparkContext

_JOB_GROUP = "spark.jobGroup.id"


class BatchProfile:
    """Phase timings of one batch, and the Spark jobs started while it ran.

    Jobs are those of the calling thread's job group (a streaming query's run id
    inside ``foreachBatch``), as Spark's status tracker lists them.
    """

    def __init__(self, context: SparkContext) -> None:
        self._context = context
        self._group = context.getLocalProperty(_JOB_GROUP)
        self._jobs_before = self._job_ids()
        self._started = time.monotonic()
        self.phases_ms: dict[str, int] = {}

    def _job_ids(self) -> set[int]:
        return set(self._context.statusTracker().getJobIdsForGroup(self._group))

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the block's wall time to phase ``name``."""
        started = time.monotonic()
        try:
            yield
        finally:
            spent = round((time.monotonic() - started) * 1000)
            self.phases_ms[name] = self.phases_ms.get(name, 0) + spent

    def summary(self) -> dict[str, object]:
        """The batch's duration, its phases and its Spark job count, for the log line."""
        return {
            "duration_ms": round((time.monotonic() - self._started) * 1000),
            "phases_ms": dict(self.phases_ms),
            "spark_jobs": len(self._job_ids() - self._jobs_before),
        }
