"""A recipe replays the steps it recorded over a template on other rows, refuses to record
a step it could not replay, and replays the exact checks as they are built."""

from __future__ import annotations

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from service.contracts.loading import parse_contract
from service.ingest.modes import Validation
from service.ingest.recipe import Recipe
from service.lake.delta import scala_items
from service.lake.schemas import INGESTED_AT, KAFKA_RECORD
from tests.support.contracts import orders, shipped
from tests.support.records import bronze_frame


def _steps(rows: DataFrame) -> DataFrame:
    doubled = rows.withColumn("twice", F.col("n") * 2)
    named = doubled.withColumns({"label": F.concat(F.lit("n="), F.col("n").cast("string"))})
    summed = named.select("*", F.transform(F.array("n", "twice"), lambda x: x + 1).alias("up"))
    return summed.drop("label")


def test_a_recipe_replays_its_steps_on_other_rows(spark: SparkSession) -> None:
    template = spark.createDataFrame([], "n long, tag string")
    recipe = Recipe(_steps, template)
    rows = spark.createDataFrame([("a", 3), ("b", 5)], "tag string, n long")

    replayed = recipe.apply(rows).orderBy("n").collect()

    assert [r.asDict() for r in replayed] == [
        {"tag": "a", "n": 3, "twice": 6, "up": [4, 7]},
        {"tag": "b", "n": 5, "twice": 10, "up": [6, 11]},
    ]
    assert recipe.schema.fieldNames() == ["n", "tag", "twice", "up"]


def test_a_step_the_recipe_cannot_replay_is_refused(spark: SparkSession) -> None:
    template = spark.createDataFrame([], "n long")
    with pytest.raises(TypeError, match="where is not a step a recipe records"):
        Recipe(lambda rows: rows.withColumn("m", F.col("n")).where("n > 1"), template)


@pytest.mark.parametrize("name", ["sensors", "users", "orders"])
def test_the_recorded_exact_checks_rebuild_their_plan(spark: SparkSession, name: str) -> None:
    """What the driver replays on a batch's pending rows is the exact checks' plan."""
    document = orders() if name == "orders" else shipped(name)
    contract = parse_contract(document, f"{name}.json", name, {})
    validation = Validation.of(contract, 4096, 300)
    template = spark.createDataFrame([], StructType([*KAFKA_RECORD.fields, INGESTED_AT]))

    replayed = validation.recipe(template.schema).apply(template)

    built = validation.exact(template)
    assert replayed.schema == built.schema
    assert (
        replayed._jdf.queryExecution().analyzed().sameResult(built._jdf.queryExecution().analyzed())
    )


def test_the_recorded_exact_checks_on_a_batchs_rows_give_the_built_outcome(
    spark: SparkSession,
) -> None:
    """On rows of the template's columns the recorded plan takes the rows in the template's
    place; on rows with another column the steps are replayed: each gives what the exact
    checks built over those rows give."""
    validation = Validation.of(
        parse_contract(shipped("sensors"), "sensors.json", "sensors", {}), 4096, 300
    )
    values = [
        '{"event_id": "e1", "device_id": "d", "sensor_type": "pressure", "event_time": 1}',
        '{"event_id": 7}',
        "not json",
        None,
    ]
    bronze = bronze_frame(spark, [("k", v) for v in values], "sensors")
    rows = bronze.withColumn(INGESTED_AT.name, F.current_timestamp())
    # As the driver records it: over rows of the stream's own columns.
    template = spark.createDataFrame([], rows.schema)
    recipe = validation.recipe(template.schema)
    columns = ["kafka_offset", "error_code", "error_detail"]

    def ids(df: DataFrame) -> list[int]:
        return [a.exprId().id() for a in scala_items(df._jdf.queryExecution().analyzed().output())]

    # The recorded plan's attributes: the template's place taken by the rows, or new ones.
    assert ids(recipe.apply(rows)) == ids(recipe.apply(template))
    assert set(ids(recipe.apply(rows.withColumn("extra", F.lit(1))))).isdisjoint(
        ids(recipe.apply(template))
    )
    for batch in (rows, rows.withColumn("extra", F.lit(1))):
        replayed = sorted(tuple(r) for r in recipe.apply(batch).select(*columns).collect())
        built = sorted(tuple(r) for r in validation.exact(batch).select(*columns).collect())
        assert replayed == built
        assert [r[1] for r in replayed] == [
            "invalid_value",
            "missing_field",
            "malformed_json",
            "empty_payload",
        ]
