"""Table maintenance: compaction (OPTIMIZE) and VACUUM of the tables a query owns.

Every table has exactly one owning query (`table_owners`: the first query that
writes it, so silver/quarantine, written by both ingest queries, belongs to
``ingest_users``). A query maintains its tables in its own thread, between its own
micro-batches, after a batch's commits (`service.streaming.runner.QueryWriter.writing`):
maintenance never runs concurrently with the table's own writer, so the users
MERGE cannot meet a concurrent OPTIMIZE. A table is due one maintenance interval
after its last run, successful or not, or after the first start of its query's
checkpoint: the times are kept in the checkpoint (`MAINTAINED_FILE`), so a driver
restarted more often than the interval still maintains its tables (counted from each
start, they were never due, and their files grew with every batch).
A run counts the files of the table's snapshot, compacts when there are at least
``maintenance_min_files`` of them (a ``dataChange=false`` commit that stream
readers skip), then VACUUMs files unreferenced for longer than the retention,
with Delta's retention check left on. A failure is logged and counted, never
raised: the batch and the query go on, and the next interval retries. The due,
ownership and compaction decisions are pure; `TableMaintenance` does the I/O.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog
from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from service.config import Settings
from service.lake.object_files import CheckpointTexts
from service.lake.tables import QuerySpec, Table

log = structlog.get_logger(__name__)

# Commits read back after a VACUUM to find its "VACUUM END" record (its START and END,
# plus the appends another query may have made to a shared table meanwhile).
_VACUUM_HISTORY_COMMITS = 5
_MAX_ERROR_CHARS = 500
# Our file in the owning query's checkpoint: unix seconds of each table's last
# maintenance (or of the checkpoint's first start, until its first), as a JSON object.
MAINTAINED_FILE = "lakehouse-ingest-maintained"


@dataclass(frozen=True)
class MaintenanceRecord:
    """Where the tables' maintenance times are kept: ``uri`` (the owning query's checkpoint's
    `MAINTAINED_FILE`), read and written through ``files``."""

    files: CheckpointTexts
    uri: str


def recorded_runs(text: str | None, tables: Iterable[str], now: float) -> dict[str, float]:
    """Each table's last run in ``text`` (a record's content; none or unreadable: ``now``),
    never after ``now`` (pure)."""
    try:
        kept = json.loads(text) if text else {}
    except ValueError:
        kept = {}
    runs = kept if isinstance(kept, dict) else {}
    return {
        t: min(float(v), now) if isinstance(v := runs.get(t), int | float) else now for t in tables
    }


class MaintenanceSink(Protocol):
    """Where maintenance outcomes go (`service.driver.metrics.MaintenanceMetrics`)."""

    def table_files_counted(self, table: str, files: int) -> None: ...
    def maintenance_succeeded(self, table: str, duration_seconds: float) -> None: ...
    def maintenance_failed(self, table: str) -> None: ...


@dataclass(frozen=True)
class MaintenancePolicy:
    """How often tables are maintained, when they are compacted, what VACUUM keeps."""

    interval_seconds: float
    min_files: int
    retention_hours: int

    @classmethod
    def from_settings(cls, settings: Settings) -> MaintenancePolicy:
        """The policy ``settings`` configure."""
        return cls(
            interval_seconds=settings.maintenance_interval_seconds,
            min_files=settings.maintenance_min_files,
            retention_hours=settings.vacuum_retention_hours,
        )

    @property
    def enabled(self) -> bool:
        """Whether tables are maintained at all (an interval of 0 turns it off)."""
        return self.interval_seconds > 0


def table_owners(queries: Iterable[QuerySpec]) -> dict[str, str]:
    """Table name → the query that maintains it: the first of ``queries`` that writes it."""
    owners: dict[str, str] = {}
    for query in queries:
        for table in query.tables:
            owners.setdefault(table.name, query.name)
    return owners


def owned_tables(
    query_name: str, tables: Sequence[Table], peers: Iterable[QuerySpec] = ()
) -> tuple[Table, ...]:
    """The tables of ``tables`` (written by ``query_name``) that ``query_name`` maintains.

    ``peers`` are the queries it may share a table with, in start order: a shared
    table belongs to the first of them that writes it (`table_owners`); a table no
    peer writes belongs to ``query_name``.
    """
    owners = table_owners(peers)
    return tuple(t for t in tables if owners.get(t.name, query_name) == query_name)


def maintenance_for(
    query: QuerySpec,
    settings: Settings,
    peers: Sequence[QuerySpec],
    metrics: MaintenanceSink,
    record: MaintenanceRecord | None = None,
) -> TableMaintenance | None:
    """The maintenance ``query``'s writer runs (of the tables it owns among ``peers``).

    None when maintenance is off (an interval of 0).
    """
    policy = MaintenancePolicy.from_settings(settings)
    if not policy.enabled:
        return None
    owned = owned_tables(query.name, query.tables, peers)
    return TableMaintenance(settings.storage_uri, owned, policy, metrics, record=record)


def compaction_due(files: int, min_files: int) -> bool:
    """Whether a table whose snapshot has ``files`` files is worth an OPTIMIZE."""
    return files >= min_files


class MaintenanceSchedule:
    """When each table is due: one interval after its last run (``last_runs``; else ``now``)."""

    def __init__(
        self,
        tables: Iterable[str],
        interval_seconds: float,
        now: float,
        last_runs: Mapping[str, float] | None = None,
    ) -> None:
        self._interval = interval_seconds
        self._last_run = {t: (last_runs or {}).get(t, now) for t in tables}

    @property
    def last_runs(self) -> dict[str, float]:
        """Each table's last run (or the start it counts from)."""
        return dict(self._last_run)

    def due(self, now: float) -> list[str]:
        """The tables whose interval has passed at ``now`` (none when the interval is 0)."""
        if self._interval <= 0:
            return []
        return [t for t, last in self._last_run.items() if now - last >= self._interval]

    def ran(self, table: str, now: float) -> None:
        """Record that ``table`` was maintained (or tried to be) at ``now``."""
        self._last_run[table] = now


