"""An idempotent MERGE into a Delta table (`merge_once`): a batch's rows merged under the
batch's ``txnAppId``/``txnVersion``, so that Delta skips a replayed batch as a whole.

Used for the upserts of a keyed silver table (`service.ingest.modes.entities`, whose
clauses make the merged state independent of the order of the changes) and by
``promote``. A small batch, whose keys the driver knows, is merged without Delta's MERGE:
the files holding its keys (a small table's every file, in the one Spark job that writes
them) are rewritten and committed as the MERGE would commit them (`merge_once`'s
``touching``), at a third of its cost or less.
"""

from __future__ import annotations

import functools
import json
import operator
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from service.lake.delta import (
    append_once,
    checksum_files,
    checksum_txn_version,
    files_frame,
    latest_snapshot,
    scala_items,
    scala_seq,
    set_transaction,
)
from service.lake.jvm import java_class

_TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"
_MATERIALIZE_SOURCE = "spark.databricks.delta.merge.materializeSource"
_FAIL_CACHED_SOURCE = "spark.databricks.delta.merge.failSourceCachedAfterMaterialization"
# A table whose live files hold at most this many bytes is merged in one pass (every file
# rewritten, the counts taken as it is written): a pass to find the touched files costs a
# Spark job, more than rewriting a few MiB (a compacted table's one file is touched anyway).
ONE_PASS_BYTES = 2 * 1024 * 1024

# (join condition, update condition, update set, insert values) of a MERGE.
MergeClauses = tuple[str, str, dict[str, str | Column], dict[str, str | Column]]


def _value(value: str | Column | None) -> Column:
    if value is None:
        return F.lit(None)
    return F.expr(value) if isinstance(value, str) else value


def merge_once(
    rows: DataFrame,
    uri: str,
    txn_app_id: str,
    txn_version: int,
    clauses: MergeClauses,
    touching: Column | None = None,
) -> None:
    """MERGE ``rows`` (one row per target row, aliased ``s``) into the table at
    ``uri`` with ``clauses``: (join condition, update condition, update set, insert values;
    without insert values, update only).

    Delta reads the txn pair from the session conf; it is set on the DataFrame's
    own session (inside ``foreachBatch``, the query's) and unset afterwards,
    because Delta 4.0 does not reset it by default and any later write from the
    session would carry it.

    Delta would first copy a source that is not a Delta scan, so that its two passes
    (find the touched files, rewrite them) see the same rows. Ours is a deterministic
    aggregate of the batch's cached rows, read again from the same Kafka offsets if a
    cached block is lost: the copy (one more job per batch) is skipped. Delta 4.4 refuses
    a cached source it did not copy, for a cache of a Delta table that a concurrent write
    may change under it; ours caches Kafka records, so that check is off for the MERGE.

    Into a table without a file (a new lake's first batch) every row is an insert: the
    rows the MERGE would insert are appended under the same txn (`append_once`), without
    the MERGE's join and its jobs: a first batch of 50 users on a cold driver wrote silver
    in 4.1-5.3 s and 6 jobs against 6.5 s and 7.

    ``touching``, when given, is a predicate over the table's rows that holds for every row
    a row of ``rows`` matches (a small batch's keys, `service.ingest.modes.entities`): the
    files holding such rows are rewritten by `_Rewrite`, without Delta's MERGE.
    """
    planned = plan_merge(rows, uri, txn_app_id, txn_version, clauses, touching is not None)
    planned(touching)


# `plan_merge`'s merge, run with the batch's ``touching`` predicate (or None).
PlannedMerge = Callable[[Column | None], None]


