"""A contract as the engine reads it: the fields of its JSON Schema, its conditional rules and
its ``x-lakehouse`` extension block (pure: no Spark session, no I/O).

The JSON Schema document is kept whole (`Contract.document`: what a producer validates
against); the engine's view of it is `fields` (every property, nested objects
flattened into columns, in document order: the order rules are checked in) and
`conditionals` (``allOf`` entries of ``if``/``then``/``else``, and
``dependentRequired``). `service.contracts.loading` builds it and refuses what the
engine does not support, so this module can assume a supported document.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DateType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

Mode = Literal["events", "entities"]
# How a record's value is laid out: the JSON alone, or behind a schema registry
# serializer's header (magic byte 0, a 4-byte schema id); "auto" takes either.
Framing = Literal["none", "confluent", "auto"]
FRAMINGS: tuple[Framing, ...] = ("none", "confluent", "auto")
# The column type of each JSON type (strings by their format).
_COLUMN_TYPES: Mapping[str, DataType] = {
    "integer": LongType(),
    "number": DoubleType(),
    "boolean": BooleanType(),
    "string": StringType(),
}
_FORMAT_TYPES: Mapping[str, DataType] = {"date": DateType(), "date-time": TimestampType()}
# The Spark types a derived column may declare.
DERIVED_TYPES: Mapping[str, DataType] = {
    "string": StringType(),
    "long": LongType(),
    "double": DoubleType(),
    "boolean": BooleanType(),
    "date": DateType(),
    "timestamp": TimestampType(),
}


@dataclass(frozen=True)
class Field:
    """One property of the payload: its JSON path, the column it becomes, its schema."""

    path: str
    column: str
    schema: Mapping[str, Any] = field(hash=False, compare=False)
    pointer: str
    required: bool
    # The members of the nested object at ``path`` beyond its properties, which its
    # ``additionalProperties`` schema checks: a map column (``schema`` is that map's).
    others: bool = False

    @property
    def types(self) -> tuple[str, ...]:
        """The JSON types it allows (``integer`` apart from ``number``)."""
        declared = self.schema.get("type", ())
        return (declared,) if isinstance(declared, str) else tuple(declared)

    @property
    def is_object(self) -> bool:
        """Whether it is a nested object (its properties are fields of their own)."""
        return "object" in self.types and not self.is_free_form and not self.is_map

    @property
    def is_free_form(self) -> bool:
        """Whether it is an object declared without ``properties`` (nor refusing every
        member): kept whole, as its JSON text."""
        return (
            "object" in self.types
            and "properties" not in self.schema
            and self.schema.get("additionalProperties", True) is True
        )

    @property
    def is_map(self) -> bool:
        """Whether it is a map: an object declared without ``properties`` whose members'
        values all have one schema (``additionalProperties``), keys free."""
        return (
            "object" in self.types
            and "properties" not in self.schema
            and isinstance(self.schema.get("additionalProperties"), Mapping)
        )

    @property
    def is_array(self) -> bool:
        """Whether it is an array (of the scalar values its ``items`` declares)."""
        return "array" in self.types

    @property
    def item(self) -> Field:
        """An array's element (path ``<path>[]``) or a map's value (``<path>.*``), as a
        field of its own."""
        if self.is_array:
            path, keyword = f"{self.path}[]", "items"
        else:
            path, keyword = f"{self.path}.*", "additionalProperties"
        return Field(path, self.column, self.schema[keyword], f"{self.pointer}/{keyword}",
                     required=False)  # fmt: skip

    @property
    def properties(self) -> tuple[Field, ...]:
        """A nested object's own properties, as fields (paths ``<path>.<name>``)."""
        declared = self.schema.get("properties", {})
        required = self.schema.get("required", ())
        pointer = f"{self.pointer}/properties"
        return tuple(
            Field(f"{self.path}.{name}", name, schema, f"{pointer}/{name}", name in required)
            for name, schema in declared.items()
        )

    @property
    def nullable(self) -> bool:
        """Whether JSON null is a valid value."""
        return "null" in self.types

    @property
    def format(self) -> str | None:
        """Its ``format`` (``date`` or ``date-time``), if any."""
        value = self.schema.get("format")
        return str(value) if value is not None else None

    @property
    def data_type(self) -> DataType | None:
        """The type of its column (None for a nested object, which has none)."""
        if self.is_object:
            return None
        if self.is_free_form:
            return StringType()
        if self.is_array and self.item.is_object:
            # An array of objects: a struct of their properties (all nullable: validation
            # checks what is required).
            columns = []
            for p in self.item.properties:
                assert p.data_type is not None
                columns.append(StructField(p.column, p.data_type))
            return ArrayType(StructType(columns), containsNull=True)
        if self.is_array:
            # Elements (a map's values) may hold null in the column whatever their schema
            # says (validation checks it): a column's element nullability could not change
            # when the schema's does.
            assert self.item.data_type is not None
            return ArrayType(self.item.data_type, containsNull=True)
        if self.is_map:
            assert self.item.data_type is not None
            return MapType(StringType(), self.item.data_type, valueContainsNull=True)
        if (known := _FORMAT_TYPES.get(self.format or "")) is not None:
            return known
        kinds = [t for t in self.types if t != "null"]
        if kinds == ["integer", "number"] or kinds == ["number", "integer"]:
            return DoubleType()
        return _COLUMN_TYPES[kinds[0]]

    @property
    def extension(self) -> Mapping[str, Any]:
        """Its ``x-lakehouse`` annotations (message texts, date bounds)."""
        value: Mapping[str, Any] = self.schema.get("x-lakehouse", {})
        return value


