"""The lake's invariants, checked from its tables alone, without a JVM: what the ``reconcile``
verb reports and the driver's periodic check (`service.driver.lake_audit`) runs.

Every check is a DataFusion SQL statement over the Delta tables (`service.lake.lakeview`),
by Kafka coordinates (topic, partition, offset) and set equality (docs/promises.md, Reconciliation):

- bronze: per topic and partition, one row per offset, and the offsets contiguous
  from the first present to the last (gaps reported as ranges), but for the offsets
  recorded as holding no record: those the ingest found no record at in a batch's
  range (bronze/offset_gaps: transaction markers, aborted transactions' records,
  records compacted away before they were read) and those skipped at a start
  (bronze/skipped_offsets). A gap anywhere else is a record read and then lost;
- sensors: every bronze/sensors record landed exactly once in silver/sensor_readings,
  silver/quarantine (the sensors topic) or silver/sensor_duplicates, and nothing
  landed there that bronze lacks;
- users: one silver/users row per user id, and each row's lineage (the change
  applied last) is a bronze/users record that was not quarantined; every
  quarantined users record is in bronze. (silver/users keeps only the latest change
  per user, so a superseded change leaves no trace to check);
- gold: no window key twice in the windowed tables, no silver reading twice in the
  per-reading tables.

``since`` restricts the Kafka-side checks to records with ``kafka_timestamp`` at or
after it, ``increments`` to offset ranges per topic partition (the driver's periodic
check, `service.driver.lake_audit`, which also narrows the per-reading gold tables to them);
the gold window-key checks and "one row per user id" always cover the whole table.
A table that does not exist counts as empty. The report says what was checked and
what broke; it is ok only when every invariant holds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from service.config import Settings
from service.errors import LakeRequestError
from service.lake.lakeview import LakeReader, plain, run_sql
from service.lake.schemas import COORDINATES
from service.lake.tables import (
    ALERTS,
    HEART_RATE_5M,
    OFFSET_GAPS_TABLE,
    QUARANTINE_REPLAYS_TABLE,
    QUARANTINE_TABLE,
    READINGS_ENRICHED,
    SENSOR_STATS_1M,
    SKIPPED_OFFSETS_TABLE,
    ContractTables,
    Table,
    contract_tables,
)

# At most this many offset ranges (and samples) per finding in the report; counts are exact.
MAX_RANGES = 20
# Gold rows are unique by these columns: a final window per key, or one row per silver reading.
GOLD_KEYS: Mapping[Table, tuple[str, ...]] = {
    SENSOR_STATS_1M: ("window_start", "window_end", "device_id", "sensor_type"),
    HEART_RATE_5M: ("window_start", "window_end", "user_id"),
    READINGS_ENRICHED: COORDINATES,
    ALERTS: COORDINATES,
}
# The replay outcomes that moved a quarantined record to silver (`service.verbs.replay`).
MOVED = ("silver", "duplicate")


@dataclass(frozen=True)
class OffsetRange:
    """Offsets ``first``..``last`` (inclusive) of one topic partition, and the tables they are
    in (empty for offsets bronze lacks)."""

    topic: str
    partition: int
    first: int
    last: int
    tables: str = ""

    @property
    def count(self) -> int:
        """How many offsets the range holds."""
        return self.last - self.first + 1

    def __str__(self) -> str:
        offsets = str(self.first) if self.first == self.last else f"{self.first}-{self.last}"
        where = f" in {self.tables}" if self.tables else ""
        return f"{self.topic}/{self.partition} offsets {offsets}{where}"


@dataclass(frozen=True)
class Finding:
    """Records in breach of one invariant: how many, and the first `MAX_RANGES` ranges."""

    count: int = 0
    ranges: list[OffsetRange] = field(default_factory=list)


@dataclass(frozen=True)
class Increment:
    """The offsets ``start`` (inclusive) to ``end`` (exclusive) of one topic partition:
    what a periodic check covers. With ``expect_start``, offset ``start`` itself must be
    in bronze (it follows the last offset an earlier check saw), so a gap at the
    boundary between two checks is found."""

    start: int
    end: int
    expect_start: bool


Increments = Mapping[str, Mapping[int, Increment]]


@dataclass(frozen=True)
class PartitionOffsets:
    """One topic partition of a bronze table: offsets present, and what breaks contiguity."""

    table: str
    topic: str
    partition: int
    first_offset: int
    last_offset: int
    rows: int
    missing_offsets: int
    duplicate_rows: int
    gaps: list[OffsetRange]
    duplicates: list[OffsetRange]
    # Absent offsets recorded as holding no record (offset gaps, skipped offsets).
    without_record: int = 0

    @property
    def ok(self) -> bool:
        """Whether the offsets are contiguous, one row each."""
        return self.missing_offsets == 0 and self.duplicate_rows == 0


@dataclass(frozen=True)
class Coverage:
    """Bronze records of one topic against the silver tables they must land in."""

    bronze_rows: int
    landed: dict[str, int]
    missing: Finding  # in bronze, landed nowhere
    extra: Finding  # landed, but not in bronze
    repeated: Finding  # landed more than once


@dataclass(frozen=True)
class KeyedCheck:
    """A keyed silver table (one row per key, upserted) against its bronze table and its
    quarantine."""

    coverage: Coverage
    silver_rows: int
    duplicate_keys: int
    duplicate_key_samples: list[Any]

    @property
    def quarantined(self) -> int:
        """The contract's records in the quarantine."""
        return self.coverage.landed.get(QUARANTINE_TABLE.name, 0)