def plan_merge(
    rows: DataFrame,
    uri: str,
    txn_app_id: str,
    txn_version: int,
    clauses: MergeClauses,
    small: bool,
) -> PlannedMerge:
    """`merge_once` of ``rows`` up to its first Spark job (the log listed, and for a
    ``small`` batch the transaction started and a small table's rewrite planned: py4j calls
    and analysis), and what runs the rest given its ``touching``: a driver plans a small
    users batch's MERGE while its summary's job runs."""
    insert = clauses[3]
    session = rows.sparkSession
    delta_log, snapshot = latest_snapshot(session, uri)
    if insert and _file_count(snapshot) == 0:
        schema = StructType.fromJson(json.loads(snapshot.metadata().schema().json()))
        inserted = rows.alias("s").select(*_assigned(insert, schema))

        def append(_: Column | None) -> None:
            append_once(inserted, uri, txn_app_id, txn_version)

        return append
    rewrite = (
        _Rewrite.plan(rows, delta_log, snapshot, txn_app_id, txn_version, clauses)
        if small
        else None
    )

    def run(touching: Column | None) -> None:
        if rewrite is None or not rewrite.run(touching):
            _delta_merge(rows, uri, txn_app_id, txn_version, clauses)

    return run


def _delta_merge(
    rows: DataFrame, uri: str, txn_app_id: str, txn_version: int, clauses: MergeClauses
) -> None:
    """Delta's MERGE of ``rows`` under the txn (`merge_once`)."""
    on, changed, update, insert = clauses
    session = rows.sparkSession
    target = DeltaTable.forPath(session, uri)
    session.conf.set(_TXN_APP_ID, txn_app_id)
    session.conf.set(_TXN_VERSION, str(txn_version))
    session.conf.set(_MATERIALIZE_SOURCE, "none")
    session.conf.set(_FAIL_CACHED_SOURCE, "false")
    try:
        merge = (
            target.alias("t")
            .merge(rows.alias("s"), on)
            .whenMatchedUpdate(condition=changed, set=update)
        )
        if insert:
            merge = merge.whenNotMatchedInsert(values=insert)
        merge.execute()
    finally:
        session.conf.unset(_TXN_APP_ID)
        session.conf.unset(_TXN_VERSION)
        session.conf.unset(_MATERIALIZE_SOURCE)
        session.conf.unset(_FAIL_CACHED_SOURCE)


