"""The typed fast path of validation: the valid majority typed in one parse, the rest
checked exactly.

A record takes the fast path when a checker in the JVM (``lakehouse.ingest.FastCheck``, a
Spark UDF built from ``jvm/checker`` by ``make jars``) finds it certainly valid against
every rule of the contract that does not depend on the time, reading the same typed
values the exact checks read (its comment lists what it leaves to them: duplicate or
unknown keys, numbers whose reading could differ, ...), and its date-time fields name
instants within years 1-9999 not too far ahead of its arrival, its dates days within
their bounds. Such a record has no error
and its typed record is the checker's (a date-time's instant read as the exact checks
read it, in microseconds); every other record goes through the VARIANT validation
(`service.ingest.validation`), which decides its verdict, error code and detail.
`FastPath.of` is None for a contract whose features the checker does not know (arrays,
maps, free-form objects, framing, conditions on nested fields, a date inside a condition):
all of its records are checked exactly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DateType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from service.contracts.loading import ANNOTATIONS, NUMBER_KEYWORDS, OBJECT_KEYWORDS, VALUE_KEYWORDS
from service.contracts.model import Branch, Contract, Field
from service.ingest.rules import date_range, java_pattern

CHECKER_CLASS = "lakehouse.ingest.FastCheck"
# Whether a row took the fast path; its typed payload (`FastPath.mark`).
FAST = "_fast"
_TYPED = "_fast_typed"
# What the checker decides: a value's keywords and annotations; an object's.
_VALUE_KEYWORDS = VALUE_KEYWORDS | ANNOTATIONS
_OBJECT_KEYWORDS = OBJECT_KEYWORDS | ANNOTATIONS
# How `FastCheck` types a leaf's column ("micros": a date-time's instant, "days": a date).
_COLUMN_KINDS: Mapping[DataType, str] = {
    StringType(): "string",
    LongType(): "long",
    DoubleType(): "double",
    BooleanType(): "boolean",
    TimestampType(): "micros",
    DateType(): "days",
}


@dataclass(frozen=True)
class FastPath:
    """A contract's fast path: the checker's spec and the schema of the records it returns."""

    contract: Contract
    spec: str
    schema: StructType

    @classmethod
    def of(cls, contract: Contract) -> FastPath | None:
        """The fast path of ``contract``, or None when the checker cannot decide its records."""
        if contract.framing != "none" or not all(_supported(f) for f in contract.fields):
            return None
        conditionals = [_conditional(c.when.required, c.when.equals, c.then, c.otherwise)
                        for c in contract.conditionals]  # fmt: skip
        if any(c is None for c in conditionals):
            return None
        tops = [f for f in contract.fields if "." not in f.path]
        root = {
            "types": ["object"],
            "required": [f.path for f in tops if f.required],
            "properties": {f.path: _node(contract, f) for f in tops},
            "columns": [f.path for f in tops],
        }
        spec = json.dumps({"root": root, "conditionals": conditionals}, sort_keys=True)
        return cls(contract, spec, StructType([_column(contract, f) for f in tops]))

    def mark(
        self, bronze: DataFrame, max_payload_bytes: int, skew: int | None, today: Column
    ) -> DataFrame:
        """``bronze`` with `FAST` (never null) and the fast rows' typed payload; ``today``
        bounds the dates the contract bounds by "today"."""
        spark = bronze.sparkSession
        name = f"lakehouse_fast_check_{self.contract.name}"
        jvm = spark._jvm
        assert jvm is not None
        checker = getattr(jvm, CHECKER_CLASS)(self.spec)
        schema = jvm.org.apache.spark.sql.types.DataType.fromJson(self.schema.json())
        spark._jsparkSession.udf().register(name, checker, schema)
        size_ok = F.octet_length("value") <= max_payload_bytes
        typed = bronze.withColumn(
            _TYPED, F.when(size_ok, F.call_function(name, F.col("value_text")))
        )
        fast = F.col(_TYPED).isNotNull()
        event_time = self.contract.event_time
        if event_time is not None and skew is not None:
            micros = self._typed(self.contract.field(event_time))
            ahead = micros - F.unix_micros(F.col("kafka_timestamp"))
            fast = fast & ~F.coalesce(ahead > skew * 1_000_000, F.lit(False))
        for f in self.contract.leaves:
            extension = f.schema.get("x-lakehouse", {})
            if f.format == "date" and {"minimum", "maximum"} & set(extension):
                low, high = date_range(extension, today)
                fast = fast & F.coalesce(self.value(f).between(low, high), F.lit(True))
        return typed.withColumn(FAST, fast)

    def value(self, f: Field) -> Column:
        """Leaf ``f``'s typed value on a fast row (`mark`)."""
        if f.format == "date-time":
            return F.timestamp_micros(self._typed(f))
        if f.format == "date":
            return F.date_from_unix_date(self._typed(f))
        return self._typed(f)

    def _typed(self, f: Field) -> Column:
        value = F.col(_TYPED)
        for part in f.path.split("."):
            value = value.getField(part)
        return value


