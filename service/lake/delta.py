"""Delta table creation, idempotent appends and reads of a table's ``txn`` records."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from delta.tables import DeltaTable
from deltalake import DeltaTable as RsTable
from deltalake import Schema
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from service.config import Location
from service.lake.jvm import java_class
from service.lake.object_files import ObjectFiles
from service.lake.tables import Table

_NO_PROPERTIES: Mapping[str, str] = MappingProxyType({})


def ensure_table(
    files: ObjectFiles,
    uri: str,
    table: Table,
    properties: Mapping[str, str] = _NO_PROPERTIES,
) -> None:
    """Create ``table`` empty at ``uri`` (its declared schema, partitioning and properties,
    and ``properties``) unless a table is there.

    delta-rs writes the first commit (protocol 1/2 and the metadata, as Spark's CREATE
    TABLE does) in a few requests and no Spark job, and its version checksum is written
    beside it as Spark's would be: without one, Spark's first read of the table rebuilds
    its state in a job, and `table_transactions` and `append_once` read the checksum.
    On S3 the commit is a conditional put: a table created meanwhile is not overwritten.
    """
    if table.schema is None:
        raise ValueError(f"table {table.name} has no declared schema: its query creates it")
    location = Location(uri)
    options = dict(files.delta_rs_options)
    if location.on_s3:
        options["AWS_CONDITIONAL_PUT"] = "etag"
    if RsTable.is_deltatable(location.for_delta_rs(), options):
        return
    RsTable.create(
        location.for_delta_rs(),
        Schema.from_json(table.schema.json()),
        mode="ignore",
        partition_by=list(table.partition_by) or None,
        configuration={**table.properties, **properties} or None,
        # Our own keys (the recorded contract) are no Delta table properties.
        raise_if_key_not_exists=False,
        storage_options=options,
    )
    log = f"{uri}/_delta_log/{0:020d}"
    commit = files.read_text(f"{log}.json")
    if commit is None:
        raise RuntimeError(f"{uri}: delta-rs created no version 0")
    files.write_text(f"{log}.crc", empty_table_checksum(commit))


def empty_table_checksum(commit: str) -> str:
    """The version checksum (the Delta protocol's Version Checksum File) of a table after
    ``commit``, its first, which added no files."""
    actions = [json.loads(line) for line in commit.splitlines() if line.strip()]
    checksum = {
        "tableSizeBytes": 0,
        "numFiles": 0,
        "numMetadata": 1,
        "numProtocol": 1,
        "setTransactions": [],
        "domainMetadata": [],
        "metadata": next(a["metaData"] for a in actions if "metaData" in a),
        "protocol": next(a["protocol"] for a in actions if "protocol" in a),
        "allFiles": [],
    }
    return json.dumps(checksum, separators=(",", ":"))


@dataclass(frozen=True)
class Commit:
    """A table version `append_once` committed and the files (Delta ``AddFile``s, py4j) it added."""

    version: int
    added: list[Any]


def append_once(
    df: DataFrame,
    uri: str,
    txn_app_id: str,
    txn_version: int,
    properties: Mapping[str, str] = _NO_PROPERTIES,
    committing: AbstractContextManager[None] | None = None,
    on_replay: Callable[[], object] | None = None,
) -> Commit | None:
    """Append ``df`` to ``uri`` unless batch ``txn_version`` of ``txn_app_id`` is already in.

    The commit records ``txn`` (app id, version) beside the data, exactly as Delta's
    ``txnAppId``/``txnVersion`` writer options do, and a version not above the recorded
    one is skipped: a replayed batch is a no-op. Delta's writer reads the recorded
    version by reconstructing the whole table state (three Spark jobs, ~0.4 s a
    commit on a small table, growing with it) although the version's checksum file
    already lists every ``txn``. This reads the checksum and commits through the
    same transaction API Delta's writer uses; without a checksum that lists them, or
    when ``df``'s columns differ from the table's, it is Delta's writer.

    An append that creates the table (a gold table's first) gives it ``properties``,
    the Delta table properties of its `Table`; Delta ignores them on an existing table.
    ``committing`` is entered around the Delta commit itself, after the files are
    written (a profile phase); only when this path commits.

    ``on_replay`` runs instead of the write when the batch was in already (a stateful
    query's batch must still run: Spark checks its state stores committed).

    Returns the commit, or None when the batch was in already or Delta's writer wrote it.
    """
    spark = df.sparkSession
    delta_log = java_class(spark, "org.apache.spark.sql.delta.DeltaLog")
    txn = delta_log.forTable(spark._jsparkSession, uri).startTransaction()
    committed = checksum_txn_version(txn.snapshot(), txn_app_id)
    if committed is None and on_replay is not None:
        committed = int(txn.txnVersion(txn_app_id))  # the table's state: the slow path only
    if committed is not None and committed >= txn_version:
        if on_replay is not None:
            on_replay()
        return None
    if committed is None or not _same_columns(df.schema, txn.metadata().schema().json()):
        _append_with_writer_options(df, uri, txn_app_id, txn_version, properties)
        return None
    # What `txn.txnVersion` records: a concurrent commit of this app id is a conflict.
    txn.readTxn().addOne(txn_app_id)
    files = txn.writeFiles(df._jdf)
    record = set_transaction(spark, txn_app_id, txn_version)
    # Delta 4.4's Write: the save mode, then eight optional fields a plain append leaves unset.
    unset = [java_class(spark, "scala.Option").empty()] * 8
    write = java_class(spark, "org.apache.spark.sql.delta.DeltaOperations$Write")(
        java_class(spark, "org.apache.spark.sql.SaveMode").Append, *unset
    )
    with committing or nullcontext():
        version = int(txn.commit(files.appended(record), write))
    added = [f for f in scala_items(files) if f.getClass().getSimpleName() == "AddFile"]
    return Commit(version, added)


def set_transaction(spark: SparkSession, txn_app_id: str, txn_version: int) -> Any:
    """The ``txn`` action (a Delta ``SetTransaction``, py4j) recording batch ``txn_version``
    of ``txn_app_id`` now."""
    now = java_class(spark, "java.lang.Long")(int(time.time() * 1000))
    return java_class(spark, "org.apache.spark.sql.delta.actions.SetTransaction")(
        txn_app_id, txn_version, java_class(spark, "scala.Some")(now)
    )


def files_frame(spark: SparkSession, delta_log: Any, snapshot: Any, files: list[Any]) -> DataFrame:
    """The rows of ``files`` (``AddFile``s, py4j) of ``snapshot`` (of ``delta_log``), as a
    Delta scan of that version reads them; no Spark job lists the table's files."""
    # Delta builds the scan in the thread's active session: ``spark``'s, not the default
    # session (adaptive execution on), when a driver's worker thread plans a MERGE.
    java_class(spark, "org.apache.spark.sql.classic.SparkSession").setActiveSession(
        spark._jsparkSession
    )
    none = java_class(spark, "scala.Option").empty()
    return DataFrame(
        delta_log.createDataFrame(snapshot, scala_seq(spark, files), False, none), spark
    )


def scala_seq(spark: SparkSession, items: list[Any]) -> Any:
    """A Scala ``Seq`` of py4j objects."""
    converters = java_class(spark, "scala.jdk.javaapi.CollectionConverters")
    return converters.asScala(java_class(spark, "java.util.ArrayList")(items)).toSeq()


def scala_items(collection: Any) -> list[Any]:
    """A Scala collection's elements (py4j)."""
    iterator = collection.iterator()
    result = []
    while iterator.hasNext():
        result.append(iterator.next())
    return result


def latest_snapshot(spark: SparkSession, uri: str) -> tuple[Any, Any]:
    """The ``DeltaLog`` of the table at ``uri`` and its latest snapshot (py4j): a listing
    of the log; the snapshot's state is reconstructed only when something asks for it."""
    delta_log = java_class(spark, "org.apache.spark.sql.delta.DeltaLog").forTable(
        spark._jsparkSession, uri
    )
    none = java_class(spark, "scala.Option").empty()
    return delta_log, delta_log.update(False, none, none)


def checksum_txn_version(snapshot: Any, txn_app_id: str) -> int | None:
    """The app id's recorded version per the snapshot's checksum (-1: none), None if unknown."""
    recorded = _checksum_transactions(snapshot)
    return None if recorded is None else recorded.get(txn_app_id, -1)


def checksum_files(snapshot: Any) -> list[Any] | None:
    """The live files (``AddFile``s, py4j) that the snapshot's checksum file lists, None if
    it has none: Delta writes them there while a table has few files
    (``spark.databricks.delta.allFilesInCrc.*``), not for a table another writer made."""
    checksum = snapshot.checksumOpt()
    if checksum.isEmpty() or checksum.get().allFiles().isEmpty():
        return None
    return scala_items(checksum.get().allFiles().get())


def _checksum_transactions(snapshot: Any) -> dict[str, int] | None:
    """Every app id's recorded version per the snapshot's checksum file, None if it has none
    (no checksum, or one written without them): reading it runs no Spark job."""
    checksum = snapshot.checksumOpt()
    if checksum.isEmpty() or checksum.get().setTransactions().isEmpty():
        return None
    recorded = scala_items(checksum.get().setTransactions().get())
    return {str(action.appId()): int(action.version()) for action in recorded}


def _same_columns(schema: StructType, table_schema_json: str) -> bool:
    """Whether ``schema`` has the table's column names and types in its order (nullability
    aside: the table's NOT NULL constraints are checked by the write)."""
    return bool(_shape(schema.jsonValue()) == _shape(json.loads(table_schema_json)))


def _shape(value: Any) -> Any:
    """A schema's JSON without nullability and column metadata."""
    if isinstance(value, dict):
        return {
            k: _shape(v)
            for k, v in value.items()
            if k not in ("nullable", "containsNull", "valueContainsNull", "metadata")
        }
    if isinstance(value, list):
        return [_shape(v) for v in value]
    return value


def _append_with_writer_options(
    df: DataFrame, uri: str, txn_app_id: str, txn_version: int, properties: Mapping[str, str]
) -> None:
    (
        df.write.format("delta")
        .mode("append")
        .options(**properties)  # `delta.*` options: the properties of a table this creates
        .option("txnAppId", txn_app_id)
        .option("txnVersion", str(txn_version))
        .save(uri)
    )


def table_transactions(spark: SparkSession, uri: str) -> dict[str, int] | None:
    """The table's latest ``txn`` version per app id, or None if no Delta table is at ``uri``.

    From the version's checksum file when it lists them (as `append_once` reads it);
    otherwise from the table state, which reconstructing costs a Spark job (~1 s).
    """
    if not DeltaTable.isDeltaTable(spark, uri):
        return None
    _, snapshot = latest_snapshot(spark, uri)
    recorded = _checksum_transactions(snapshot)
    if recorded is not None:
        return recorded
    return {str(pair._1()): int(pair._2()) for pair in scala_items(snapshot.transactions())}