@dataclass
class _Rewrite:
    """`merge_once` of ``rows`` as Delta's MERGE would commit it: the files holding a row
    that a row of ``rows`` matches (among those ``touching`` holds for), found in a Spark
    job of their own (`_touched_files`) unless the table is small (`ONE_PASS_BYTES`: then
    all of them, planned with the transaction); those files' rows joined with ``rows``,
    the clauses applied, written as one file and committed with the touched files removed
    and the txn, as a ``MERGE`` with its metrics. The transaction reads the snapshot
    `plan_merge` listed the log for: a concurrent commit after it is Delta's conflict
    check's.

    Delta's MERGE of a few rows reconstructs the table's state first (three Spark jobs) and
    analyses a plan per pass: 3.7-4.4 s for 10 users into 1,000 on an idle warm driver,
    against 0.9-1.1 s here (`deploy/bench/merge_bench.py`).
    """

    source: DataFrame
    delta_log: Any
    txn: Any
    live: list[Any]
    schema: StructType
    txn_app_id: str
    txn_version: int
    clauses: MergeClauses
    committed: bool
    # A small table's: every file, and the rewrite's rows counting the MERGE's as they go.
    touched: list[Any] | None = None
    merged: DataFrame | None = None
    counters: dict[str, _Counter] = field(default_factory=dict)
    # Seconds `plan` took.
    planning: float = 0.0

    @classmethod
    def plan(
        cls,
        rows: DataFrame,
        delta_log: Any,
        latest: Any,
        txn_app_id: str,
        txn_version: int,
        clauses: MergeClauses,
    ) -> _Rewrite | None:
        """The rewrite planned on ``latest``, or None when it cannot be: without a checksum
        that lists the table's files and txns, with deletion vectors, or with a clause that
        sets a column the table lacks (Delta's MERGE refuses it)."""
        started = time.monotonic()
        spark = rows.sparkSession
        option = java_class(spark, "scala.Option")
        txn = delta_log.startTransaction(option.empty(), option.apply(latest))
        snapshot = txn.snapshot()
        committed = checksum_txn_version(snapshot, txn_app_id)
        live = checksum_files(snapshot)
        schema = StructType.fromJson(json.loads(snapshot.metadata().schema().json()))
        _, _, update, insert = clauses
        if (
            committed is None
            or live is None
            or any(f.deletionVector() is not None for f in live)
            or not {*update, *insert} <= set(schema.fieldNames())
        ):
            return None
        source = rows.select("*", F.lit(True).alias("_source")).alias("s")
        rewrite = cls(
            source, delta_log, txn, live, schema, txn_app_id, txn_version, clauses,
            committed >= txn_version,
        )  # fmt: skip
        if not rewrite.committed and sum(int(f.size()) for f in live) <= ONE_PASS_BYTES:
            rewrite.touched = live
            rewrite.counters = _counters(spark, ("source", "updated", "inserted"))
            rewrite.merged = rewrite._merged(live)
        rewrite.planning = time.monotonic() - started
        return rewrite

    def _merged(self, touched: list[Any]) -> DataFrame | None:
        """`_merged` of the source into the ``touched`` files' rows."""
        spark = self.source.sparkSession
        snapshot = self.txn.snapshot()
        target = files_frame(spark, self.delta_log, snapshot, touched) if touched else None
        return _merged(self.source, target, self.clauses, self.schema, self.counters)

    def run(self, touching: Column | None) -> bool:
        """Write and commit the rewrite (finding the touched files with ``touching`` first,
        unless the table is small); False, and nothing done, when it cannot: a large table
        without ``touching``, or a matched row's file not among the checksum's."""
        if self.committed:
            return True
        # The MERGE's times count its planning, not the wait between planning and running.
        started = time.monotonic() - self.planning
        spark = self.source.sparkSession
        found: dict[str, Any] = {}
        if self.touched is None:
            if touching is None:
                return False
            snapshot = self.txn.snapshot()
            touched, found = _touched_files(
                self.source, self.delta_log, snapshot, self.live, self.clauses[0],
                self.clauses[1], touching,
            )  # fmt: skip
            if len(touched) != len(found["files"]):
                return False
            self.touched, self.merged = touched, self._merged(touched)
        scanned = time.monotonic()
        txn = self.txn
        txn.readWholeTable()
        txn.readTxn().addOne(self.txn_app_id)
        merged = self.merged
        written = scala_items(txn.writeFiles(merged.coalesce(1)._jdf)) if merged is not None else []
        counts = {n: c.value() for n, c in self.counters.items()} if self.counters else found
        txn.registerSQLMetrics(
            spark._jsparkSession,
            _metrics(
                spark,
                _merge_metrics(
                    counts,
                    bool(self.clauses[3]),
                    txn.getMetric("numOutputRows"),
                    written,
                    self.touched,
                    (started, scanned, time.monotonic()),
                ),
            ),
        )
        record = set_transaction(spark, self.txn_app_id, self.txn_version)
        actions = [*written, *(f.remove() for f in self.touched), record]
        txn.commit(scala_seq(spark, actions), _merge_operation(spark, self.clauses))
        return True


def _touched_files(
    source: DataFrame,
    delta_log: Any,
    snapshot: Any,
    live: list[Any],
    on: str,
    changed: str,
    touching: Column,
) -> tuple[list[Any], dict[str, Any]]:
    """The ``live`` files (of ``snapshot``) that hold a row ``source`` matches (``on``,
    among the rows ``touching`` holds for), and the counts of the MERGE (``source``,
    ``updated`` with ``changed``, ``inserted``) with the matched rows' file names
    (``files``): one Spark job."""
    spark = source.sparkSession
    candidates = files_frame(spark, delta_log, snapshot, live).where(touching)
    found = _joined(candidates.withColumn("_file", F.col("_metadata.file_name")), source, on)
    in_target, in_source, updated = _sides(changed)
    # A global aggregate's one row, collected in one job (``first`` may run several).
    [row] = found.agg(
        F.collect_set("t._file").alias("files"),
        F.count_if(in_source).alias("source"),
        F.count_if(updated).alias("updated"),
        F.count_if(in_source & ~in_target).alias("inserted"),
    ).collect()
    names = set(row["files"])
    touched = [f for f in live if unquote(str(f.path())).rsplit("/", 1)[-1] in names]
    return touched, row.asDict()


