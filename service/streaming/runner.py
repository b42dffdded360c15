"""The query runner shared by ingest and gold: checkpoint location, table checks, start-up.

Every streaming query of the service writes its tables in ``foreachBatch``
through a `QueryWriter`, which tags each Delta commit with the query's
``txnAppId`` (derived from the checkpoint's query id) and the batch id, and
maintains the tables the query owns between its batches (`service.lake.maintenance`).
Before a query starts, `check_tables` refuses a checkpoint that disagrees with
its tables and names the declared tables that do not exist yet.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import structlog
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.readwriter import DataStreamWriter
from pyspark.util import inheritable_thread_target

from service.config import Settings
from service.errors import QueryNotBoundError, TableLayoutError
from service.lake import checkpoints
from service.lake.delta import table_transactions
from service.lake.hadoop_fs import HadoopFiles
from service.lake.jvm import java_class, set_scheduler_pool
from service.lake.maintenance import TableMaintenance
from service.lake.tables import Table

log = structlog.get_logger(__name__)

# How long a batch waits for its query to be bound (the query id is known once started).
_BIND_TIMEOUT_SECONDS = 120.0
# How long after its trigger an ingest batch reaches its write, at most (`IngestBatches`).
_INGEST_START_SECONDS = 1.0


def trigger_seconds(settings: Settings, pool: str, available_now: bool) -> float:
    """The processing-time trigger interval of the queries of ``pool`` (0: available-now):
    what they run with, and what the metrics report."""
    if available_now:
        return 0.0
    return settings.gold_trigger_seconds if pool == "gold" else settings.trigger_interval_seconds


def checkpoint_location(settings: Settings, query_name: str) -> str:
    """The checkpoint URI of the query named ``query_name``."""
    return f"{settings.checkpoint_uri}/{query_name}"


class QueryWriter:
    """The ``foreachBatch`` function's shared state: the txn app id and the batch in flight.

    The app id is derived from the query id Spark keeps in the checkpoint, known only
    once the query has started: `bind` sets it, and a batch waits for it.

    ``fence`` (`service.lake.lease.DriverLease.fence`) runs before each table write and
    raises if this driver no longer holds the lease.

    With ``maintenance`` (`service.lake.maintenance.maintenance_for`), the writer also
    maintains the tables its query owns, after a batch's writes succeeded (`writing`),
    then calls ``after_batch`` (`service.lake.log_checkpoints.LogCheckpoints`).
    """

    def __init__(
        self,
        query_name: str,
        fence: Callable[[], None],
        maintenance: TableMaintenance | None = None,
        after_batch: Callable[[], None] | None = None,
    ) -> None:
        self.query_name = query_name
        self.fence = fence
        self._app_id: str | None = None
        self._bound = threading.Event()
        self._in_flight: int | None = None
        self._in_flight_since = 0.0
        self.last_batch_id: int | None = None
        self.maintenance = maintenance
        self.after_batch = after_batch
        self._ending = False

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        """Write micro-batch ``batch_id`` (the ``foreachBatch`` function)."""
        raise NotImplementedError

    def bind(self, query_id: str) -> None:
        """Set the txn app id from the started query's (checkpoint-persisted) id."""
        self._app_id = checkpoints.app_id(self.query_name, query_id)
        self._bound.set()

    def app_id(self, batch_id: int) -> str:
        """The txn app id, once bound."""
        if not self._bound.wait(timeout=_BIND_TIMEOUT_SECONDS) or self._app_id is None:
            raise QueryNotBoundError(
                f"query {self.query_name}: batch {batch_id} started but the query was not "
                f"bound to its checkpoint within {_BIND_TIMEOUT_SECONDS:.0f} s"
            )
        return self._app_id

    @contextmanager
    def writing(self, batch_id: int) -> Iterator[None]:
        """Mark batch ``batch_id`` as being written for the duration of the block.

        After the block succeeded, the due maintenance of the query's tables runs here
        (and the first batch records when its schedule started, `MaintenanceRecord`),
        in the query's thread, before the next batch: never beside the tables' writer.
        It is still part of the batch in flight, so a graceful stop waits for it.

        Once a graceful stop has begun (`end_after_this_batch`), Spark 4.2 interrupts
        the query's own thread when a batch it was planning reaches its write (the query
        is marked terminated): that interrupt is cleared here, so the batch is written
        in full and committed instead of failing in its first Spark job.
        """
        if self._ending:
            # Runs on the query's thread (pinned).
            java_class(SparkSession.active(), "java.lang.Thread").interrupted()
        self._in_flight, self._in_flight_since = batch_id, time.monotonic()
        try:
            yield
            self.last_batch_id = batch_id
            if self.maintenance is not None:
                self.maintenance.run_due(SparkSession.active())
            if self.after_batch is not None:
                self.after_batch()
        finally:
            self._in_flight = None

    def end_after_this_batch(self) -> None:
        """A graceful stop marks the query terminated now: a batch it is planning is
        still written in full (`writing`)."""
        self._ending = True

    def in_flight(self) -> tuple[int | None, float | None]:
        """The batch being written and for how many seconds (None, None between batches)."""
        batch_id, since = self._in_flight, self._in_flight_since
        return (batch_id, time.monotonic() - since) if batch_id is not None else (None, None)