@dataclass(frozen=True)
class Condition:
    """The ``if`` of a conditional rule: every ``required`` field is present and each field
    of ``equals`` holds one of its values."""

    required: tuple[str, ...]
    equals: Mapping[str, tuple[Any, ...]] = field(hash=False)


@dataclass(frozen=True)
class Branch:
    """A ``then`` or ``else``: fields required there and rules on values; ``suffix`` ends
    the detail of a rule that breaks there (e.g. " for heart_rate readings")."""

    required: tuple[str, ...]
    properties: Mapping[str, Mapping[str, Any]] = field(hash=False)
    suffix: str
    pointer: str


@dataclass(frozen=True)
class Conditional:
    """One conditional rule: ``then`` applies where ``when`` holds, ``otherwise`` elsewhere."""

    when: Condition
    then: Branch | None
    otherwise: Branch | None


@dataclass(frozen=True)
class Derived:
    """A column computed from the typed fields (a Spark SQL expression over their columns)."""

    column: str
    data_type: DataType
    sql: str


@dataclass(frozen=True)
class Tables:
    """The tables of a contract's topic, by their names under the storage root."""

    bronze: str
    silver: str
    duplicates: str | None = None


@dataclass(frozen=True)
class Contract:
    """A topic's contract: what its records are and how the lake keeps them."""

    name: str
    source: str
    document: Mapping[str, Any] = field(hash=False, compare=False)
    topic: str
    mode: Mode
    fields: tuple[Field, ...]
    conditionals: tuple[Conditional, ...]
    tables: Tables
    # events: the id a repeat is known by; entities: the key (the Kafka key of a
    # tombstone) and the field the newest change is chosen by.
    id_field: str | None = None
    key: str | None = None
    order_by: str | None = None
    event_time: str | None = None
    max_future_seconds: int | None = None
    dedup_horizon_seconds: int | None = None
    # (column, field): a date column, the UTC day of a date-time field, partitions silver.
    partition: tuple[str, str] | None = None
    derived: tuple[Derived, ...] = ()
    rescue_unknown: bool = True
    version: int | None = None
    # Columns of silver that keep Delta file statistics (besides arrival): what reads prune on.
    stats_columns: tuple[str, ...] = ()
    framing: Framing = "none"

    @property
    def framed(self) -> bool:
        """Whether values may carry a schema registry header (silver keeps its schema id)."""
        return self.framing != "none"

    @property
    def query(self) -> str:
        """The name of its ingest query (and of its checkpoint)."""
        return f"ingest_{self.name}"

    @property
    def fingerprint(self) -> str:
        """A digest of the document as written (keys sorted): which contract wrote a table."""
        canonical = json.dumps(self.document, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    @property
    def top_level(self) -> tuple[str, ...]:
        """The known top-level property names (every other one is rescued or refused)."""
        return tuple(f.path for f in self.fields if "." not in f.path and not f.others)

    @property
    def leaves(self) -> tuple[Field, ...]:
        """The fields that become columns (all but nested objects), in document order."""
        return tuple(f for f in self.fields if not f.is_object)

    def field(self, path: str) -> Field:
        """The field at JSON path ``path``."""
        for f in self.fields:
            if f.path == path and not f.others:
                return f
        raise KeyError(path)

    def payload_columns(self) -> list[StructField]:
        """The typed columns a valid payload yields, in document order. A required field
        whose type does not allow null is a non-nullable column."""
        columns = []
        for f in self.leaves:
            assert f.data_type is not None
            required = f.required and not f.nullable and "." not in f.path
            columns.append(StructField(f.column, f.data_type, nullable=not required))
        return columns


def flatten(
    properties: Mapping[str, Mapping[str, Any]],
    required: Sequence[str],
    prefixes: Mapping[str, str],
    pointer: str = "",
    path: str = "",
    column_prefix: str = "",
) -> list[Field]:
    """Every property of ``properties`` as a `Field`, a nested object's own properties right
    after it, their columns named with its prefix (``prefixes``, default ``<name>_``), then,
    when its ``additionalProperties`` is a schema, its other members (column
    ``<prefix>others``)."""
    fields: list[Field] = []
    for name, schema in properties.items():
        here = f"{path}.{name}" if path else name
        at = f"{pointer}/properties/{name}"
        f = Field(here, column_prefix + name, schema, at, name in required)
        fields.append(f)
        if f.is_object:
            prefix = column_prefix + prefixes.get(here, f"{name}_")
            fields += flatten(
                schema.get("properties", {}),
                schema.get("required", ()),
                prefixes,
                at,
                here,
                prefix,
            )
            others = schema.get("additionalProperties")
            if isinstance(others, Mapping):
                map_schema = {"type": "object", "additionalProperties": others}
                fields.append(Field(here, f"{prefix}others", map_schema,
                                    f"{at}/additionalProperties", False, others=True))  # fmt: skip
    return fields