def _supported(f: Field) -> bool:
    if f.others or f.is_array or f.is_map or f.is_free_form:
        return False
    allowed = _OBJECT_KEYWORDS if f.is_object else _VALUE_KEYWORDS
    return set(f.schema) <= allowed and _values_supported(f.schema)


def _values_supported(schema: Mapping[str, Any]) -> bool:
    values = list(schema.get("enum", [])) + ([schema["const"]] if "const" in schema else [])
    return schema.get("format", "date-time") in ("date-time", "date") and all(
        v is None or isinstance(v, str) for v in values
    )


def _node(contract: Contract, f: Field) -> dict[str, Any]:
    if f.is_object:
        nested = [p for p in contract.fields if p.path.rpartition(".")[0] == f.path]
        names = [p.path.rpartition(".")[2] for p in nested]
        return {
            "types": list(f.types),
            "required": [n for n, p in zip(names, nested, strict=True) if p.required],
            "properties": {n: _node(contract, p) for n, p in zip(names, nested, strict=True)},
            "column": "object",
            "columns": names,
        }
    assert f.data_type is not None
    return {**_value_node(f.schema), "column": _COLUMN_KINDS[f.data_type]}


def _value_node(schema: Mapping[str, Any]) -> dict[str, Any]:
    declared = schema.get("type", [])
    node: dict[str, Any] = {"types": [declared] if isinstance(declared, str) else list(declared)}
    node["date_time"] = schema.get("format") == "date-time"
    node["date"] = schema.get("format") == "date"
    for keyword in ("minLength", "maxLength", *NUMBER_KEYWORDS):
        if keyword in schema:
            node[keyword] = schema[keyword]
    if "enum" in schema or "const" in schema:
        node["one_of"] = list(schema["enum"]) if "enum" in schema else [schema["const"]]
    if "pattern" in schema:
        node["pattern"] = java_pattern(str(schema["pattern"]))
    return node


def _conditional(
    required: tuple[str, ...],
    equals: Mapping[str, tuple[Any, ...]],
    then: Branch | None,
    otherwise: Branch | None,
) -> dict[str, Any] | None:
    names = [*required, *equals]
    values = [v for vs in equals.values() for v in vs]
    if any("." in n for n in names) or not all(v is None or isinstance(v, str) for v in values):
        return None
    if not all(_branch_supported(b) for b in (then, otherwise) if b is not None):
        return None
    return {
        "required": list(required),
        "equals": {k: list(v) for k, v in equals.items()},
        "then": _branch(then),
        "otherwise": _branch(otherwise),
    }


def _branch_supported(branch: Branch) -> bool:
    names = [*branch.required, *branch.properties]
    schemas = branch.properties.values()
    return not any("." in n for n in names) and all(_branch_value_supported(s) for s in schemas)


def _branch_value_supported(schema: Mapping[str, Any]) -> bool:
    """A ``then``/``else`` property's schema the checker decides: no date (its bounds are
    the top-level property's, checked by Spark)."""
    extension = schema.get("x-lakehouse", {})
    return (
        set(schema) <= _VALUE_KEYWORDS
        and _values_supported(schema)
        and schema.get("format") != "date"
        and not {"minimum", "maximum"} & set(extension)
    )


def _branch(branch: Branch | None) -> dict[str, Any] | None:
    if branch is None:
        return None
    return {
        "required": list(branch.required),
        "properties": {k: _value_node(s) for k, s in branch.properties.items()},
    }


def _column(contract: Contract, f: Field) -> StructField:
    """The checker's column of top-level (or nested) field ``f``: a nested object a struct,
    a date-time its instant in microseconds, a date its day since the epoch."""
    data_type: DataType
    if f.is_object:
        nested = [p for p in contract.fields if p.path.rpartition(".")[0] == f.path]
        data_type = StructType([_column(contract, p) for p in nested])
    elif f.format == "date-time":
        data_type = LongType()
    elif f.format == "date":
        data_type = IntegerType()
    else:
        assert f.data_type is not None
        data_type = f.data_type
    return StructField(f.path.rpartition(".")[2], data_type)
