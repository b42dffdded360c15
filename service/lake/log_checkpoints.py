"""Delta checkpoints written after the batches, in the background, instead of inside them.

Delta writes a table's checkpoint (its whole state as one Parquet file, so that a reader
replays a few commits instead of all of them) inside the commit whose version is a
multiple of ``delta.checkpointInterval``: the batch that makes that commit waits for it.
In `make run` that was 1.3-2.8 s more in about one ingest batch in three (four tables
each, 10-14 commits apart). The service's tables are created with in-commit checkpoints
off (`service.lake.tables.IN_COMMIT_CHECKPOINTS_OFF`), and each has its own cadence:
``INGEST_DELTA_CHECKPOINT_COMMITS`` plus its `Table.checkpoint_stagger`. After a query's
batch, `LogCheckpoints` checks that query's tables in a thread of its own and writes
each one's checkpoint once as many commits have passed since its last, while the query
waits for its next trigger.

A checkpoint that fails is logged (``delta_checkpoint_failed``) and tried again after
the next batch: the table stays correct without it, only slower to read. Tables of a
lake written before this (in-commit checkpoints still on until ``migrate``) get both.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

import structlog
from pyspark.sql import SparkSession

from service.lake.jvm import java_class, set_scheduler_pool
from service.lake.maintenance import error_summary
from service.lake.tables import Table

log = structlog.get_logger(__name__)

# How long `stop` waits for the checkpoint being written.
_STOP_TIMEOUT_SECONDS = 30.0


class LogCheckpoints:
    """One thread that writes the due Delta checkpoints of the tables a batch committed to.

    `after_batch_of` gives a query's writer the callable its batches end with; `run_due`
    is the thread's work, callable directly. A table's checkpoint is due ``commits`` plus
    its stagger after its last. Jobs run in the FAIR scheduler ``pool``.
    """

    def __init__(self, spark: SparkSession, storage_uri: str, commits: int, pool: str) -> None:
        self._spark = spark
        self._storage_uri = storage_uri
        self._commits = commits
        self._pool = pool
        self._every: dict[str, int] = {}  # table URI -> commits between checkpoints
        self._names: dict[str, str] = {}  # table URI -> table name
        self._checkpointed: dict[str, int] = {}  # table URI -> version of its last checkpoint
        self._pending: dict[str, None] = {}  # table URIs to check, in order
        self._changed = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def after_batch_of(self, tables: Iterable[Table]) -> Callable[[], None]:
        """What a writer calls after each committed batch that wrote ``tables``."""
        uris = []
        for table in tables:
            uri = table.uri(self._storage_uri)
            self._every[uri] = self._commits + table.checkpoint_stagger
            self._names[uri] = table.name
            uris.append(uri)

        def committed() -> None:
            with self._changed:
                self._pending.update(dict.fromkeys(uris))
                self._changed.notify()

        return committed

    def start(self) -> None:
        """Start the thread."""
        self._thread = threading.Thread(target=self._loop, name="delta-checkpoints", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Let the checkpoint being written end (at most `_STOP_TIMEOUT_SECONDS`), then stop:
        the next run writes those still due, after its first batch."""
        with self._changed:
            self._stopping = True
            self._changed.notify()
        if self._thread is not None:
            self._thread.join(_STOP_TIMEOUT_SECONDS)

    def _loop(self) -> None:
        set_scheduler_pool(self._spark, self._pool)
        while True:
            with self._changed:
                while not self._pending and not self._stopping:
                    self._changed.wait()
                if self._stopping:
                    return
            self.run_due()

    def run_due(self) -> list[tuple[str, int]]:
        """Checkpoint each pending table that is due, until `stop`; return the (table,
        version) written."""
        written: list[tuple[str, int]] = []
        while True:
            with self._changed:
                if not self._pending or self._stopping:
                    return written
                uri = next(iter(self._pending))
                del self._pending[uri]
            version = self._checkpoint_if_due(uri)
            if version is not None:
                written.append((self._names[uri], version))

    def _checkpoint_if_due(self, uri: str) -> int | None:
        """Write ``uri``'s checkpoint at its latest version known here if it is due."""
        started = time.monotonic()
        try:
            delta_log = java_class(self._spark, "org.apache.spark.sql.delta.DeltaLog").forTable(
                self._spark._jsparkSession, uri
            )
            # The snapshot the driver's last commit left: no read of the log.
            snapshot = delta_log.unsafeVolatileSnapshot()
            version = int(snapshot.version())
            # Without a checkpoint, from the table's creation (version 0), as Delta counts.
            last = max(self._checkpointed.get(uri, 0), int(snapshot.checkpointProvider().version()))
            self._checkpointed[uri] = last
            if version < 0 or version - last < self._every[uri]:
                return None
            none = java_class(self._spark, "scala.Option").empty()
            delta_log.checkpointAndCleanUpDeltaLog(snapshot, none)
        except Exception as e:  # noqa: BLE001 - a table is correct without its checkpoint
            log.warning(
                "delta_checkpoint_failed",
                table=self._names[uri],
                error_class=type(e).__name__,
                error=error_summary(e),
            )
            return None
        self._checkpointed[uri] = version
        log.info(
            "delta_checkpoint_written",
            table=self._names[uri],
            version=version,
            duration_ms=round((time.monotonic() - started) * 1000),
        )
        return version