class IngestBatches:
    """The ingest batches being written, which a gold batch lets finish before it starts.

    Spark fires a processing-time trigger at multiples of its interval, so every gold
    trigger (three ingest triggers by default) lands on an ingest trigger. Measured at
    1 reading/s on two cores: a 10-row ingest batch took 3.5-4.6 s beside the five gold
    batches, 1.5-2.5 s otherwise; with gold waiting for it (`wait_until_idle`), 1.9-2.6 s.
    ``trigger_seconds`` is the ingest queries' processing-time interval, 0 when they
    have none (`--available-now`: gold starts once ingest has drained).
    """

    def __init__(self, trigger_seconds: float = 0.0) -> None:
        self._trigger_seconds = trigger_seconds
        self._started: list[float] = []  # wall-clock starts of the batches being written
        self._changed = threading.Condition()

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Count an ingest batch as being written for the duration of the block."""
        start = time.time()
        with self._changed:
            self._started.append(start)
        try:
            yield
        finally:
            with self._changed:
                self._started.remove(start)
                self._changed.notify_all()

    def wait_until_idle(self, timeout: float) -> float:
        """Wait, at most ``timeout`` seconds, for the ingest batches of the latest trigger.

        Those start within `_INGEST_START_SECONDS` of the latest ingest trigger instant
        (Kafka offsets, planning: 0.15-0.4 s measured), later than a gold batch
        triggered with them, so gold first gives them that time to start. A batch that
        started otherwise is catching up: ingest is behind, the cores are busy anyway
        and the FAIR pools share them, so gold does not wait for it, nor for a new one
        while it runs. Returns the seconds waited.
        """
        if not self._trigger_seconds:
            return 0.0  # no trigger instants: gold runs after ingest has drained
        started = time.time()
        instant = started - started % self._trigger_seconds

        def on_time(start: float) -> bool:
            return instant <= start < instant + _INGEST_START_SECONDS

        with self._changed:
            catching_up = any(not on_time(t) for t in self._started)
        if not catching_up:
            time.sleep(min(max(instant + _INGEST_START_SECONDS - started, 0.0), timeout))
        with self._changed:
            self._changed.wait_for(
                lambda: not any(on_time(t) for t in self._started),
                timeout - (time.time() - started),
            )
        return time.time() - started


def run_together(
    spark: SparkSession, workers: ThreadPoolExecutor, writes: Sequence[Callable[[], object]]
) -> None:
    """Run a batch's independent table ``writes`` at once; return when every one has ended.

    The first runs in this thread, the others on ``workers``, each with this thread's
    Spark local properties (the query's job group and scheduler pool: stopping the
    query cancels their jobs too). Most of a small Delta append is the driver's
    fixed cost (log state, commit), so appends to different tables overlap well.
    The first failure is raised once all have ended: none is left running.
    """
    inherit = inheritable_thread_target(spark)
    futures = [workers.submit(inherit(write)) for write in writes[1:]]
    try:
        if writes:
            writes[0]()
    finally:
        # Wait for the others even when the first failed: its error propagates after.
        errors = [e for e in (future.exception() for future in futures) if e is not None]
    if errors:
        raise errors[0]


def check_tables(
    spark: SparkSession, settings: Settings, query_name: str, tables: Sequence[Table]
) -> list[Table]:
    """Refuse an earlier table layout or a checkpoint/table mismatch; return the declared
    tables that do not exist yet, for the caller to create (`ensure_table`).

    ``tables[0]`` is the anchor table, committed every batch (see `service.lake.tables.QuerySpec`).
    """
    checkpoint = checkpoints.read_checkpoint(
        HadoopFiles(spark), checkpoint_location(settings, query_name)
    )
    uris = {t.name: t.uri(settings.storage_uri) for t in tables}
    txns = {uri: table_transactions(spark, uri) for uri in uris.values()}
    anchor = uris[tables[0].name]
    for table in tables:
        uri = uris[table.name]
        if txns[uri] is None:
            continue
        differences = table.layout_differences(spark.read.format("delta").load(uri).schema)
        if differences:
            raise TableLayoutError(
                f"{table.name} at {uri} was written with an earlier table layout "
                f"({'; '.join(differences)}). Stop the driver and run `lakehouse-ingest "
                "migrate` to upgrade it in place (docs/tables.md, Upgrading a lake)."
            )
    # A table a later release added was written by none of the committed batches.
    verified = {
        uri: txns[uri] for t in tables if txns[uri := uris[t.name]] is not None or not t.added_later
    }
    checkpoints.verify_checkpoint_matches_tables(query_name, checkpoint, verified, anchor)
    return [t for t in tables if txns[uris[t.name]] is None and t.schema is not None]


def start_with_writer(
    spark: SparkSession,
    stream: DataStreamWriter,
    settings: Settings,
    writer: QueryWriter,
    available_now: bool,
    pool: str,
    **context: str,
) -> StreamingQuery:
    """Start ``stream`` as the query ``writer`` writes, triggered as its ``pool``'s queries
    are (`trigger_seconds`).

    Its jobs run in the FAIR scheduler ``pool`` (`service.streaming.session.SCHEDULER_POOLS`).
    """
    stream = (
        stream.queryName(writer.query_name)
        .option("checkpointLocation", checkpoint_location(settings, writer.query_name))
        .foreachBatch(writer)
    )
    if available_now:
        stream = stream.trigger(availableNow=True)
    else:
        interval = trigger_seconds(settings, pool, available_now)
        stream = stream.trigger(processingTime=f"{interval} seconds")
    # The query's thread inherits the pool: its jobs share the cores with the other
    # pool's instead of queueing behind them.
    set_scheduler_pool(spark, pool)
    try:
        started = stream.start()
    finally:
        set_scheduler_pool(spark, None)
    writer.bind(str(started.id))
    log.info("query_started", query=writer.query_name, id=str(started.id), **context)
    return started
