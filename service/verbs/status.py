"""The ``status`` verb: what each query committed, how far Kafka is ahead, what the tables hold.

It reads only durable state, so it works while the driver is down: each query's
checkpoint (`service.lake.checkpoints`) and the driver lease through pyarrow's
filesystems, the broker's latest offsets (librdkafka watermarks) and each Delta
table's latest commit and row count through delta-rs (`service.lake.lakeview`). No
JVM, so it starts fast and needs little memory beside a busy driver. It writes
nothing and takes no lease, so it is safe next to a running driver.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from service.config import Settings
from service.contracts.model import Contract
from service.driver_status import DriverView, QueryNow, fetch_driver_view
from service.errors import CheckpointCorruptError, CheckpointMismatchError, LakeReadError
from service.gold.queries import gold_queries
from service.ingest.query import ingest_queries
from service.kafka.offsets import PartitionStatus, broker_offsets, offsets_consumer, partition_lag
from service.lake.checkpoints import (
    CheckpointFiles,
    CheckpointState,
    read_checkpoint,
    recorded_plan,
)
from service.lake.lakeview import LakeReader, run_sql
from service.lake.lease import lease_location
from service.lake.object_files import ObjectFiles
from service.lake.tables import (
    FINGERPRINT_PROPERTY,
    VERSION_PROPERTY,
    QuerySpec,
    Table,
    contract_tables,
)
from service.streaming.runner import checkpoint_location

T = TypeVar("T")
# How long `status` waits for the brokers' first answer: an on-call answer in seconds even
# when no broker answers (the rest is printed, the lag says why it is missing).
KAFKA_STATUS_SECONDS = 2.5


@dataclass(frozen=True)
class QueryStatus:
    """One ingest query: its checkpoint's progress and its Kafka lag."""

    query: str
    topic: str
    checkpoint: str
    query_id: str | None
    last_committed_batch: int | None
    last_batch_time: str | None
    committed_at: str | None
    planned_batch: int | None
    lag: int | None
    partitions: list[PartitionStatus]
    errors: list[str]
    plan_version: int | None = None
    """A gold query's plan version (`service.lake.checkpoints.checkpoint_plan`), once started."""
    latest_plan: int | None = None


@dataclass(frozen=True)
class TableStatus:
    """One Delta table: its latest version and commit, and how many rows it holds."""

    table: str
    uri: str
    # None when the storage could not be read at all (`Status.storage_error`).
    exists: bool | None
    version: int | None = None
    last_commit_time: str | None = None
    last_operation: str | None = None
    rows: int | None = None
    error: str | None = None
    contract: str | None = None
    """A silver table's recorded contract: its version and fingerprint ("v2 3f2a9c1b0d4e5f60")."""
    contract_file: str | None = None
    """The deployed contract file's, when it differs from the recorded one (applied at the
    driver's next start)."""


