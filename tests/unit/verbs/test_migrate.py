"""Tables of the earlier layout (raw key/value as STRING): refused at start, then migrated."""

from __future__ import annotations

import shutil
from datetime import datetime
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from service.__main__ import main
from service.config import Settings
from service.errors import CheckpointMismatchError, TableLayoutError
from service.ingest.query import IngestQuery
from service.lake.checkpoints import app_id
from service.lake.delta import append_once, ensure_table, table_transactions
from service.lake.hadoop_fs import HadoopFiles
from service.lake.schemas import BRONZE, KAFKA_HEADERS, LINEAGE
from service.lake.tables import (
    BRONZE_SENSORS,
    OFFSET_GAPS_TABLE,
    QUARANTINE_TABLE,
    SENSOR_DUPLICATES_TABLE,
    SENSOR_READINGS,
    SHIPPED,
)
from service.streaming.runner import check_tables, checkpoint_location
from service.verbs.migrate import migrate_tables
from tests.support.lake import LOCAL_FILES

AT = datetime(2026, 11, 1, 12, 0, 0)
# bronze before the raw columns became BINARY (docs/tables.md).
TEXT_BRONZE = StructType(
    [
        StructField("key", StringType()),
        StructField("value", StringType()),
        *LINEAGE,
        StructField("headers", KAFKA_HEADERS),
        BRONZE["ingested_at"],
    ]
)
NOT_UTF8 = b'{"a": "\xff"}'


def test_an_earlier_layout_is_refused_then_migrated_in_place(
    spark: SparkSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("INGEST_STORAGE_ROOT", str(tmp_path / "lake"))
    settings = Settings(storage_root=str(tmp_path / "lake"))
    uri = BRONZE_SENSORS.uri(settings.storage_uri)
    rows = [("d1", '{"event_id": "e"}', "sensors", 0, 0, AT, None, AT)]
    old = spark.createDataFrame([*rows, ("d2", "x", "sensors", 0, 1, AT, None, AT)], TEXT_BRONZE)
    # The earlier layout kept invalid UTF-8 in a STRING column: put those bytes there.
    old = old.withColumn(
        "value",
        F.when(F.col("kafka_offset") == 1, F.unhex(F.lit(NOT_UTF8.hex())).cast("string")).otherwise(
            F.col("value")
        ),
    )
    append_once(old, uri, "ingest_sensors-app", 7)

    with pytest.raises(TableLayoutError) as refused:
        check_tables(spark, settings, "ingest_sensors", BRONZE_SENSORS_TABLES)
    assert "bronze/sensors" in str(refused.value)
    assert "value string, expected binary" in str(refused.value)
    assert "lakehouse-ingest migrate" in str(refused.value)

    # The verb: under the driver lease, in the process's Spark session.
    assert 0 == main(["migrate"])
    assert "migrated: bronze/sensors\n" == capsys.readouterr().out

    table = spark.read.format("delta").load(uri)
    assert [] == BRONZE_SENSORS.layout_differences(table.schema)
    got = sorted(
        (r.kafka_offset, bytes(r.key), bytes(r.value), r.key_text, r.value_text)
        for r in table.collect()
    )
    assert [
        (0, b"d1", b'{"event_id": "e"}', "d1", '{"event_id": "e"}'),
        (1, b"d2", NOT_UTF8, "d2", None),
    ] == got
    # The table's declared properties are set (it was created without them).
    (detail,) = DeltaTable.forPath(spark, uri).detail().collect()
    assert BRONZE_SENSORS.properties.items() <= detail["properties"].items()
    # The exactly-once bookkeeping survives the rewrite; a second run has nothing to do.
    assert {"ingest_sensors-app": 7} == table_transactions(spark, uri)
    assert [] == migrate_tables(spark, settings)
    assert 0 == main(["migrate"])
    assert "nothing to migrate\n" == capsys.readouterr().out


BRONZE_SENSORS_TABLES = (BRONZE_SENSORS, QUARANTINE_TABLE, SENSOR_READINGS)


def test_a_lake_of_the_release_before_offset_gaps_starts_and_gets_the_table(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A checkpoint with committed batches and every table of its query but
    bronze/offset_gaps (added by a later release): the start creates it, refuses nothing;
    a missing table the query always had is still refused."""
    settings = Settings(storage_root=str(tmp_path / "lake"))
    checkpoint = checkpoint_location(settings, "ingest_sensors")
    files = HadoopFiles(spark)
    meta = '{"batchWatermarkMs":0,"batchTimestampMs":1700000000000,"conf":{}}'
    files.write_text(f"{checkpoint}/metadata", '{"id":"q-1"}')
    files.write_text(f"{checkpoint}/offsets/0", f'v1\n{meta}\n{{"sensors":{{"0":5}}}}')
    files.write_text(f"{checkpoint}/commits/0", 'v1\n{"nextBatchWatermarkMs":0}')
    query = IngestQuery(SHIPPED.contracts["sensors"])
    bronze = spark.createDataFrame([], BRONZE)
    append_once(
        bronze, BRONZE_SENSORS.uri(settings.storage_uri), app_id("ingest_sensors", "q-1"), 0
    )
    for table in query.tables[1:]:
        if table != OFFSET_GAPS_TABLE:
            ensure_table(LOCAL_FILES, table.uri(settings.storage_uri), table)

    assert [OFFSET_GAPS_TABLE] == check_tables(spark, settings, query.name, query.tables)

    shutil.rmtree(tmp_path / "lake" / SENSOR_DUPLICATES_TABLE.name)
    with pytest.raises(CheckpointMismatchError, match="silver/sensor_duplicates does not exist"):
        check_tables(spark, settings, query.name, query.tables)
