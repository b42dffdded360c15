"""Delta sink: idempotent appends by (txnAppId, txnVersion), and compaction by the writer."""

from __future__ import annotations

from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from service.sinks.delta import append_once, ensure_table, table_transactions
from service.tables import SENSOR_DUPLICATES_TABLE


def active_files(spark: SparkSession, uri: str) -> int:
    return len(spark.read.format("delta").load(uri).inputFiles())


def test_a_replayed_batch_is_skipped_and_small_files_are_compacted_after_the_write(
    spark: SparkSession, tmp_path: Path
) -> None:
    min_files = int(spark.conf.get("spark.databricks.delta.autoCompact.minNumFiles") or 0)
    uri = f"file:{tmp_path / 'duplicates'}"
    ensure_table(spark, uri, SENSOR_DUPLICATES_TABLE)
    schema = SENSOR_DUPLICATES_TABLE.schema
    assert schema is not None
    for batch in range(min_files):
        rows = [
            (f"e{batch}-{i}", "sensors", i, batch * 10 + i, None, None, None, None)
            for i in range(2)
        ]
        df = spark.createDataFrame(rows, schema).repartition(2)
        append_once(df, uri, "app", batch)
        append_once(df, uri, "app", batch)  # a replay of the same batch: skipped

    table = spark.read.format("delta").load(uri)
    operations = [r["operation"] for r in DeltaTable.forPath(spark, uri).history().collect()]

    assert 2 * min_files == table.count()
    assert {"app": min_files - 1} == table_transactions(spark, uri)
    assert "OPTIMIZE" in operations
    assert active_files(spark, uri) < min_files
