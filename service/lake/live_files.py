"""Reads of a table's recent rows, planned from the live files its one writer keeps.

A Delta read lists the files of the table's latest version from the table's state,
which Delta reconstructs for every new version (three Spark jobs, 0.3 to 1 s however
few rows are wanted). silver/sensor_readings has one writer, the sensors ingest
query, and it reads silver's recent arrivals every batch (dedup): `LiveFiles` keeps
the table's live files between batches, with each file's bounds of one timestamp
column from its statistics, adds the files of the writer's own commits, and reads
exactly the files whose bounds meet the wanted range. When the table's version is not
the one kept (a start, maintenance, auto-compaction, a replay, any other writer), the
files are loaded again: from the version's checksum file, where Delta lists a small
table's files, else from the table's state, as a plain read would list them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from service.lake.delta import Commit, checksum_files, files_frame, latest_snapshot

# An arrival range [start, end], UTC.
Window = tuple[datetime, datetime]
# Delta writes timestamp statistics truncated to the millisecond.
_STATS_PRECISION = timedelta(milliseconds=1)


@dataclass(frozen=True)
class _File:
    """A live file (its Delta ``AddFile``, py4j) and its column bounds, None when unknown."""

    action: Any
    low: datetime | None
    high: datetime | None

    def may_hold(self, start: datetime, end: datetime | None) -> bool:
        """Whether the file may hold a value in ``[start, end]`` (both UTC; no end: none)."""
        if self.low is None or self.high is None:
            return True
        return (end is None or self.low <= end) and self.high + _STATS_PRECISION >= start


class LiveFiles:
    """The live files of the Delta table at ``uri`` and the bounds of its ``column``.

    Used by the table's writer, one batch at a time: `read` before its commit,
    `committed` after it.
    """

    def __init__(self, uri: str, column: str) -> None:
        self.uri = uri
        self.column = column
        self._version: int | None = None
        # None when a live file has deletion vectors: reads are then Delta's own.
        self._files: list[_File] | None = []

    def read(
        self,
        spark: SparkSession,
        start: datetime,
        end: datetime | None,
        near: Sequence[Window] | None = None,
    ) -> DataFrame:
        """The table's rows whose ``column`` lies in ``[start, end]`` (no end: from ``start``
        on), at its latest version; with ``near`` (UTC windows), only those of the files that
        may hold a value in one of them. Naive datetimes are local time, as PySpark takes
        them.
        """
        delta_log, snapshot = self._latest(spark)
        since = F.col(self.column) >= F.lit(start)
        window = since if end is None else since & (F.col(self.column) <= F.lit(end))
        if self._files is None:
            return spark.read.format("delta").load(self.uri).where(window)
        low, high = start.astimezone(UTC), None if end is None else end.astimezone(UTC)
        chosen = [
            file.action
            for file in self._files
            if file.may_hold(low, high)
            and (near is None or any(file.may_hold(*window) for window in near))
        ]
        return files_frame(spark, delta_log, snapshot, chosen).where(window)

    def holds_none(self, start: datetime, end: datetime | None) -> bool:
        """Whether the statistics of the files kept (of the version `version` or `read`
        saw last) rule out a row whose ``column`` lies in ``[start, end]`` (both UTC; no
        end: from ``start`` on): a read would then run Spark jobs to return no row."""
        if self._files is None or self._version is None:
            return False
        return not any(file.may_hold(start, end) for file in self._files)

    def version(self, spark: SparkSession) -> int:
        """The table's latest version (its files are kept for it)."""
        return int(self._latest(spark)[1].version())

    def _latest(self, spark: SparkSession) -> tuple[Any, Any]:
        """The table's ``DeltaLog`` and latest snapshot, its files kept for that version."""
        delta_log, snapshot = latest_snapshot(spark, self.uri)
        if int(snapshot.version()) != self._version:
            self._load(snapshot)
        return delta_log, snapshot

    def committed(self, commit: Commit | None) -> None:
        """The writer's `append_once` returned ``commit``: keep its files if it is the next
        version of the one kept (otherwise the next `read` loads the table's files)."""
        if commit is None or self._files is None or self._version is None:
            return
        if commit.version == self._version + 1:
            self._files.extend(self._file(action) for action in commit.added)
            self._version = commit.version

    def _load(self, snapshot: Any) -> None:
        """Keep the live files of ``snapshot``: those its checksum lists (no Spark job),
        else one reconstruction of its state (a Spark job, ~3 s in a driver's first)."""
        self._version = int(snapshot.version())
        actions = checksum_files(snapshot)
        if actions is None:
            listed = snapshot.allFiles().collectAsList()
            actions = [listed.get(i) for i in range(listed.size())]
        files: list[_File] = []
        for action in actions:
            if action.deletionVector() is not None:
                self._files = None
                return
            files.append(self._file(action))
        self._files = files

    def _file(self, action: Any) -> _File:
        stats = action.stats()
        if stats is None:
            return _File(action, None, None)
        parsed = json.loads(stats)
        low = parsed.get("minValues", {}).get(self.column)
        high = parsed.get("maxValues", {}).get(self.column)
        if low is None or high is None:
            return _File(action, None, None)
        return _File(action, _utc(low), _utc(high))


def _utc(text: str) -> datetime:
    """A timestamp of Delta's statistics (ISO 8601 with an offset) in UTC."""
    return datetime.fromisoformat(text).astimezone(UTC)
