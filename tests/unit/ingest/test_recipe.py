"""A recipe replays the steps it recorded over a template on other rows, and refuses to
record a step it could not replay."""

from __future__ import annotations

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from service.ingest.recipe import Recipe


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
