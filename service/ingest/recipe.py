"""DataFrame steps recorded once and replayed on other DataFrames of the same columns.

Building validation's plan costs about 1.4 s of py4j calls (some 15,000 of them: every
``Column`` of its ~1,000 expressions is a call), which a micro-batch cannot pay. A
`Recipe` records the steps of a DataFrame function (``select``, ``withColumn``,
``withColumns``, ``drop``) with the ``Column`` objects they were given, once, over an
empty template; any other DataFrame method called while recording is refused, as its
step would be missing from the replay.

`Recipe.apply` on rows of the template's columns (names and types) takes the plan Spark
analysed over the template and puts the rows in the template's place, under the
template's attribute ids: one analysis of a resolved plan (a batch's exact checks
0.10-0.14 s, warm). On other rows it replays the steps, a call and an analysis per step
(the exact checks' 17: 0.34-0.65 s); their expressions are unresolved (names, not a
plan's attributes), so they bind to whatever rows they are replayed on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame

from service.lake.delta import scala_items, scala_seq
from service.lake.jvm import java_class

# The DataFrame methods a recorded function may call to derive new rows.
_STEPS = ("select", "withColumn", "withColumns", "drop")


class _Recording(ClassicDataFrame):
    """A DataFrame that records the derivation steps called on it and its successors."""

    def __init__(self, rows: DataFrame, steps: list[tuple[str, tuple[Any, ...]]]) -> None:
        super().__init__(rows._jdf, rows.sparkSession)
        self._rows = rows
        self._steps = steps

    def _step(self, name: str, args: tuple[Any, ...]) -> _Recording:
        self._steps.append((name, args))
        return _Recording(getattr(self._rows, name)(*args), self._steps)

    def select(self, *cols: Any) -> _Recording:
        return self._step("select", cols)

    def withColumn(self, *args: Any) -> _Recording:  # noqa: N802
        return self._step("withColumn", args)

    def withColumns(self, *args: Any) -> _Recording:  # noqa: N802
        return self._step("withColumns", args)

    def drop(self, *cols: Any) -> _Recording:
        return self._step("drop", cols)

    def __getattribute__(self, name: str) -> Any:
        # Any other step (a filter, a join, ...) would be missing from the replay.
        if name in _UNRECORDED:
            raise TypeError(f"Recipe: {name} is not a step a recipe records ({_STEPS})")
        return super().__getattribute__(name)


# DataFrame methods that return new rows but are not recorded: refused while recording.
_UNRECORDED = frozenset(
    name
    for name in dir(DataFrame)
    if not name.startswith("_")
    and name not in _STEPS
    and name
    not in {
        "columns",
        "schema",
        "dtypes",
        "sparkSession",
        "sql_ctx",
        "isStreaming",
        "printSchema",
    }
)


class Recipe:
    """The steps ``build`` takes from its input to its output, replayable (`apply`)."""

    def __init__(self, build: Callable[[DataFrame], DataFrame], template: DataFrame) -> None:
        """Record ``build`` over ``template`` (rows with the columns it will be applied to:
        an empty DataFrame does)."""
        self._steps: list[tuple[str, tuple[Any, ...]]] = []
        built = build(_Recording(template, self._steps))
        self.schema = built.schema
        self._template = template
        recorded = _analyzed(template)
        self._wanted = scala_items(recorded.output())
        self._chain = _chain(built._jdf.queryExecution().analyzed(), recorded)

    def apply(self, rows: DataFrame) -> DataFrame:
        """``rows`` through the recorded steps: the recorded plan over ``rows`` when they have
        the template's columns, else the steps replayed."""
        if self._chain is not None and _same_columns(rows, self._template):
            return self._over(rows, self._chain)
        for name, args in self._steps:
            rows = getattr(rows, name)(*args)
        return rows

    def _over(self, rows: DataFrame, chain: list[Any]) -> DataFrame:
        """The recorded plan (``chain``, root first) with ``rows`` in the template's place,
        their columns aliased to the template's attributes (by name)."""
        spark = rows.sparkSession
        plan = _analyzed(rows)
        wanted = self._wanted  # the template's attributes, in its column order
        given = {a.name(): a for a in scala_items(plan.output())}
        if [given[a.name()].exprId() for a in wanted] != [a.exprId() for a in wanted]:
            alias = java_class(spark, "org.apache.spark.sql.catalyst.expressions.Alias")
            none = java_class(spark, "scala.Option").empty()
            aliases = [
                alias(
                    given[a.name()], a.name(), a.exprId(), a.qualifier(), none, scala_seq(spark, [])
                )
                for a in wanted
            ]
            project = java_class(spark, "org.apache.spark.sql.catalyst.plans.logical.Project")
            plan = project(scala_seq(spark, aliases), plan)
        for node in reversed(chain):
            plan = node.withNewChildren(scala_seq(spark, [plan]))
        dataset = java_class(spark, "org.apache.spark.sql.classic.Dataset")
        return DataFrame(dataset.ofRows(spark._jsparkSession, plan), spark)


def _analyzed(rows: DataFrame) -> Any:
    """The analysed logical plan of ``rows`` (py4j)."""
    return rows._jdf.queryExecution().analyzed()


def _chain(plan: Any, template: Any) -> list[Any] | None:
    """The nodes from ``plan``'s root down to ``template`` (excluded) when each has one child,
    else None."""
    chain = []
    while not plan.equals(template):
        children = scala_items(plan.children())
        if len(children) != 1:
            return None
        chain.append(plan)
        plan = children[0]
    return chain


def _same_columns(rows: DataFrame, template: DataFrame) -> bool:
    """Whether ``rows`` has ``template``'s column names and types, each nullable only where
    the template's is (the recorded plan's expressions assume the template's)."""
    fields = {f.name: f for f in rows.schema.fields}
    return len(fields) == len(template.schema.fields) and all(
        f.name in fields
        and fields[f.name].dataType == f.dataType
        and (f.nullable or not fields[f.name].nullable)
        for f in template.schema.fields
    )
