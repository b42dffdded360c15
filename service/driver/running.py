"""The driver's running queries: waiting on them, stopping them gracefully, judging their health.

The composition root (`service.driver.app`) starts the queries; `RunningQueries` holds
them, as a component whose stop interrupts any still running (after a failure or at the
end of a start that failed). `wait` watches them and the lease until they drain, fail
or a stop is requested; `stop_gracefully` lets batches in flight finish.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import structlog
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from service.config import Settings
from service.driver.http import liveness_verdict, readiness_verdict
from service.driver.metrics import IngestMetrics
from service.driver_status import DriverView, QueryNow
from service.failures import query_failure
from service.gold.queries import GoldQuery
from service.ingest.query import IngestQuery
from service.lake.jvm import java_class
from service.lake.lease import DriverLease
from service.streaming.runner import QueryWriter

log = structlog.get_logger(__name__)

_POLL_SECONDS = 0.5
# How deep in a query thread's stack the wait for its next trigger is (Thread.sleep's
# frames, then Spark's Clock.waitTillTime).
_TRIGGER_WAIT_FRAMES = 6
# A query silent (no progress, no idle event) for longer than this is stuck in a batch.
_MIN_PROGRESS_AGE_SECONDS = 120.0


@dataclass
class RunningQuery:
    """A started query with the writer that tells whether a batch is in flight."""

    spec: IngestQuery | GoldQuery
    handle: StreamingQuery
    writer: QueryWriter


@dataclass
class RunningQueries:
    """The queries started so far and the ones expected (a component: `stop` interrupts)."""

    expected: list[str]
    queries: list[RunningQuery] = field(default_factory=list)

    def add(
        self, spec: IngestQuery | GoldQuery, handle: StreamingQuery, writer: QueryWriter
    ) -> None:
        """Hold a started query."""
        self.queries.append(RunningQuery(spec, handle, writer))

    def start(self) -> None:
        """Nothing to start: queries are added as they start."""

    def stop(self) -> None:
        """Stop every query still running now, interrupting a batch in flight (it replays
        on restart): after a failure, or at the end of a start that failed."""
        _interrupt_all(self.queries)


def wait(
    running: RunningQueries,
    stop_requested: threading.Event,
    lease: DriverLease,
    available_now: bool,
    settings: Settings,
) -> None:
    """Until the queries drain (``available_now``) or a stop is requested (then stop them
    gracefully); raise when a query fails or the lease is lost."""
    while True:
        lease.check()
        for query in running.queries:
            if not query.handle.isActive and (error := query.handle.exception()) is not None:
                raise query_failure(
                    query.spec.name,
                    with_causes(error),
                    settings.spark_local_dir,
                    (settings.storage_uri, settings.checkpoint_uri),
                )
        if available_now and not any(q.handle.isActive for q in running.queries):
            return
        if stop_requested.is_set():
            stop_gracefully(running.queries, settings.stop_timeout_seconds)
            return
        stop_requested.wait(_POLL_SECONDS)


def with_causes(error: BaseException, limit: int = 8) -> str:
    """Spark's report of a failed query with its JVM causes (the root cause last): its own
    message is often only the wrapper's ("Exception thrown in awaitResult")."""
    text = str(error)
    cause = getattr(error, "_cause", None)  # pyspark's converted JVM cause, if any
    for _ in range(limit):
        if cause is None:
            break
        origin = getattr(cause, "_origin", None)
        name = origin.getClass().getName() if origin is not None else type(cause).__name__
        text += f"\ncaused by {name}: {getattr(cause, '_desc', None) or str(cause)}"
        cause = getattr(cause, "_cause", None)
    return text


def stop_gracefully(running: list[RunningQuery], timeout: float) -> None:
    """Let every query end after the trigger it is running, within ``timeout`` seconds.

    Each query is marked terminated the way `StreamingQuery.stop` marks it, without
    the interrupt: Spark checks that mark before it starts a trigger, so the batch
    in flight (planning or writing) finishes and is committed, and no new one
    starts (a batch that was planning when marked interrupts its own thread at its
    write, which its writer clears: `QueryWriter.writing`). A query whose thread
    sleeps until its next trigger is stopped then (the interrupt lands in that
    sleep); the others end by themselves. Queries still running at the deadline are
    interrupted: their batch replays on restart.
    """
    active = [q for q in running if q.handle.isActive]
    in_flight = {q.spec.name: q.writer.in_flight()[0] for q in active}
    log.info("stopping", in_flight={k: v for k, v in in_flight.items() if v is not None})
    for query in active:
        query.writer.end_after_this_batch()
        _end_after_current_trigger(query.handle)
    deadline = time.monotonic() + timeout
    while active and time.monotonic() < deadline:
        for query in list(active):
            if _running(query.handle):
                if not _waiting_for_trigger(query.handle):
                    continue
                query.handle.stop()
            active.remove(query)
            _log_stopped(query)
        time.sleep(0.2)
    if active:
        log.warning(
            "stop_timeout",
            timeout_seconds=timeout,
            interrupted=[q.spec.name for q in active],
            hint="their batches replay on restart; raise INGEST_STOP_TIMEOUT_SECONDS",
        )
        _interrupt_all(active)