def _merge_metrics(
    counts: dict[str, Any],
    insert: bool,
    output: Any,
    written: list[Any],
    touched: list[Any],
    times: tuple[float, float, float],
) -> dict[str, int | None]:
    """The SQL metrics Delta's MERGE reports, of `_Rewrite`'s ``counts`` (the
    source rows, the updated and the inserted), ``output`` (the write's output rows, a
    Scala option), the ``written`` and ``touched`` files and its (start, scanned, end)
    ``times`` (monotonic seconds)."""
    started, scanned, now = times
    inserted = counts["inserted"] if insert else 0
    return {
        "operationNumSourceRows": counts["source"],
        "numTargetRowsInserted": inserted,
        "numTargetRowsUpdated": counts["updated"],
        "numTargetRowsMatchedUpdated": counts["updated"],
        "numTargetRowsCopied": (
            output.get().value() - counts["updated"] - inserted if output.isDefined() else None
        ),
        "numTargetRowsDeleted": 0,
        "numTargetFilesAdded": len(written),
        "numTargetFilesRemoved": len(touched),
        "numTargetBytesAdded": sum(int(f.size()) for f in written),
        "numTargetBytesRemoved": sum(int(f.size()) for f in touched),
        "executionTimeMs": round((now - started) * 1000),
        "scanTimeMs": round((scanned - started) * 1000),
        "rewriteTimeMs": round((now - scanned) * 1000),
    }


def _file_count(snapshot: Any) -> int:
    """The number of live files of ``snapshot``: its checksum's, else from its state (which
    Delta reconstructs in three Spark jobs)."""
    checksum = snapshot.checksumOpt()
    return int(snapshot.numOfFiles() if checksum.isEmpty() else checksum.get().numFiles())


def _joined(target: DataFrame, source: DataFrame, on: str) -> DataFrame:
    """``target``'s rows (aliased ``t``, marked ``_target``) full-outer joined with ``source``
    (aliased ``s``, marked ``_source``) on the MERGE's condition ``on``."""
    marked = target.select("*", F.lit(True).alias("_target")).alias("t")
    return marked.join(source, F.expr(on), "full_outer")


def _sides(changed: str) -> tuple[Column, Column, Column]:
    """Over `_joined` rows: whether a target row is in it, whether a source row is, and
    whether both are and the update condition ``changed`` holds (a null condition does
    not, as in Delta's MERGE)."""
    in_target, in_source = F.col("t._target").isNotNull(), F.col("s._source").isNotNull()
    return in_target, in_source, in_target & in_source & F.coalesce(F.expr(changed), F.lit(False))


