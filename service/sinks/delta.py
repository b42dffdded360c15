"""Delta table creation, idempotent appends and reads of a table's ``txn`` records."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType


def ensure_table(
    spark: SparkSession, uri: str, schema: StructType, partition_by: Sequence[str] = ()
) -> None:
    """Create an empty Delta table at ``uri`` with ``schema`` unless one exists."""
    builder = DeltaTable.createIfNotExists(spark).location(uri).addColumns(schema)
    if partition_by:
        builder = builder.partitionedBy(*partition_by)
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
