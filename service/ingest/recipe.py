"""DataFrame steps recorded once and replayed on other DataFrames of the same columns.

Building validation's plan costs about 1.4 s of py4j calls (some 15,000 of them: every
``Column`` of its ~1,000 expressions is a call), which a micro-batch cannot pay. A
`Recipe` records the steps of a DataFrame function (``select``, ``withColumn``,
``withColumns``, ``drop``) with the ``Column`` objects they were given, once, over an
empty template; `Recipe.apply` replays those steps on a batch's rows: a call and an
analysis per step. The columns' expressions are unresolved (names, not a plan's
attributes), so they bind to whatever rows they are replayed on; any other DataFrame
method called while recording is refused, as its step would be missing from the replay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame

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
        self.schema = build(_Recording(template, self._steps)).schema

    def apply(self, rows: DataFrame) -> DataFrame:
        """``rows`` through the recorded steps."""
        for name, args in self._steps:
            rows = getattr(rows, name)(*args)
        return rows