@dataclass(frozen=True)
class MaintenanceOutcome:
    """What one table's maintenance did, for the ``maintenance_done`` log line."""

    table: str
    files_before: int
    files_after: int
    compacted: bool
    vacuumed_files: int | None  # None: not recorded (Delta logs VACUUM only on some stores)
    duration_seconds: float


class TableMaintenance:
    """Maintenance of one query's tables: due checks, OPTIMIZE and VACUUM, log and metrics."""

    def __init__(
        self,
        storage_uri: str,
        tables: Iterable[Table],
        policy: MaintenancePolicy,
        metrics: MaintenanceSink,
        clock: Callable[[], float] = time.time,
        record: MaintenanceRecord | None = None,
    ) -> None:
        self._uris = {t.name: t.uri(storage_uri) for t in tables}
        self._policy = policy
        self._metrics = metrics
        self._clock = clock
        self._record = record
        now = clock()
        text = self._read_record()
        self._schedule = MaintenanceSchedule(
            self._uris, policy.interval_seconds, now, recorded_runs(text, self._uris, now)
        )
        # A new record is written once the query runs (its checkpoint exists by then).
        self._unrecorded = record is not None and text is None

    @property
    def tables(self) -> tuple[str, ...]:
        """The names of the tables maintained."""
        return tuple(self._uris)

    def due(self) -> list[str]:
        """The tables due now."""
        return self._schedule.due(self._clock())

    def run_due(self, spark: SparkSession) -> list[MaintenanceOutcome]:
        """Maintain every due table in turn; return what succeeded (failures are logged)."""
        outcomes = []
        due = self.due()
        for table in due:
            outcome = self.maintain(spark, table)
            self._schedule.ran(table, self._clock())
            if outcome is not None:
                outcomes.append(outcome)
        if due or self._unrecorded:
            self._write_record()
        return outcomes

    def _read_record(self) -> str | None:
        if self._record is None:
            return None
        try:
            return self._record.files.read_text(self._record.uri)
        except Exception as e:  # noqa: BLE001 - maintenance must never stop a query
            log.warning(
                "maintenance_record_unreadable", uri=self._record.uri, error=error_summary(e)
            )
            return None

    def _write_record(self) -> None:
        if self._record is None:
            return
        try:
            self._record.files.write_text(
                self._record.uri, json.dumps(self._schedule.last_runs, sort_keys=True)
            )
            self._unrecorded = False
        except Exception as e:  # noqa: BLE001 - retried after the next run
            log.warning("maintenance_record_failed", uri=self._record.uri, error=error_summary(e))

    def maintain(self, spark: SparkSession, table: str) -> MaintenanceOutcome | None:
        """Compact ``table`` if it has enough files, then VACUUM it; None if that failed.

        A failure is logged (``maintenance_failed``) and counted, never raised.
        """
        started = self._clock()
        try:
            outcome = self._maintain(spark, table, started)
        except Exception as e:  # noqa: BLE001 - any error must leave the batch and query running
            self._metrics.maintenance_failed(table)
            log.warning(
                "maintenance_failed",
                table=table,
                error_class=type(e).__name__,
                error=error_summary(e),
                duration_ms=round((self._clock() - started) * 1000),
            )
            return None
        self._metrics.maintenance_succeeded(table, outcome.duration_seconds)
        log.info(
            "maintenance_done",
            table=table,
            files_before=outcome.files_before,
            files_after=outcome.files_after,
            compacted=outcome.compacted,
            vacuumed_files=outcome.vacuumed_files,
            duration_ms=round(outcome.duration_seconds * 1000),
        )
        return outcome

    def _maintain(self, spark: SparkSession, table: str, started: float) -> MaintenanceOutcome:
        delta = DeltaTable.forPath(spark, self._uris[table])
        files_before = files_after = self._count_files(delta, table)
        compacted = compaction_due(files_before, self._policy.min_files)
        if compacted:
            delta.optimize().executeCompaction()
            files_after = self._count_files(delta, table)
        version = _latest_version(delta)
        delta.vacuum(float(self._policy.retention_hours))
        return MaintenanceOutcome(
            table=table,
            files_before=files_before,
            files_after=files_after,
            compacted=compacted,
            vacuumed_files=_vacuumed_files(delta, after_version=version),
            duration_seconds=self._clock() - started,
        )

    def _count_files(self, delta: DeltaTable, table: str) -> int:
        row = delta.detail().select("numFiles").first()
        files = int(row["numFiles"]) if row is not None else 0
        self._metrics.table_files_counted(table, files)
        return files


def _latest_version(delta: DeltaTable) -> int:
    row = delta.history(1).select("version").first()
    return int(row["version"]) if row is not None else -1


def _vacuumed_files(delta: DeltaTable, after_version: int) -> int | None:
    """Files the last VACUUM deleted, from its "VACUUM END" commit after ``after_version``.

    Delta records VACUUM in the log only on stores it trusts with that (local, HDFS,
    Azure, GCS; not s3a unless ``spark.databricks.delta.vacuum.logging.enabled``).
    """
    row = (
        delta.history(_VACUUM_HISTORY_COMMITS)
        .where((F.col("version") > after_version) & (F.col("operation") == "VACUUM END"))
        .select(F.col("operationMetrics").getItem("numDeletedFiles").alias("deleted"))
        .first()
    )
    if row is None or row["deleted"] is None:
        return None
    return int(row["deleted"])


def error_summary(error: BaseException) -> str:
    """The first meaningful line of ``error``'s message (py4j's call preamble skipped)."""
    for line in str(error).splitlines():
        text = line.strip().removeprefix(": ")
        if text and not text.startswith("An error occurred while calling"):
            return text[:_MAX_ERROR_CHARS]
    return type(error).__name__