def _merged(
    source: DataFrame,
    target: DataFrame | None,
    clauses: MergeClauses,
    schema: StructType,
    counters: dict[str, _Counter],
) -> DataFrame | None:
    """The rows (``schema``) that replace ``target``'s (a table's rows) when ``source``
    (aliased ``s``, marked ``_source``) is merged into them with ``clauses``: every target
    row, updated where it matches and the update condition holds, and the inserts of the
    source rows matching none; None when there are none (no target, no insert). The
    ``counters`` given (`_counters`: ``source``, ``updated``, ``inserted``) count the
    joined rows of each kind as the rows are computed."""
    on, changed, update, insert = clauses
    if target is None:
        return source.select(*_assigned(insert, schema)) if insert else None
    in_target, in_source, updated = _sides(changed)
    joined = _joined(target, source, on)
    if counters:
        kinds = {"source": in_source, "updated": updated, "inserted": in_source & ~in_target}
        counting = [F.when(kinds[n], c.column).otherwise(True) for n, c in counters.items()]
        joined = joined.where(functools.reduce(operator.and_, counting))
    kept = {f.name: F.col(f"t.{f.name}") for f in schema.fields}
    columns = [
        F.when(updated, _value(update.get(f.name, kept[f.name])))
        .when(in_target, kept[f.name])
        .otherwise(_value(insert.get(f.name)))
        .cast(f.dataType)
        .alias(f.name)
        for f in schema.fields
    ]
    return joined.where(in_target | F.lit(bool(insert))).select(*columns)


@dataclass(frozen=True)
class _Counter:
    """A SQL metric (py4j) and a column (always true) that adds one to it per row it is
    computed for: Delta's ``IncrementMetric``, as its MERGE counts its rows."""

    metric: Any
    column: Column

    def value(self) -> int:
        """What the counter holds (its column's rows, once computed)."""
        return int(self.metric.value())


def _counters(spark: SparkSession, names: tuple[str, ...]) -> dict[str, _Counter]:
    """A new `_Counter` per name."""
    metrics = java_class(spark, "org.apache.spark.sql.execution.metric.SQLMetrics")
    true = getattr(
        java_class(spark, "org.apache.spark.sql.catalyst.expressions.Literal$"), "MODULE$"
    )
    counters = {}
    for name in names:
        metric = metrics.createMetric(spark.sparkContext._jsc.sc(), name)
        expression = java_class(spark, "org.apache.spark.sql.delta.metric.IncrementMetric")(
            true.apply(True), metric
        )
        node = java_class(spark, "org.apache.spark.sql.classic.ExpressionColumnNode").apply(
            expression
        )
        counters[name] = _Counter(
            metric, Column(java_class(spark, "org.apache.spark.sql.Column")(node))
        )
    return counters


def _metrics(spark: SparkSession, values: dict[str, int | None]) -> Any:
    """A Scala map of SQL metrics (py4j) holding ``values`` (those known)."""
    metrics = java_class(spark, "org.apache.spark.sql.execution.metric.SQLMetrics")
    tuple_ = java_class(spark, "scala.Tuple2")
    pairs = []
    for name, value in values.items():
        if value is not None:
            metric = metrics.createMetric(spark.sparkContext._jsc.sc(), name)
            metric.set(int(value))
            pairs.append(tuple_(name, metric))
    scala_map = getattr(java_class(spark, "scala.collection.immutable.Map$"), "MODULE$")
    return getattr(scala_map, "from")(scala_seq(spark, pairs))


def _assigned(values: dict[str, str | Column], schema: StructType) -> list[Column]:
    """``values`` as ``schema``'s columns (a column without one is null)."""
    return [_value(values.get(f.name)).cast(f.dataType).alias(f.name) for f in schema.fields]


def _merge_operation(spark: SparkSession, clauses: MergeClauses) -> Any:
    """Delta's ``MERGE`` operation of ``clauses``, as its history records one (the
    join condition, an update when matched and the condition holds, an insert when not)."""
    on, changed, _, insert = clauses
    option = java_class(spark, "scala.Option")
    condition = spark._jsparkSession.sessionState().sqlParser().parseExpression(on)
    predicate = java_class(spark, "org.apache.spark.sql.delta.DeltaOperations$MergePredicate")
    matched = [predicate(option.apply(changed), "update")]
    not_matched = [predicate(option.empty(), "insert")] if insert else []
    return java_class(spark, "org.apache.spark.sql.delta.DeltaOperations$Merge")(
        option.apply(condition),
        option.empty(),
        option.empty(),
        option.empty(),
        scala_seq(spark, matched),
        scala_seq(spark, not_matched),
        scala_seq(spark, []),
    )
