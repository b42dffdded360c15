"""Delta table creation, idempotent appends and reads of a table's ``txn`` records."""

from __future__ import annotations

from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from service.tables import Table


def ensure_table(spark: SparkSession, uri: str, table: Table) -> None:
    """Create ``table`` empty at ``uri`` (its declared schema and properties) unless one exists."""
    if table.schema is None:
        raise ValueError(f"table {table.name} has no declared schema: its query creates it")
    builder = DeltaTable.createIfNotExists(spark).location(uri).addColumns(table.schema)
    if table.partition_by:
        builder = builder.partitionedBy(*table.partition_by)
    for key, value in table.properties.items():
        builder = builder.property(key, value)
    builder.execute()


def append_once(df: DataFrame, uri: str, txn_app_id: str, txn_version: int) -> None:
    """Append ``df`` to ``uri`` unless batch ``txn_version`` of ``txn_app_id`` is already in.

    Delta records (app id, version) in the same commit as the data and skips a write
    whose version is not above the recorded one, which makes a replayed batch a no-op.
    """
    (
        df.write.format("delta")
        .mode("append")
        .option("txnAppId", txn_app_id)
        .option("txnVersion", str(txn_version))
        .save(uri)
    )


def table_transactions(spark: SparkSession, uri: str) -> dict[str, int] | None:
    """The table's latest ``txn`` version per app id, or None if no Delta table is at ``uri``."""
    if not DeltaTable.isDeltaTable(spark, uri):
        return None
    jvm: Any = spark.sparkContext._jvm
    delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, uri)
    snapshot = delta_log.update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty())
    transactions = snapshot.transactions()
    iterator = transactions.iterator()
    result: dict[str, int] = {}
    while iterator.hasNext():
        pair = iterator.next()
        result[str(pair._1())] = int(pair._2())
    return result