# A contract's check, by the shape of its silver table: appended (every record lands once
# in silver, the quarantine or the duplicates), or keyed (one row per key).
ContractCheck = Coverage | KeyedCheck


@dataclass(frozen=True)
class UniqueKeyCheck:
    """A gold table's rows are unique by ``key``."""

    table: str
    key: list[str]
    rows: int
    duplicate_keys: int
    extra_rows: int
    samples: list[dict[str, Any]]


@dataclass(frozen=True)
class Reconciliation:
    """Everything `lakehouse-ingest reconcile` reports."""

    storage_root: str
    since: str | None
    generated_at: str
    duration_seconds: float
    tables: dict[str, int | None]
    bronze: list[PartitionOffsets]
    # Each contract's check by contract name (in the JSON, a key of its own).
    checks: dict[str, ContractCheck]
    gold: list[UniqueKeyCheck]
    problems: list[str]
    # Offsets Kafka no longer had, skipped at a driver's start (bronze/skipped_offsets):
    # accepted as gaps in bronze.
    skipped: list[OffsetRange] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether every invariant holds."""
        return not self.problems

    def appended(self, contract: str) -> Coverage:
        """The check of ``contract``, whose silver table is appended."""
        check = self.checks[contract]
        assert isinstance(check, Coverage), f"{contract}'s silver table is keyed"
        return check

    def keyed(self, contract: str) -> KeyedCheck:
        """The check of ``contract``, whose silver table is keyed."""
        check = self.checks[contract]
        assert isinstance(check, KeyedCheck), f"{contract}'s silver table is appended"
        return check

    # What each contract's check reads, for the text report.
    descriptions: dict[str, tuple[str, str]] = field(default_factory=dict)
    # The bronze records checked, per bronze table.
    records: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> str:
        """The report as one JSON document (ranges as objects with their count); each
        contract's check under the contract's name (`sensors`, `users`, ...)."""
        document = {"ok": self.ok, **asdict(self)}
        document.pop("descriptions")
        document |= document.pop("checks")
        return json.dumps(_with_counts(document), indent=2, sort_keys=True, default=str)

    def to_text(self) -> str:
        """The report for people."""
        lines = [
            f"lake        {self.storage_root}",
            f"records     {'since ' + self.since if self.since else 'all'} (Kafka timestamp)",
            f"checked in  {self.duration_seconds:.2f}s",
            "",
            "bronze: one row per offset, offsets contiguous per topic partition",
        ]
        lines += _columns(
            ("TABLE", "TOPIC", "PARTITION", "FIRST", "LAST", "ROWS", "NO RECORD", "MISSING",
             "DUPLICATE"),
            [
                (p.table, p.topic, str(p.partition), str(p.first_offset), str(p.last_offset),
                 str(p.rows), str(p.without_record), str(p.missing_offsets),
                 str(p.duplicate_rows))
                for p in self.bronze
            ],
        )  # fmt: skip
        if any(p.without_record for p in self.bronze):
            lines.append(
                "  NO RECORD: offsets no record was read at (transaction markers, aborted"
                " transactions, compacted away; bronze/offset_gaps) or skipped at a start"
            )
        if not self.bronze:
            lines.append("  (no bronze rows)")
        if self.skipped:
            lines.append(
                "  skipped at a start, Kafka no longer had them (bronze/skipped_offsets): "
                + ", ".join(str(r) for r in self.skipped)
            )
        for name, check in self.checks.items():
            rule, silver = self.descriptions.get(name, (name, "silver"))
            lines += ["", f"{name}: {rule}"]
            if isinstance(check, KeyedCheck):
                lines += [
                    f"  bronze rows {check.coverage.bronze_rows}; {silver} rows "
                    f"{check.silver_rows}; quarantined {check.quarantined}",
                    f"  duplicate keys {check.duplicate_keys}; "
                    + _coverage_counts(check.coverage, missing=False),
                ]
            else:
                lines += [
                    f"  bronze rows {check.bronze_rows}; landed: " + _landed(check.landed),
                    "  " + _coverage_counts(check),
                ]
        lines += ["", "gold: unique keys"]
        lines += _columns(
            ("TABLE", "KEY", "ROWS", "DUPLICATE KEYS", "EXTRA ROWS"),
            [
                (g.table, ",".join(g.key), str(g.rows), str(g.duplicate_keys), str(g.extra_rows))
                for g in self.gold
            ],
        )
        lines.append("")
        if self.ok:
            lines.append("OK: every invariant holds")
        else:
            lines.append(f"FAILED: {len(self.problems)} problem(s)")
            lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


def reconcile(
    reader: LakeReader,
    settings: Settings,
    since: datetime | None,
    increments: Increments | None = None,
) -> Reconciliation:
    """Check every invariant of the lake under ``reader``'s root, for every contract of
    ``settings``.

    The silver and gold snapshots are read before bronze's: a batch writes bronze first,
    so every row they hold has its bronze record in the later snapshot.
    """
    started = time.monotonic()
    contracts = list(settings.contracts)
    tables = {c.name: contract_tables(c) for c in contracts}
    later = [t.bronze for t in tables.values()]
    catalogue = reader.tables
    opened = {t: reader.open_if_exists(t) for t in catalogue if t not in later}
    opened |= {t: reader.open_if_exists(t) for t in later}
    opened = {t: opened[t] for t in catalogue}
    if not any(opened.values()):
        raise LakeRequestError(f"no table of the lake found under {reader.root}")
    checks = _LakeChecks({t: d for t, d in opened.items() if d is not None}, since, increments)
    skipped = checks.skipped_offsets()
    bronze = [p for c in contracts for p in checks.bronze_offsets(tables[c.name].bronze)]
    if increments is not None:
        recorded = checks.recorded_gaps(increments)
        bronze_of = {c.topic: tables[c.name].bronze for c in contracts}
        bronze = with_edges(bronze, increments, bronze_of, recorded)
    results: dict[str, ContractCheck] = {}
    descriptions: dict[str, tuple[str, str]] = {}
    topics: list[str] = []
    for contract in contracts:
        own = tables[contract.name]
        seen = _topics(bronze, own.bronze, contract.topic)
        topics += seen
        if own.duplicates is not None:
            results[contract.name] = checks.coverage(
                own.bronze,
                [(own.silver, None), (QUARANTINE_TABLE, seen), (own.duplicates, None)],
                all_must_land=True,
            )
            descriptions[contract.name] = (
                f"{own.bronze.name} = {own.silver.name} + {QUARANTINE_TABLE.name}"
                f" ({contract.topic} topic) + {own.duplicates.name}, by coordinates",
                own.silver.name,
            )
        else:
            assert contract.key is not None
            results[contract.name] = checks.keyed_check(own, contract.key, seen)
            descriptions[contract.name] = (
                f"one {own.silver.name} row per {contract.key}; its lineage and every"
                f" quarantined {contract.name} record in {own.bronze.name}",
                own.silver.name,
            )
    gold = [checks.unique_keys(t, key) for t, key in GOLD_KEYS.items() if t in checks.tables]
    problems = _problems(bronze, {c.name: (tables[c.name], results[c.name]) for c in contracts})
    problems += [p for p in _gold_problems(gold)]
    problems += checks.foreign_quarantine(topics)
    return Reconciliation(
        storage_root=settings.storage_uri,
        since=_iso(since) if since else None,
        generated_at=_iso(datetime.now(UTC)),
        duration_seconds=round(time.monotonic() - started, 3),
        tables={t.name: (d.version() if d is not None else None) for t, d in opened.items()},
        bronze=bronze,
        checks=results,
        gold=gold,
        problems=problems,
        skipped=skipped,
        descriptions=descriptions,
        records={
            tables[name].bronze.name: (
                check.coverage if isinstance(check, KeyedCheck) else check
            ).bronze_rows
            for name, check in results.items()
        },
    )


class _LakeChecks:
    """The checks as SQL over the tables that exist (registered under their names), each
    Kafka-side one restricted to the records since the filter."""

    def __init__(
        self,
        tables: Mapping[Table, DeltaTable],
        since: datetime | None,
        increments: Increments | None,
    ) -> None:
        self.tables = tables
        self._sql_names = {t: _sql_name(t) for t in tables}
        self._since = f"kafka_timestamp >= '{_iso(since)}'" if since else "TRUE"
        self._increments = increments_sql(increments) if increments is not None else "TRUE"
        self._since = f"{self._since} AND {self._increments}"

    def _run(self, sql: str) -> pa.Table:
        return run_sql({self._sql_names[t]: d for t, d in self.tables.items()}, sql)

    def _source(self, table: Table) -> str:
        """The table's rows since the filter, or no rows when the table does not exist.
        Quarantine rows a replay moved to silver (`service.verbs.replay`) are left out: the
        record is in silver now, and counts there."""
        if table not in self.tables:
            return (
                "(SELECT CAST(NULL AS VARCHAR) AS kafka_topic, CAST(NULL AS INT) AS"
                " kafka_partition, CAST(NULL AS BIGINT) AS kafka_offset WHERE FALSE)"
            )
        rows = f"(SELECT * FROM {self._sql_names[table]} WHERE {self._since})"
        if table != QUARANTINE_TABLE or QUARANTINE_REPLAYS_TABLE not in self.tables:
            return rows
        moved = (
            "SELECT DISTINCT kafka_topic AS m_topic, kafka_partition AS m_partition,"
            f" kafka_offset AS m_offset FROM {self._sql_names[QUARANTINE_REPLAYS_TABLE]}"
            f" WHERE outcome IN ({_sql_list(MOVED)})"
        )
        return (
            f"(SELECT q.* FROM {rows} AS q LEFT JOIN ({moved}) AS m ON q.kafka_topic = m.m_topic"
            " AND q.kafka_partition = m.m_partition AND q.kafka_offset = m.m_offset"
            " WHERE m.m_offset IS NULL)"
        )

    def count(self, table: Table, where: str = "TRUE") -> int:
        """Rows of ``table`` since the filter that match ``where``."""
        result = self._run(f"SELECT COUNT(*) AS n FROM {self._source(table)} AS t WHERE {where}")
        return int(result.column("n")[0].as_py())

    def skipped_offsets(self) -> list[OffsetRange]:
        """The ranges bronze/skipped_offsets records (few: one per skip at a start)."""
        if SKIPPED_OFFSETS_TABLE not in self.tables:
            return []
        rows = self._run(
            "SELECT kafka_topic, kafka_partition, first_offset, last_offset FROM"
            f" {self._sql_names[SKIPPED_OFFSETS_TABLE]}"
            " ORDER BY kafka_topic, kafka_partition, first_offset"
        )
        return _ranges(rows.to_pylist())

    def _recorded(self) -> str | None:
        """A subquery of the offset ranges recorded as holding no record (topic, partition,
        first and last offset), None when neither table exists."""
        parts = [
            "SELECT kafka_topic, kafka_partition, first_offset, last_offset FROM"
            f" {self._sql_names[t]}"
            for t in (SKIPPED_OFFSETS_TABLE, OFFSET_GAPS_TABLE)
            if t in self.tables
        ]
        return f"({' UNION ALL '.join(parts)})" if parts else None

    def recorded_gaps(self, increments: Increments) -> list[OffsetRange]:
        """The recorded ranges that overlap ``increments``, merged where they touch."""
        recorded = self._recorded()
        if recorded is None:
            return []
        overlap = [
            f"(kafka_topic = '{_sql_text(topic)}' AND kafka_partition = {partition}"
            f" AND first_offset < {i.end} AND last_offset >= {i.start})"
            for topic, partitions in sorted(increments.items())
            for partition, i in sorted(partitions.items())
            if i.end > i.start
        ]
        if not overlap:
            return []
        rows = self._run(
            f"SELECT * FROM {recorded} AS r WHERE {' OR '.join(overlap)}"
            " ORDER BY kafka_topic, kafka_partition, first_offset"
        )
        return merged(_ranges(rows.to_pylist()))

    def bronze_offsets(self, table: Table) -> list[PartitionOffsets]:
        """Per topic partition of a bronze table: offsets present, gaps and duplicates;
        offsets recorded as holding no record are not gaps."""
        if table not in self.tables:
            return []
        source = self._source(table)
        recorded = self._recorded()
        summary = self._run(
            "SELECT kafka_topic, kafka_partition, MIN(kafka_offset) AS first_offset,"
            " MAX(kafka_offset) AS last_offset, COUNT(*) AS row_count,"
            f" COUNT(DISTINCT kafka_offset) AS offsets FROM {source} AS b"
            " GROUP BY kafka_topic, kafka_partition ORDER BY kafka_topic, kafka_partition"
        ).to_pylist()
        gaps = _ranges(self._run(gaps_sql(source, MAX_RANGES + 1, recorded)).to_pylist())
        missing = {
            (r["kafka_topic"], r["kafka_partition"]): r["missing"]
            for r in self._run(missing_sql(source, recorded)).to_pylist()
        }
        duplicates = _ranges(self._run(repeated_sql(source, MAX_RANGES + 1)).to_pylist())
        return [_partition_offsets(table, row, gaps, missing, duplicates) for row in summary]

    def coverage(
        self,
        bronze: Table,
        landing: Sequence[tuple[Table, Sequence[str] | None]],
        all_must_land: bool,
    ) -> Coverage:
        """Bronze records against the ``landing`` tables (those with topics: only those
        topics' rows), by coordinates."""
        parts = []
        for table, topics in landing:
            topic_filter = f" WHERE kafka_topic IN ({_sql_list(topics)})" if topics else ""
            parts.append(
                f"SELECT kafka_topic, kafka_partition, kafka_offset, '{table.name}' AS landed_in"
                f" FROM {self._source(table)} AS s{topic_filter}"
            )
        findings = self._run(coverage_sql(self._source(bronze), " UNION ALL ".join(parts)))
        landed = self._run(
            f"SELECT landed_in, COUNT(*) AS n FROM ({' UNION ALL '.join(parts)}) AS l"
            " GROUP BY landed_in"
        ).to_pylist()
        by_problem = _findings(findings)
        return Coverage(
            bronze_rows=self.count(bronze),
            landed={t.name: 0 for t, _ in landing} | {r["landed_in"]: r["n"] for r in landed},
            missing=by_problem.get("missing", Finding()) if all_must_land else Finding(),
            extra=by_problem.get("extra", Finding()),
            repeated=by_problem.get("repeated", Finding()),
        )

    def keyed_check(self, tables: ContractTables, key: str, topics: Sequence[str]) -> KeyedCheck:
        """One row per key; lineage and the contract's quarantine in bronze, never both."""
        coverage = self.coverage(
            tables.bronze,
            [(tables.silver, None), (QUARANTINE_TABLE, topics)],
            all_must_land=False,
        )
        if tables.silver not in self.tables:
            return KeyedCheck(coverage, 0, 0, [])
        silver = self._sql_names[tables.silver]
        duplicates = self._run(
            f'SELECT "{key}" AS k, COUNT(*) AS copies FROM {silver} GROUP BY "{key}"'
            " HAVING COUNT(*) > 1 ORDER BY k"
        ).column("k")
        rows = self._run(f"SELECT COUNT(*) AS n FROM {silver}").column("n")[0].as_py()
        return KeyedCheck(coverage, int(rows), len(duplicates), duplicates.to_pylist()[:MAX_RANGES])

    def unique_keys(self, table: Table, key: Sequence[str]) -> UniqueKeyCheck:
        """Rows of a gold table that share their key with another (of a table keyed by
        Kafka coordinates, only the rows of the increments)."""
        name, columns = self._sql_names[table], ", ".join(key)
        if tuple(key) == COORDINATES:
            name = f"(SELECT * FROM {name} WHERE {self._increments}) AS g"
        duplicated = (
            f"SELECT {columns}, COUNT(*) AS copies FROM {name} GROUP BY {columns}"
            " HAVING COUNT(*) > 1"
        )
        totals = self._run(
            f"SELECT (SELECT COUNT(*) FROM {name}) AS row_count, COUNT(*) AS keys,"
            f" COALESCE(SUM(copies - 1), 0) AS extra_rows FROM ({duplicated}) AS d"
        ).to_pylist()[0]
        samples = self._run(
            f"{duplicated} ORDER BY copies DESC, {columns} LIMIT {MAX_RANGES}"
        ).to_pylist()
        return UniqueKeyCheck(
            table=table.name,
            key=list(key),
            rows=int(totals["row_count"]),
            duplicate_keys=int(totals["keys"]),
            extra_rows=int(totals["extra_rows"]),
            samples=[{k: plain(v) for k, v in s.items()} for s in samples],
        )

    def foreign_quarantine(self, known_topics: Sequence[str]) -> list[str]:
        """A problem for quarantine rows of a topic neither bronze table holds."""
        if QUARANTINE_TABLE not in self.tables or not known_topics:
            return []
        stray = self.count(QUARANTINE_TABLE, f"kafka_topic NOT IN ({_sql_list(known_topics)})")
        if not stray:
            return []
        return [f"{QUARANTINE_TABLE.name}: {stray} rows of topics neither bronze table holds"]


def _partition_offsets(
    table: Table,
    row: Mapping[str, Any],
    gaps: Sequence[OffsetRange],
    missing: Mapping[tuple[str, int], int],
    duplicates: Sequence[OffsetRange],
) -> PartitionOffsets:
    """One partition's offsets in bronze ``table`` from its ``row`` of the summary (first
    and last offset, rows, distinct offsets) and the table's gaps, missing offsets (those
    not recorded as holding no record) and repeated offsets."""
    absent = row["last_offset"] - row["first_offset"] + 1 - row["offsets"]
    lost = missing.get((row["kafka_topic"], row["kafka_partition"]), 0)
    return PartitionOffsets(
        table=table.name,
        topic=row["kafka_topic"],
        partition=row["kafka_partition"],
        first_offset=row["first_offset"],
        last_offset=row["last_offset"],
        rows=row["row_count"],
        missing_offsets=lost,
        duplicate_rows=row["row_count"] - row["offsets"],
        gaps=_of_partition(gaps, row),
        duplicates=_of_partition(duplicates, row),
        without_record=absent - lost,
    )


def increments_sql(increments: Increments) -> str:
    """A predicate on Kafka coordinates: within one of ``increments``' ranges."""
    ranges = [
        f"(kafka_topic = '{_sql_text(topic)}' AND kafka_partition = {partition}"
        f" AND kafka_offset >= {i.start} AND kafka_offset < {i.end})"
        for topic, partitions in sorted(increments.items())
        for partition, i in sorted(partitions.items())
        if i.end > i.start
    ]
    return f"({' OR '.join(ranges)})" if ranges else "FALSE"


def with_edges(
    partitions: Sequence[PartitionOffsets],
    increments: Increments,
    bronze: Mapping[str, Table],
    recorded: Sequence[OffsetRange] = (),
) -> list[PartitionOffsets]:
    """``partitions`` (bronze within ``increments``) with the gaps at the edges of each
    increment added: before the first offset present when the start is expected, and a
    whole increment absent. (Offsets after the last one present are the next check's
    start.) ``bronze`` maps each topic to its bronze table. Offsets within a
    ``recorded`` range (holding no record) are not a gap."""
    found = {(p.topic, p.partition): p for p in partitions}
    result = []
    for topic, by_partition in sorted(increments.items()):
        table = bronze[topic].name
        for partition, increment in sorted(by_partition.items()):
            present = found.pop((topic, partition), None)
            if present is None:
                if increment.expect_start and increment.end > increment.start:
                    whole = OffsetRange(topic, partition, increment.start, increment.end - 1)
                    gaps = uncovered(whole, recorded)
                    lost = sum(g.count for g in gaps)
                    if gaps:
                        result.append(
                            PartitionOffsets(
                                table, topic, partition, increment.start, increment.end - 1,
                                0, lost, 0, gaps, [], whole.count - lost,
                            )
                        )  # fmt: skip
                continue
            edge = OffsetRange(topic, partition, increment.start, present.first_offset - 1)
            if increment.expect_start and edge.count > 0:
                gaps = uncovered(edge, recorded)
                lost = sum(g.count for g in gaps)
                present = replace(
                    present,
                    missing_offsets=present.missing_offsets + lost,
                    gaps=[*gaps, *present.gaps],
                    without_record=present.without_record + edge.count - lost,
                )
            result.append(present)
    return result + list(found.values())


def merged(ranges: Sequence[OffsetRange]) -> list[OffsetRange]:
    """``ranges`` with those of one topic partition that overlap or touch made one."""
    result: list[OffsetRange] = []
    for r in sorted(ranges, key=lambda r: (r.topic, r.partition, r.first)):
        last = result[-1] if result else None
        if (
            last
            and (last.topic, last.partition) == (r.topic, r.partition)
            and (r.first <= last.last + 1)
        ):
            result[-1] = replace(last, last=max(last.last, r.last))
        else:
            result.append(OffsetRange(r.topic, r.partition, r.first, r.last))
    return result


def uncovered(gap: OffsetRange, recorded: Sequence[OffsetRange]) -> list[OffsetRange]:
    """The parts of ``gap`` no ``recorded`` range of its topic partition covers."""
    parts = []
    start = gap.first
    for r in merged([r for r in recorded if (r.topic, r.partition) == (gap.topic, gap.partition)]):
        if r.last < start or r.first > gap.last:
            continue
        if r.first > start:
            parts.append(replace(gap, first=start, last=r.first - 1))
        start = max(start, r.last + 1)
    if start <= gap.last:
        parts.append(replace(gap, first=start))
    return parts


def gaps_sql(source: str, limit: int, recorded: str | None = None) -> str:
    """Offsets absent between the first and the last present, per topic partition, as ranges
    ``first_offset``..``last_offset`` (a SQL statement over ``source``'s coordinates), less
    the ``recorded`` ranges (a subquery of offset ranges holding no record); at most
    ``limit`` ranges per topic partition."""
    return (
        "SELECT kafka_topic, kafka_partition, first_offset, last_offset FROM ("
        " SELECT *, ROW_NUMBER() OVER (PARTITION BY kafka_topic, kafka_partition"
        f" ORDER BY first_offset) AS nth FROM ({_gaps(source, recorded)}) AS g) AS numbered"
        f" WHERE nth <= {limit} ORDER BY kafka_topic, kafka_partition, first_offset"
    )


def missing_sql(source: str, recorded: str | None = None) -> str:
    """Offsets absent per topic partition (``missing``): the sum of `gaps_sql`'s ranges."""
    return (
        "SELECT kafka_topic, kafka_partition, SUM(last_offset - first_offset + 1) AS missing"
        f" FROM ({_gaps(source, recorded)}) AS g GROUP BY kafka_topic, kafka_partition"
    )


def _gaps(source: str, recorded: str | None) -> str:
    """The absent ranges: between each span of offsets present or recorded (clipped to the
    present ones' bounds) and the furthest offset the spans before it reach."""
    present = f"(SELECT DISTINCT kafka_topic, kafka_partition, kafka_offset FROM {source} AS s)"
    spans = (
        "SELECT kafka_topic, kafka_partition, kafka_offset AS first_offset,"
        f" kafka_offset AS last_offset FROM {present} AS p"
    )
    if recorded is not None:
        bounds = (
            "SELECT kafka_topic, kafka_partition, MIN(kafka_offset) AS lo,"
            f" MAX(kafka_offset) AS hi FROM {present} AS p GROUP BY kafka_topic, kafka_partition"
        )
        spans += (
            " UNION ALL SELECT r.kafka_topic, r.kafka_partition,"
            " GREATEST(r.first_offset, b.lo) AS first_offset,"
            f" LEAST(r.last_offset, b.hi) AS last_offset FROM {recorded} AS r JOIN ({bounds})"
            " AS b ON r.kafka_topic = b.kafka_topic AND r.kafka_partition = b.kafka_partition"
            " AND r.first_offset <= b.hi AND r.last_offset >= b.lo"
        )
    return (
        "SELECT kafka_topic, kafka_partition, reach + 1 AS first_offset,"
        " first_offset - 1 AS last_offset FROM ("
        " SELECT kafka_topic, kafka_partition, first_offset, MAX(last_offset) OVER"
        " (PARTITION BY kafka_topic, kafka_partition ORDER BY first_offset, last_offset"
        " ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach"
        f" FROM ({spans}) AS spans) AS reached WHERE first_offset > reach + 1"
    )


def repeated_sql(source: str, limit: int) -> str:
    """Offsets held by more than one row, as ranges of consecutive offsets."""
    repeated = (
        f"SELECT kafka_topic, kafka_partition, kafka_offset FROM {source} AS s"
        " GROUP BY kafka_topic, kafka_partition, kafka_offset HAVING COUNT(*) > 1"
    )
    return _as_ranges(f"SELECT 'repeated' AS problem, *, '' AS tables FROM ({repeated}) AS r") + (
        f" LIMIT {limit}"
    )


def coverage_sql(bronze: str, landed: str) -> str:
    """Coordinates breaking "each bronze record landed exactly once", as ranges per problem:
    ``missing`` (landed nowhere), ``extra`` (not in bronze), ``repeated`` (landed twice),
    with the tables they landed in (named only for the few in breach: an ordered
    aggregate over every record would cost seconds)."""
    on = " AND ".join(f"{{a}}.{c} = {{b}}.{c}" for c in COORDINATES)
    return _as_ranges(
        f"WITH bronze AS (SELECT DISTINCT kafka_topic, kafka_partition, kafka_offset FROM {bronze}"
        f" AS b), landed AS ({landed}),"
        " copies AS (SELECT kafka_topic, kafka_partition, kafka_offset, COUNT(*) AS copies"
        " FROM landed GROUP BY kafka_topic, kafka_partition, kafka_offset),"
        " breaches AS (SELECT CASE WHEN c.copies IS NULL THEN 'missing'"
        " WHEN b.kafka_offset IS NULL THEN 'extra' ELSE 'repeated' END AS problem,"
        " COALESCE(b.kafka_topic, c.kafka_topic) AS kafka_topic,"
        " COALESCE(b.kafka_partition, c.kafka_partition) AS kafka_partition,"
        " COALESCE(b.kafka_offset, c.kafka_offset) AS kafka_offset"
        f" FROM bronze AS b FULL OUTER JOIN copies AS c ON {on.format(a='b', b='c')}"
        " WHERE c.copies IS NULL OR b.kafka_offset IS NULL OR c.copies > 1)"
        " SELECT p.problem, p.kafka_topic, p.kafka_partition, p.kafka_offset,"
        " COALESCE(STRING_AGG(l.landed_in, ' + ' ORDER BY l.landed_in), '') AS tables"
        f" FROM breaches AS p LEFT JOIN landed AS l ON {on.format(a='p', b='l')}"
        " GROUP BY p.problem, p.kafka_topic, p.kafka_partition, p.kafka_offset"
    )


def _as_ranges(problems: str) -> str:
    """Rows (problem, coordinates, tables) merged into runs of consecutive offsets."""
    return (
        "SELECT problem, kafka_topic, kafka_partition, MIN(kafka_offset) AS first_offset,"
        " MAX(kafka_offset) AS last_offset, tables FROM ("
        " SELECT problem, kafka_topic, kafka_partition, kafka_offset, tables,"
        " kafka_offset - ROW_NUMBER() OVER (PARTITION BY problem, kafka_topic, kafka_partition,"
        " tables ORDER BY kafka_offset) AS run"
        f" FROM ({problems}) AS p) AS numbered"
        " GROUP BY problem, kafka_topic, kafka_partition, tables, run"
        " ORDER BY problem, kafka_topic, kafka_partition, first_offset"
    )


def _findings(ranges: pa.Table) -> dict[str, Finding]:
    by_problem: dict[str, list[OffsetRange]] = {}
    for row in ranges.to_pylist():
        by_problem.setdefault(row["problem"], []).append(_range(row))
    return {
        problem: Finding(sum(r.count for r in found), found[:MAX_RANGES])
        for problem, found in by_problem.items()
    }


def _ranges(rows: Iterable[Mapping[str, Any]]) -> list[OffsetRange]:
    return [_range(row) for row in rows]


def _range(row: Mapping[str, Any]) -> OffsetRange:
    return OffsetRange(
        row["kafka_topic"],
        row["kafka_partition"],
        row["first_offset"],
        row["last_offset"],
        row.get("tables") or "",
    )


def _of_partition(ranges: Sequence[OffsetRange], row: Mapping[str, Any]) -> list[OffsetRange]:
    return [
        r for r in ranges if (r.topic, r.partition) == (row["kafka_topic"], row["kafka_partition"])
    ]


def _topics(partitions: Sequence[PartitionOffsets], table: Table, configured: str) -> list[str]:
    return sorted({configured, *(p.topic for p in partitions if p.table == table.name)})


def _problems(
    bronze: Sequence[PartitionOffsets],
    checks: Mapping[str, tuple[ContractTables, ContractCheck]],
) -> list[str]:
    problems = []
    for p in bronze:
        where = f"{p.table} {p.topic}/{p.partition}"
        if p.missing_offsets:
            gaps = ", ".join(_offsets(g) for g in p.gaps[:5]) + (", …" if len(p.gaps) > 5 else "")
            problems.append(f"{where}: {p.missing_offsets} offsets missing (gaps: {gaps})")
        if p.duplicate_rows:
            problems.append(f"{where}: {p.duplicate_rows} duplicate rows")
    for tables, check in checks.values():
        label = tables.bronze.name
        if isinstance(check, KeyedCheck):
            coverage, landing = check.coverage, f"{tables.silver.name} or quarantine"
        else:
            coverage = check
            landing = f"{tables.silver.name}, quarantine or duplicates"
        for name, finding, meaning in (
            ("missing", coverage.missing, f"records of {label} landed in no table of {landing}"),
            ("extra", coverage.extra, f"rows of {landing} are not in {label}"),
            ("repeated", coverage.repeated, f"records of {label} landed more than once"),
        ):
            if finding.count:
                first = finding.ranges[0]
                problems.append(f"{name}: {finding.count} {meaning} (first: {first})")
        if isinstance(check, KeyedCheck) and check.duplicate_keys:
            sample = ", ".join(str(u) for u in check.duplicate_key_samples[:5])
            problems.append(
                f"{tables.silver.name}: {check.duplicate_keys} keys have more than one row"
                f" ({sample})"
            )
    return problems


def _gold_problems(gold: Sequence[UniqueKeyCheck]) -> list[str]:
    return [
        f"{g.table}: {g.duplicate_keys} keys ({', '.join(g.key)}) occur more than once "
        f"({g.extra_rows} extra rows; first: {g.samples[0] if g.samples else '-'})"
        for g in gold
        if g.duplicate_keys
    ]


def _offsets(r: OffsetRange) -> str:
    return str(r.first) if r.first == r.last else f"{r.first}-{r.last}"


def _with_counts(value: Any) -> Any:
    """asdict() output with each offset range's count added (a property, not a field)."""
    if isinstance(value, dict):
        result = {k: _with_counts(v) for k, v in value.items()}
        if {"first", "last", "topic", "partition"} <= result.keys():
            result["count"] = result["last"] - result["first"] + 1
        return result
    if isinstance(value, list):
        return [_with_counts(v) for v in value]
    return value


def _coverage_counts(coverage: Coverage, missing: bool = True) -> str:
    counts = [f"missing {coverage.missing.count}"] if missing else []
    counts += [f"extra {coverage.extra.count}", f"repeated {coverage.repeated.count}"]
    return ", ".join(counts)


def _landed(landed: Mapping[str, int]) -> str:
    return ", ".join(f"{name} {rows}" for name, rows in landed.items())


def _columns(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    table = [list(header), *[list(r) for r in rows]]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in table
    ]


def _sql_name(table: Table) -> str:
    return table.name.replace("/", "__")


def _sql_text(value: str) -> str:
    return value.replace("'", "''")


def _sql_list(values: Iterable[str]) -> str:
    return ", ".join(f"'{_sql_text(v)}'" for v in values)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