def _running(handle: StreamingQuery) -> bool:
    """Whether the query's thread still runs (``isActive`` is false from the mark on)."""
    return bool(handle._jsq.streamingQuery().queryExecutionThread().isAlive())


def _waiting_for_trigger(handle: StreamingQuery) -> bool:
    """Whether the query's thread sleeps until its next trigger (Spark's trigger executor
    in ``Clock.waitTillTime``). Such a thread has ended its batch and checks the
    terminated mark before it starts another, so interrupting it loses nothing.
    """
    frames = handle._jsq.streamingQuery().queryExecutionThread().getStackTrace()
    return any(
        frames[i].getMethodName() == "waitTillTime"
        for i in range(min(len(frames), _TRIGGER_WAIT_FRAMES))
    )


def _end_after_current_trigger(handle: StreamingQuery) -> None:
    """Mark the query terminated (Spark 4.2 internals) so that it starts no new trigger."""
    state = "org.apache.spark.sql.execution.streaming.runtime.TERMINATED$"
    terminated = getattr(java_class(SparkSession.active(), state), "MODULE$")
    handle._jsq.streamingQuery().state().set(terminated)


def _interrupt_all(running: list[RunningQuery]) -> None:
    """Stop every query now, interrupting a batch in flight (it replays on restart)."""
    for query in running:
        if _running(query.handle):
            query.handle.stop()
            _log_stopped(query)


def _log_stopped(query: RunningQuery) -> None:
    log.info("query_stopped", query=query.spec.name, last_batch_id=query.writer.last_batch_id)


@dataclass
class Health:
    """The driver's readiness, liveness and ``/status`` view, from what it runs now.

    ``lease`` is None until the driver holds it: the driver is then still starting.
    """

    running: RunningQueries
    metrics: IngestMetrics
    settings: Settings
    lease: DriverLease | None = None

    def readiness(self) -> tuple[bool, str]:
        """The /readyz verdict."""
        started = {q.spec.name for q in self.running.queries}
        if self.lease is None or not started.issuperset(self.running.expected):
            return False, (
                f"starting: {len(started)} of {len(self.running.expected)} queries started"
            )
        queries = self.running.queries
        return readiness_verdict(
            active={q.spec.name: bool(q.handle.isActive) for q in queries},
            progress_age={
                q.spec.name: self.metrics.seconds_since_progress(q.spec.name) for q in queries
            },
            max_progress_age=max(
                _MIN_PROGRESS_AGE_SECONDS,
                10
                * max(self.settings.trigger_interval_seconds, self.settings.gold_trigger_seconds),
            ),
            storage_age=time.time() - self.lease.record.heartbeat_at,
            max_storage_age=self.settings.lease_ttl_seconds,
        )

    def liveness(self) -> tuple[bool, str]:
        """The /healthz verdict (logs ``driver_wedged`` when it fails)."""
        queries = self.running.queries
        alive, reason = liveness_verdict(
            {q.spec.name: self.metrics.seconds_since_progress(q.spec.name) for q in queries},
            {q.spec.name: self.metrics.lag.records_waiting(q.spec.name) for q in queries},
            self.settings.wedged_seconds,
        )
        if not alive:
            log.error("driver_wedged", reason=reason)
        return alive, reason

    def status(self) -> str:
        """The /status document: what the driver is doing now, from its memory."""
        readiness, liveness = self.readiness(), self.liveness()
        queries = []
        for query in list(self.running.queries):
            name = query.spec.name
            batch_id, seconds = query.writer.in_flight()
            queries.append(
                QueryNow(
                    query=name,
                    active=bool(query.handle.isActive),
                    batch_in_flight=batch_id,
                    in_flight_seconds=round(seconds, 1) if seconds is not None else None,
                    last_batch_id=query.writer.last_batch_id,
                    seconds_since_progress=self.metrics.seconds_since_progress(name),
                    records_waiting=self.metrics.lag.records_waiting(name),
                )
            )
        heartbeat = self.lease.record.heartbeat_at if self.lease is not None else None
        return DriverView(
            pid=os.getpid(),
            ready=readiness[0],
            ready_reason=readiness[1],
            alive=liveness[0],
            alive_reason=liveness[1],
            lease_heartbeat_age_seconds=(
                round(time.time() - heartbeat, 1) if heartbeat is not None else None
            ),
            queries=queries,
        ).to_json()
