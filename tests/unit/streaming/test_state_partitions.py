"""A stateful query resumes with the state partitions its checkpoint was written with when
the shuffle partitions change: a lake written under the earlier default of four (docs/
configuration.md, `INGEST_SPARK_SHUFFLE_PARTITIONS`) resumes under one per core."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame, SparkSession


def test_a_count_written_with_four_partitions_resumes_its_state_under_two(
    spark: SparkSession, tmp_path: Path
) -> None:
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()
    counts: dict[str, int] = {}

    def keep(rows: DataFrame, _: int) -> None:
        counts.update({row["k"]: row["count"] for row in rows.collect()})

    def run(partitions: int) -> None:
        session = spark.newSession()
        session.conf.set("spark.sql.shuffle.partitions", str(partitions))
        stream = session.readStream.schema("k STRING").json(str(source)).groupBy("k").count()
        writer = stream.writeStream.outputMode("update").foreachBatch(keep)
        query = writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
        query.start().awaitTermination()

    (source / "1.json").write_text('{"k": "a"}\n{"k": "b"}\n{"k": "a"}\n')
    run(4)
    (source / "2.json").write_text('{"k": "a"}\n{"k": "c"}\n')
    run(2)
    assert {"a": 3, "b": 1, "c": 1} == counts
    parts = sorted(p.name for p in (checkpoint / "state" / "0").iterdir() if p.name.isdigit())
    assert ["0", "1", "2", "3"] == parts