@dataclass(frozen=True)
class LeaseStatus:
    """The driver lease: who runs the lakehouse, and how recently it said so."""

    held: bool
    host: str | None = None
    pid: int | None = None
    heartbeat_age_seconds: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class Status:
    """Everything `lakehouse-ingest status` reports."""

    storage_root: str
    checkpoint_root: str
    generated_at: str
    lease: LeaseStatus
    queries: list[QueryStatus]
    tables: list[TableStatus]
    driver: DriverView | None = None
    driver_error: str | None = None
    # The storage did not answer its first read (the lease): nothing more was read from it.
    storage_error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether every part could be read."""
        return (
            self.storage_error is None
            and not any(q.errors for q in self.queries)
            and not any(t.error for t in self.tables)
        )

    def to_json(self) -> str:
        """The status as one JSON document."""
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    def to_text(self) -> str:
        """The status as readable tables."""
        unreadable = f" (UNREADABLE: {self.storage_error})" if self.storage_error else ""
        lines = [
            f"storage     {self.storage_root}{unreadable}",
            f"checkpoints {self.checkpoint_root}",
            f"driver      {_lease_text(self.lease) if not self.storage_error else 'unknown'}",
            f"now         {_driver_text(self.driver, self.driver_error)}",
            "",
        ]
        now = {q.query: q for q in self.driver.queries} if self.driver else {}
        lines += _columns(
            (
                "QUERY",
                "TOPIC",
                "LAST BATCH",
                "BATCH STARTED (UTC)",
                "COMMITTED",
                "LATEST",
                "LAG",
                "NOW",
            ),
            [
                (
                    q.query,
                    q.topic,
                    _text(q.last_committed_batch)
                    + (f" (+{q.planned_batch} planned)" if q.planned_batch is not None else ""),
                    _text(q.last_batch_time),
                    _text(_total(p.committed for p in q.partitions)),
                    _text(_total(p.latest for p in q.partitions)),
                    _text(q.lag),
                    _now_text(now.get(q.query)),
                )
                for q in self.queries
            ],
        )
        for q in self.queries:
            lines += [f"  {q.query}: {e}" for e in q.errors]
            if q.plan_version is not None and q.plan_version != q.latest_plan:
                lines.append(
                    f"  {q.query}: runs plan {q.plan_version} of {q.latest_plan}, its state's "
                    "layout; docs/tables.md 'Gold plan versions' rebuilds it with the latest"
                )
        lines.append("")
        lines += _columns(
            ("TABLE", "VERSION", "ROWS", "LAST COMMIT (UTC)", "OPERATION", "CONTRACT"),
            [
                (
                    t.table,
                    _text(t.version),
                    _text(t.rows),
                    _text(t.last_commit_time),
                    t.last_operation or _no_operation(t.exists),
                    t.contract or "",
                )
                for t in self.tables
            ],
        )
        lines += [f"  {t.table}: {t.error}" for t in self.tables if t.error]
        lines += [
            f"  {t.table}: the contract file is {t.contract_file}, "
            + (f"not the recorded {t.contract}" if t.contract else "none is recorded yet")
            + "; the driver applies it at its next start"
            for t in self.tables
            if t.contract_file
        ]
        return "\n".join(lines)


def collect_status(settings: Settings) -> Status:
    """Ask the driver what it is doing; read checkpoints, offsets, the lease and tables."""
    driver, driver_error = fetch_driver_view(settings.http_port)
    queries = ingest_queries(settings)
    gold = gold_queries() if settings.gold_enabled else []
    consumer = offsets_consumer(settings)
    try:
        latest = broker_offsets(consumer, [q.topic for q in queries], KAFKA_STATUS_SECONDS)
    finally:
        consumer.close()
    from_earliest = settings.kafka_starting_offsets == "earliest"
    # The first read of the storage: when it fails, the others would fail the same way,
    # each after its own retries (a minute in all), so none is tried.
    storage = ObjectFiles(settings)
    lease = _lease_status(storage, lease_location(settings.checkpoint_uri))
    files: CheckpointFiles = storage if lease.error is None else _Unread()
    modified = storage.modified if lease.error is None else _Unread().modified
    query_status = [
        _query_status(
            files,
            modified,
            checkpoint_location(settings, q.name),
            q.name,
            q.topic,
            latest,
            from_earliest,
        )
        for q in queries
    ] + [
        _query_status(
            files,
            modified,
            checkpoint_location(settings, g.name),
            g.name,
            None,
            {},
            True,
            plans=len(g.plans),
        )
        for g in gold
    ]
    specs: list[QuerySpec] = [*queries, *gold]
    tables = list(dict.fromkeys(t for q in specs for t in q.tables))
    reader = LakeReader.from_settings(settings)
    deployed = {contract_tables(c).silver.name: c for c in settings.contracts}
    return Status(
        storage_root=settings.storage_uri,
        checkpoint_root=settings.checkpoint_uri,
        generated_at=_iso(time.time()),
        lease=lease,
        queries=query_status,
        tables=[
            table_status(reader, t, deployed.get(t.name))
            if lease.error is None
            else TableStatus(t.name, reader.uri(t), False)
            for t in tables
        ],
        driver=driver,
        driver_error=driver_error,
        storage_error=lease.error,
    )


def table_status(reader: LakeReader, table: Table, contract: Contract | None = None) -> TableStatus:
    """The latest version, commit and row count of ``table`` (counted from the Delta log);
    for a silver table (``contract``, the deployed one), the contract recorded with it."""
    uri = reader.uri(table)
    try:
        delta = reader.open_if_exists(table)
        if delta is None:
            return TableStatus(table.name, uri, exists=False)
        # delta-rs lists the commits from the opened version on, newest first, with those
        # a live writer made since: the opened version's is the last.
        last = delta.history(1)[-1]
        rows = run_sql({"t": delta}, "SELECT COUNT(*) AS n FROM t").column("n")[0].as_py()
        properties = dict(delta.metadata().configuration)
    except (LakeReadError, OSError) as e:
        return TableStatus(table.name, uri, exists=True, error=_first_line(e))
    recorded = _contract_text(
        properties.get(VERSION_PROPERTY), properties.get(FINGERPRINT_PROPERTY)
    )
    deployed = (
        _contract_text(
            str(contract.version) if contract.version is not None else "", contract.fingerprint
        )
        if contract is not None
        else None
    )
    return TableStatus(
        table.name,
        uri,
        exists=True,
        version=delta.version(),
        last_commit_time=_iso(int(last["timestamp"]) / 1000.0),
        last_operation=str(last["operation"]),
        rows=int(rows),
        contract=recorded,
        contract_file=deployed if deployed != recorded else None,
    )


def _contract_text(version: str | None, fingerprint: str | None) -> str | None:
    """A recorded contract as status shows it: "v2 3f2a9c1b0d4e5f60" (None if none is)."""
    if not fingerprint:
        return None
    return f"v{version} {fingerprint}" if version else fingerprint


def _query_status(
    files: CheckpointFiles,
    modified: Callable[[str], float | None],
    uri: str,
    name: str,
    topic: str | None,
    latest: Mapping[str, Any],
    from_earliest: bool,
    plans: int | None = None,
) -> QueryStatus:
    """A query's checkpoint; for an ingest query (``topic`` set) its Kafka lag too, for
    a gold query (``plans``: its number of plan versions) the version it runs."""
    errors = [latest["_error"]] if topic is not None and "_error" in latest else []
    state = _guarded(lambda: read_checkpoint(files, uri), errors, CheckpointState(uri))
    plan = None
    if plans is not None and state.query_id is not None:  # Spark created the checkpoint
        try:
            plan = recorded_plan(files, uri, plans)
        except (OSError, CheckpointCorruptError, CheckpointMismatchError) as e:
            errors.append(f"plan version: {_first_line(e)}")
    partitions = (
        partition_lag(state.kafka_offsets.get(topic, {}), latest.get(topic), from_earliest)
        if topic is not None
        else []
    )
    lags = [p.lag for p in partitions]
    committed_at = (
        modified(f"{uri}/commits/{state.last_committed_batch}")
        if state.last_committed_batch is not None
        else None
    )
    return QueryStatus(
        query=name,
        topic=topic or "-",
        checkpoint=uri,
        query_id=state.query_id,
        last_committed_batch=state.last_committed_batch,
        last_batch_time=_iso(state.batch_timestamp_ms / 1000.0)
        if state.batch_timestamp_ms is not None
        else None,
        committed_at=_iso(committed_at) if committed_at is not None else None,
        planned_batch=state.planned_batch,
        lag=None if not lags or None in lags else sum(x for x in lags if x is not None),
        partitions=partitions,
        errors=errors,
        plan_version=plan,
        latest_plan=plans,
    )


# The driver rewrites its lease every few seconds, and a read takes the object's size and
# its bytes in two requests: one that meets a rewrite can get the new record cut at the
# old one's length. The next read does not.
_LEASE_READS = 3


def _lease_status(files: CheckpointFiles, uri: str) -> LeaseStatus:
    for _ in range(_LEASE_READS):
        try:
            text = files.read_text(uri)
        except OSError as e:
            return LeaseStatus(held=False, error=_first_line(e))
        if not text:
            return LeaseStatus(held=False)
        try:
            record = json.loads(text)
        except ValueError:
            continue
        return LeaseStatus(
            held=True,
            host=record.get("host"),
            pid=record.get("pid"),
            heartbeat_age_seconds=round(time.time() - float(record.get("heartbeat_at", 0)), 1),
        )
    return LeaseStatus(held=True)  # by a record that is no JSON: its owner is unknown


class _Unread:
    """The checkpoint files of a storage that did not answer: not read (nothing there)."""

    def read_text(self, uri: str) -> str | None:
        return None

    def list_names(self, uri: str) -> list[str]:
        return []

    def modified(self, uri: str) -> float | None:
        return None


def _guarded(read: Callable[[], T], errors: list[str], default: T) -> T:
    try:
        return read()
    except (OSError, ValueError, KeyError) as e:
        errors.append(f"checkpoint unreadable: {_first_line(e)}")
        return default


def _no_operation(exists: bool | None) -> str:
    return {None: "(not read)", False: "(no table)"}.get(exists, "-")


def _driver_text(view: DriverView | None, error: str | None) -> str:
    if view is None:
        return error or "-"
    ready = "ready" if view.ready else f"NOT READY ({view.ready_reason})"
    alive = "" if view.alive else f"; NOT ALIVE ({view.alive_reason})"
    return f"pid {view.pid} answering: {ready}{alive}"


def _now_text(query: QueryNow | None) -> str:
    if query is None:
        return "-"
    if not query.active:
        return "stopped"
    if query.batch_in_flight is not None:
        return f"writing batch {query.batch_in_flight} for {query.in_flight_seconds:.0f}s"
    return "waiting for the next trigger"


def _lease_text(lease: LeaseStatus) -> str:
    if lease.error:
        return f"unknown ({lease.error})"
    if not lease.held:
        return "no driver holds the lease (stopped cleanly, or never started)"
    return f"lease held by {lease.host} pid {lease.pid}, renewed {lease.heartbeat_age_seconds}s ago"


def _columns(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    table = [list(header), *[list(r) for r in rows]]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table
    ]


def _total(values: Iterable[int | None]) -> int | None:
    items = list(values)
    if not items or any(v is None for v in items):
        return None
    return sum(v for v in items if v is not None)


def _text(value: object) -> str:
    return "-" if value is None else str(value)


def _iso(unix_seconds: float) -> str:
    return datetime.fromtimestamp(unix_seconds, UTC).isoformat(timespec="seconds")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__
