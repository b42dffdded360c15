"""Checking Kafka JSON payloads against a field contract with built-in Column expressions.

A payload is parsed once to a VARIANT; every field's JSON type is read from it
exactly (``schema_of_variant``), so quoted numbers, booleans and ``"NaN"`` are
``type_mismatch`` and integers are told apart from other numbers. Each rule is a
`Violation`; `first_violation` picks the winner by the ``error_code`` precedence
(docs/promises.md), then by field order. Decisions on edge cases, each checked on
Spark 4.2: a value that is null or only JSON whitespace is ``empty_payload``; the
size limit counts bytes (``octet_length``) before any parsing; invalid UTF-8, bare
``NaN``/``Infinity`` tokens, duplicate keys (ambiguous), leading zeros, trailing
content after the document, a string escaping an unpaired UTF-16 surrogate and
nesting deeper than ~1000 levels are ``malformed_json``; one leading byte-order mark
is ignored (RFC 8259 §8.1); integers are JSON integers without fraction or exponent
(``1.0`` is a ``type_mismatch``), and an integral value beyond 64 bits is
``out_of_range``; numbers beyond double range (``1e400``) parse as infinity and fail
range or finiteness rules. Timestamps are ISO-8601 strings (``T`` or space, optional
fraction truncated to microseconds, ``Z``/``±hh``/``±hhmm``/``±hh:mm``, no zone =
UTC) or integer epoch milliseconds within years 1-9999; anything else is a
``type_mismatch``. Empty strings are ``invalid_value`` only where the contract says
non-empty or enumerates values. Unknown top-level fields go to ``_rescued`` as a
JSON object with keys sorted and values re-serialised with their JSON types
(``1.50`` becomes ``1.5``); unknown fields nested in known objects are not rescued.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DateType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructType,
    TimestampType,
)

from service.contracts.model import Framing
from service.ingest.bronze import utf8_text
from service.lake.schemas import QUARANTINE

ERROR_CODES = (
    "empty_payload",
    "payload_too_large",
    "malformed_json",
    "not_an_object",
    "missing_field",
    "type_mismatch",
    "invalid_value",
    "out_of_range",
    "event_time_in_future",
)
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024

# Java regular expressions: \z is the end of the text (Java's $ also matches before a final
# line terminator, so "GB\n" would match ^[A-Z]{2}$).
_BLANK = r"^[ \t\r\n]*\z"
_ISO_TIMESTAMP = r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}(:?\d{2})?)?\z"
_ZONE_SUFFIX = r"(Z|[+-]\d{2}(:?\d{2})?)\z"
_ISO_DATE = r"^\d{4}-\d{2}-\d{2}\z"
# Epoch milliseconds of 0001-01-01T00:00:00Z and 9999-12-31T23:59:59.999Z: the instants
# every reader of the lake can hold (Python's datetime, for one, has no year 0).
MIN_EPOCH_MILLIS = -62_135_596_800_000
MAX_EPOCH_MILLIS = 253_402_300_799_999
_MIN_MICROS, _MAX_MICROS = MIN_EPOCH_MILLIS * 1000, MAX_EPOCH_MILLIS * 1000 + 999
_MIN_DATE, _MAX_DATE = "0001-01-01", "9999-12-31"
_SHOWN_CHARS = 64
# The path of the payload in ``_json`` (`with_parsed_payload`).
PAYLOAD = "$[0]"
# The payload's top-level fields as a struct of VARIANTs (`stage_fields`).
_FIELDS_COLUMN = "_fields"


@dataclass(frozen=True)
class Violation:
    """A rule a record breaks where ``broken`` is true; ``detail`` says which and why."""

    code: str
    broken: Column
    detail: Column


def first_violation(violations: Iterable[Violation]) -> Column:
    """Return ``struct(error_code, error_detail)`` of the winning violation, null if none.

    Violations must be listed in field order; the stable sort keeps it within a code.
    """
    ranked = sorted(violations, key=lambda v: ERROR_CODES.index(v.code))
    return F.coalesce(
        *[
            F.when(
                v.broken,
                F.struct(F.lit(v.code).alias("error_code"), v.detail.alias("error_detail")),
            )
            for v in ranked
        ]
    )


def with_parsed_payload(
    records: DataFrame,
    max_payload_bytes: int,
    framing: Framing = "none",
) -> DataFrame:
    """Add ``_json`` when the payload's text is one well-formed JSON document, and ``_object``.

    Spark's JSON parsers stop after the first document and ignore what follows, so
    the value is parsed as ``[value, digest]`` with its own xxhash64 digest: the
    digest comes back as the second and last element only if the value was
    exactly one document (a value cannot contain its own digest by accident).
    ``_json`` is that array (the document is its element `PAYLOAD`: reading fields
    through it saves re-encoding every object); ``_object`` is whether the document
    is a JSON object. Oversized and non-UTF-8 values are never parsed.

    The payload is the value, or with ``framing`` (`with_unframed_payload`) the JSON
    after a schema registry serializer's header.
    """
    records = with_unframed_payload(records, framing)
    value, text = F.col("value"), _payload_text(framing)
    # Null text: no value, or bytes that are not UTF-8.
    parseable = ~text.rlike(_BLANK) & (F.octet_length(value) <= max_payload_bytes)
    # Separate projections keep each expensive expression evaluated once per row.
    staged = records.withColumn(
        "_text", F.when(parseable, F.regexp_replace(text, "^\ufeff", ""))
    ).withColumn("_digest", F.xxhash64("_text"))
    wrapped = F.concat(F.lit("["), F.col("_text"), F.lit(","), F.col("_digest"), F.lit("]"))
    parsed = staged.withColumn("_document", F.try_parse_json(wrapped))
    single = F.variant_get("_document", "$[2]", "variant").isNull() & (
        F.try_variant_get("_document", "$[1]", "bigint") == F.col("_digest")
    )
    # A well-formed document is an object exactly when it opens with "{".
    is_object = F.col("_text").rlike(r"^[ \t\r\n]*\{")
    return (
        parsed.withColumn("_json", F.when(single, F.col("_document")))
        .withColumn("_object", F.when(single, is_object))
        .drop("_text", "_digest", "_document")
    )


def payload_violations(
    max_payload_bytes: int, null_allowed: Column, framing: Framing = "none"
) -> list[Violation]:
    """Rules on the whole value of a row made by `with_parsed_payload` with ``framing``.

    ``null_allowed`` is true where a null value is legitimate (a tombstone).
    """
    value, text = F.col("value"), _payload_text(framing)
    json = F.col("_json")
    size = F.octet_length(value)
    return [
        *_framing_violations(framing),
        Violation(
            "empty_payload",
            (value.isNull() & ~null_allowed) | text.rlike(_BLANK),
            F.lit("value: empty"),
        ),
        Violation(
            "payload_too_large",
            size > max_payload_bytes,
            F.concat(
                F.lit("value: "),
                size.cast("string"),
                F.lit(f" bytes exceeds the limit of {max_payload_bytes}"),
            ),
        ),
        Violation(
            "malformed_json",
            value.isNotNull() & text.isNull(),
            F.lit("value: not valid UTF-8"),
        ),
        Violation(
            "malformed_json",
            value.isNotNull() & json.isNull(),
            F.lit("value: not a single well-formed JSON document"),
        ),
        Violation(
            "not_an_object",
            json.isNotNull() & ~F.col("_object"),
            F.concat(
                F.lit("value: expected a JSON object, got "),
                json_type(f"variant_get(_json, '{PAYLOAD}', 'variant')"),
            ),
        ),
    ]


# A schema registry serializer's header (Confluent's wire format): magic byte 0, then the
# schema id as a 4-byte big-endian signed integer, then the JSON.
_HEADER_BYTES = 5
_PAYLOAD_TEXT = "_payload_text"
SCHEMA_ID_COLUMN = "_schema_id"


def _framed_value() -> Column:
    value = F.col("value")
    return (F.octet_length(value) >= _HEADER_BYTES) & (F.hex(F.substring(value, 1, 1)) == "00")


def _schema_id() -> Column:
    unsigned = F.conv(F.hex(F.substring(F.col("value"), 2, 4)), 16, 10).cast("bigint")
    return F.when(unsigned >= 2**31, unsigned - 2**32).otherwise(unsigned).cast("int")


def with_unframed_payload(records: DataFrame, framing: Framing) -> DataFrame:
    """With ``framing`` ``confluent`` or ``auto``, add the payload's text (the JSON after the
    header of a framed value, as UTF-8; ``auto`` takes an unframed value whole) and
    `SCHEMA_ID_COLUMN` (a framed value's schema id, else null). Unchanged with ``none``."""
    if framing == "none":
        return records
    framed = _framed_value()
    json = utf8_text(F.expr(f"substr(value, {_HEADER_BYTES + 1})"))
    text = F.when(framed, json)
    if framing == "auto":
        text = text.otherwise(F.col("value_text"))
    return records.withColumns(
        {_PAYLOAD_TEXT: text, SCHEMA_ID_COLUMN: F.when(framed, _schema_id())}
    )


def _payload_text(framing: Framing) -> Column:
    return F.col("value_text") if framing == "none" else F.col(_PAYLOAD_TEXT)


def _framing_violations(framing: Framing) -> list[Violation]:
    """A framed value where the contract says none, an unframed one where it says confluent:
    each a ``malformed_json`` that says so (before the text's own checks)."""
    value, framed = F.col("value"), _framed_value()
    if framing == "none":
        return [
            Violation(
                "malformed_json",
                value.isNotNull() & framed,
                F.concat(
                    F.lit("value: framed by a schema registry serializer (magic byte 0, schema"
                          " id "),
                    _schema_id().cast("string"),
                    F.lit(") where the contract's framing is none (x-lakehouse.framing)"),
                ),
            )
        ]  # fmt: skip
    if framing == "confluent":
        return [
            Violation(
                "malformed_json",
                value.isNotNull() & ~framed,
                F.lit("value: not framed by a schema registry serializer (magic byte 0 and a"
                      " 4-byte schema id before the JSON), as the contract's framing"
                      " confluent says"),
            )
        ]  # fmt: skip
    return []


def json_object(json: Column) -> Column:
    """The payload of ``_json`` as a map of its top-level fields; null unless an object."""
    return F.try_variant_get(json, PAYLOAD, "map<string,variant>")


def json_type(field: str, schema: str | None = None) -> Column:
    """JSON type name of a VARIANT (``integer`` apart from ``number``); null when absent.

    ``field`` is the VARIANT as SQL; ``schema`` is its ``schema_of_variant`` (SQL) when
    already computed: the name tests it several times, and each test would otherwise
    compute it again. One SQL expression: built call by call, it was ~25 py4j calls,
    half a second of every driver start for the payload fields.
    """
    return F.expr(_json_type_sql(field, schema))


def _json_type_sql(field: str, schema: str | None = None) -> str:
    schema = f"schema_of_variant({field})" if schema is None else schema
    return (
        f"CASE WHEN {field} IS NULL THEN CAST(NULL AS STRING)"
        f" WHEN is_variant_null({field}) THEN 'null'"
        f" WHEN {schema} IN ('BIGINT', 'INT', 'SMALLINT', 'TINYINT') THEN 'integer'"
        f" WHEN startswith({schema}, 'DECIMAL') OR {schema} IN ('DOUBLE', 'FLOAT') THEN 'number'"
        f" WHEN {schema} = 'STRING' THEN 'string'"
        f" WHEN {schema} = 'BOOLEAN' THEN 'boolean'"
        f" WHEN startswith({schema}, 'ARRAY') THEN 'array'"
        f" WHEN startswith({schema}, 'OBJECT') THEN 'object'"
        f" ELSE lower({schema}) END"
    )


def rescued_fields(json: Column, known: Sequence[str]) -> Column:
    """Unknown top-level fields as a JSON object string, null when there are none."""
    unknown = F.map_filter(json_object(json), lambda k, _: ~k.isin(*known))
    return F.when(F.size(unknown) > 0, F.to_json(unknown))


def shown(text: Column) -> Column:
    """A string value quoted and truncated for an error detail."""
    return F.concat(F.lit("'"), F.substring(text, 1, _SHOWN_CHARS), F.lit("'"))


# The typed readings a field of each declared type is checked and typed with. Each is
# staged as a column once per row (`stage_fields`): the rules then refer to it instead
# of repeating its expression, which keeps the generated code and the plan small.
_READERS: dict[DataType, tuple[str, ...]] = {
    StringType(): ("string",),
    BooleanType(): ("boolean",),
    LongType(): ("long",),
    DoubleType(): ("double",),
    TimestampType(): ("string", "long", "timestamp"),
    DateType(): ("string", "date"),
}
# Readers computed from the raw value, and those computed from other readers.
_DIRECT_READERS = ("string", "long", "double", "boolean", "json", "array", "map")
_DERIVED_READERS = ("timestamp", "date", "members")


@dataclass(frozen=True)
class JsonField:
    """A field of the parsed payload, staged as a VARIANT column, a JSON type column and
    the typed readings its declared ``data_type`` needs; or a member of an array or a map,
    ``element``: a lambda variable over `members`, whose struct holds its readings."""

    name: str
    data_type: DataType | None = None
    # A free-form object: its value is its JSON text (``data_type`` a string).
    json_text: bool = False
    element: Column | None = field(default=None, compare=False, hash=False)
    # Which of the member's value and type it is: "" the member's own, "_<j>" its object's
    # j-th property (an array of objects).
    slot: str = ""

    @property
    def _suffix(self) -> str:
        return self.name.replace(".", "__")

    @property
    def raw(self) -> Column:
        """The field's VARIANT value (null when absent)."""
        if self.element is not None:
            return self.element["value" + self.slot]
        return F.col(f"_raw_{self._suffix}")

    @property
    def kind(self) -> Column:
        """The field's JSON type name (null when absent, ``null`` when JSON null)."""
        if self.element is not None:
            return self.element["kind" + self.slot]
        return F.col(f"_type_{self._suffix}")

    @property
    def present(self) -> Column:
        """Whether the field has a non-null value."""
        return self.kind.isNotNull() & (self.kind != "null")

    @property
    def readers(self) -> tuple[str, ...]:
        """The typed readings staged for this field."""
        if self.element is not None:  # read once per member (`members`)
            return _READERS.get(self.data_type, ()) if self.data_type is not None else ()
        if self.json_text:
            return ("json",)
        if isinstance(self.data_type, ArrayType):
            return ("array", "members")
        if isinstance(self.data_type, MapType):
            return ("map", "members")
        return _READERS.get(self.data_type, ()) if self.data_type is not None else ()

    def staged_raw(self) -> Column:
        """The expression of the raw column, read from the ``_fields`` of `stage_fields`."""
        top, _, rest = self.name.partition(".")
        value = F.col(_FIELDS_COLUMN).getField(top)
        if rest:
            value = F.variant_get(value, f"$.{rest}", "variant")
        return value.alias(f"_raw_{self._suffix}")

    def staged_schema(self) -> Column:
        """The expression of the raw column's ``schema_of_variant``."""
        return F.schema_of_variant(self.raw).alias(f"_schema_{self._suffix}")

    def staged_kind(self) -> Column:
        """The expression of the type column, read from the raw and schema columns."""
        kind = json_type(f"`_raw_{self._suffix}`", f"`_schema_{self._suffix}`")
        return kind.alias(f"_type_{self._suffix}")

    def staged_map(self, members: Column) -> Column:
        """``members`` (a map of VARIANTs by key) staged as this map field's value, whose
        `members` (`staged_members`) read it: the members of an object an
        ``additionalProperties`` schema checks, which no path names."""
        return members.alias(self._staged("map"))

    def staged_members(self) -> Column:
        """The expression of the staged `members` (after `staged_map`)."""
        return self._members().alias(self._staged("members"))

    def staged_values(self, readers: Sequence[str]) -> list[Column]:
        """The expressions of the staged typed readings among ``readers``."""
        return [self._read(r).alias(self._staged(r)) for r in self.readers if r in readers]

    def _staged(self, reader: str) -> str:
        return f"_{reader}_{self._suffix}"

    def _value(self, reader: str) -> Column:
        if reader not in self.readers:
            return self._read(reader)
        if self.element is not None:
            return self.element[reader + self.slot]
        return F.col(self._staged(reader))

    def _read(self, reader: str) -> Column:
        return _reading(self, reader)

    def outside_years(self, reader: str) -> Column:
        """An ISO-8601 string of ``reader`` ("date" or "timestamp") that names a real day or
        instant outside years 1-9999 (UTC): year 0000, or an offset that moves it out."""
        if reader == "date":
            day = _iso_date(self.as_string())
            return day.isNotNull() & ~_day_in_years(day)
        instant = _iso_timestamp(self.as_string())
        return instant.isNotNull() & ~_instant_in_years(instant)

    def as_string(self) -> Column:
        """The value when it is a JSON string."""
        return self._value("string")

    def as_double(self) -> Column:
        """The value when it is a JSON number."""
        return self._value("double")

    def as_long(self) -> Column:
        """The value when it is a JSON integer within 64 bits."""
        return self._value("long")

    def as_boolean(self) -> Column:
        """The value when it is a JSON boolean."""
        return self._value("boolean")

    def as_timestamp(self) -> Column:
        """The value when it is an ISO-8601 string or integer epoch milliseconds."""
        return self._value("timestamp")

    def as_date(self) -> Column:
        """The value when it is a ``YYYY-MM-DD`` string naming a real day."""
        return self._value("date")

    def as_array(self) -> Column:
        """The value when it is a JSON array: its elements as VARIANTs."""
        return self._value("array")

    def as_map(self) -> Column:
        """The value when it is a JSON object: its members' values as VARIANTs by key."""
        return self._value("map")

    def members(self) -> Column:
        """An array's elements or a map's members in order, each a struct of its ``key``
        (an element's index from 0, as text), its VARIANT ``value``, its JSON type ``kind``
        and its typed readings (``string``, ``timestamp``, ...); an object's properties'
        alike, suffixed ``_<j>``. Computed once per member, whatever the rules that read
        them."""
        return self._value("members")

    def _members(self) -> Column:
        return _members_of(self)

    def item(self, member: Column) -> JsonField:
        """A member (a lambda variable over `members`) of an array or a map as a field."""
        if isinstance(self.data_type, ArrayType):
            return JsonField(f"{self.name}[]", self.data_type.elementType, element=member)
        assert isinstance(self.data_type, MapType)
        return JsonField(f"{self.name}.*", self.data_type.valueType, element=member)

    def item_property(self, member: Column, name: str) -> JsonField:
        """Property ``name`` of a member (an object) of an array of objects, as a field."""
        assert isinstance(self.data_type, ArrayType)
        item = self.data_type.elementType
        assert isinstance(item, StructType)
        j = item.fieldNames().index(name)
        return JsonField(f"{self.name}[].{name}", item[name].dataType, element=member,
                         slot=f"_{j}")  # fmt: skip

    def as_type(self, data_type: DataType) -> Column:
        """The value as ``data_type`` when it has the JSON type that stands for it (a
        free-form object's: its JSON text)."""
        if self.json_text:
            return self._value("json")
        if isinstance(data_type, ArrayType) and isinstance(data_type.elementType, StructType):
            item = data_type.elementType

            def record(m: Column) -> Column:
                typed = [
                    self.item_property(m, c.name).as_type(c.dataType).alias(c.name)
                    for c in item.fields
                ]
                return F.when(self.item(m).kind == "object", F.struct(*typed))

            return F.transform(self.members(), record)
        if isinstance(data_type, ArrayType):
            item_type = data_type.elementType
            return F.transform(self.members(), lambda m: self.item(m).as_type(item_type))
        if isinstance(data_type, MapType):
            value_type = data_type.valueType
            entries = F.transform(
                self.members(),
                lambda m: F.struct(m["key"], self.item(m).as_type(value_type).alias("value")),
            )
            return F.map_from_entries(entries)
        readers: dict[DataType, Callable[[], Column]] = {
            StringType(): self.as_string,
            BooleanType(): self.as_boolean,
            LongType(): self.as_long,
            DoubleType(): self.as_double,
            TimestampType(): self.as_timestamp,
            DateType(): self.as_date,
        }
        return readers[data_type]()


def _reading(parent: JsonField, reader: str) -> Column:
    """The expression of ``parent``'s typed reading ``reader`` (`JsonField.readers`)."""
    if reader == "string":
        return F.when(parent.kind == "string", F.try_variant_get(parent.raw, "$", "string"))
    if reader == "double":
        return F.when(
            parent.kind.isin("integer", "number"), F.try_variant_get(parent.raw, "$", "double")
        )
    if reader == "long":
        return F.when(parent.kind == "integer", F.try_variant_get(parent.raw, "$", "bigint"))
    if reader == "boolean":
        return F.when(parent.kind == "boolean", F.try_variant_get(parent.raw, "$", "boolean"))
    if reader == "json":
        return F.when(parent.kind == "object", F.to_json(parent.raw))
    if reader == "array":
        return F.when(parent.kind == "array", F.try_variant_get(parent.raw, "$", "array<variant>"))
    if reader == "map":
        members = F.try_variant_get(parent.raw, "$", "map<string,variant>")
        return F.when(parent.kind == "object", members)
    if reader == "members":
        return parent._members()
    if reader == "date":
        day = _iso_date(parent.as_string())
        return F.when(_day_in_years(day), day)
    iso = _iso_timestamp(parent.as_string())
    millis = parent.as_long()
    epoch = F.timestamp_millis(F.when(millis.between(MIN_EPOCH_MILLIS, MAX_EPOCH_MILLIS), millis))
    return F.coalesce(F.when(_instant_in_years(iso), iso), epoch)


def _iso_date(text: Column) -> Column:
    """A ``YYYY-MM-DD`` string naming a real day, of any year."""
    return F.when(text.rlike(_ISO_DATE), text.try_cast("date"))


def _iso_timestamp(text: Column) -> Column:
    """An ISO-8601 string as an instant (zone-less: UTC), of any year."""
    utc_text = F.when(text.rlike(_ZONE_SUFFIX), text).otherwise(F.concat(text, F.lit("Z")))
    return F.when(text.rlike(_ISO_TIMESTAMP), F.try_to_timestamp(utc_text))


def _members_of(parent: JsonField) -> Column:
    """The expression of `JsonField.members`."""
    # The values and types in SQL text: built call by call, the type's expression cost
    # seconds of py4j calls for a few array fields.
    if isinstance(parent.data_type, ArrayType):
        source, key, value = f"`{parent._staged('array')}`", "CAST(i AS STRING)", "m"
        lambda_args = "(m, i)"
    else:
        source, key, value = f"map_entries(`{parent._staged('map')}`)", "m.key", "m.value"
        lambda_args = "m"
    values = [("", value)] + [
        (f"_{j}", f"try_variant_get({value}, '$.{name}', 'variant')")
        for j, name in enumerate(_item_properties(parent.data_type))
    ]
    read = ", ".join(
        f"'value{slot}', r.v{slot}, 'schema{slot}', schema_of_variant(r.v{slot})"
        for slot, _ in values
    )
    typed = ", ".join(
        f"'value{slot}', s.value{slot},"
        f" 'kind{slot}', {_json_type_sql(f's.value{slot}', f's.schema{slot}')}"
        for slot, _ in values
    )
    # Passes, each reading the one before: the values, their schemas, their types, then
    # the typed readings of each (as a staged parent's, once per member).
    values_sql = ", ".join(f"'v{slot}', {sql}" for slot, sql in values)
    kinds = F.expr(
        f"transform(transform(transform({source}, {lambda_args} -> named_struct('key', {key},"
        f" {values_sql})), r -> named_struct('key', r.key, {read})),"
        f" s -> named_struct('key', s.key, {typed}))"
    )
    direct = F.transform(kinds, lambda m: _with_readings(parent, m, (), _DIRECT_READERS))
    return F.transform(
        direct, lambda m: _with_readings(parent, m, _DIRECT_READERS, _DERIVED_READERS)
    )


def _with_readings(
    parent: JsonField, member: Column, staged: Sequence[str], readers: Sequence[str]
) -> Column:
    """A member (its key, values, types and the ``staged`` readings) with the typed
    ``readers`` of each of its values."""
    kept = [member["key"].alias("key")]
    added = []
    for slot, data_type in _member_types(parent.data_type):
        have = [r for r in _READERS.get(data_type, ()) if r in staged]
        kept += [member[c + slot].alias(c + slot) for c in ("value", "kind", *have)]
        probe = JsonField(parent.name, data_type, element=member, slot=slot)
        added += [
            probe._read(r).alias(r + slot) for r in _READERS.get(data_type, ()) if r in readers
        ]
    return F.struct(*kept, *added)


def _member_types(data_type: DataType | None) -> list[tuple[str, DataType]]:
    """(slot, type) of a member's values: its own, and its object's properties'."""
    item = (
        data_type.elementType
        if isinstance(data_type, ArrayType)
        else data_type.valueType
        if isinstance(data_type, MapType)
        else None
    )
    if item is None:
        return []
    own = [("", item)]
    if isinstance(item, StructType):
        return own + [(f"_{j}", f.dataType) for j, f in enumerate(item.fields)]
    return own


def _item_properties(data_type: DataType | None) -> list[str]:
    """The property names of an array of objects' items (none for other members)."""
    item = data_type.elementType if isinstance(data_type, ArrayType) else None
    return [f.name for f in item.fields] if isinstance(item, StructType) else []


def stage_fields(records: DataFrame, fields: Iterable[JsonField]) -> DataFrame:
    """Add the raw, schema, type and typed-reading columns of ``fields`` to parsed rows.

    One projection per step, each reading the previous step's columns. The payload's
    top-level fields are read in one pass over the object (``_fields``, a struct of
    VARIANTs; keys match exactly, as paths do): one path lookup per field decoded the
    object's keys again each time, and copied its whole key dictionary into every
    field's VARIANT (measured: 40 % of validation's CPU on generated readings).
    """
    staged = list(fields)
    tops = dict.fromkeys(f.name.partition(".")[0] for f in staged)
    struct = ", ".join(f"`{name}`: variant" for name in tops)
    objects = records.withColumn(
        _FIELDS_COLUMN, F.try_variant_get("_json", PAYLOAD, f"struct<{struct}>")
    )
    raws = objects.select("*", *[f.staged_raw() for f in staged]).drop(_FIELDS_COLUMN)
    schemas = raws.select("*", *[f.staged_schema() for f in staged])
    kinds = schemas.select("*", *[f.staged_kind() for f in staged])
    direct = kinds.select("*", *[c for f in staged for c in f.staged_values(_DIRECT_READERS)])
    return direct.select("*", *[c for f in staged for c in f.staged_values(_DERIVED_READERS)])


def with_error(
    records: DataFrame,
    violations: Iterable[Violation],
    columns: Sequence[Column | str],
) -> DataFrame:
    """``columns`` of ``records`` with ``error_code`` and ``error_detail`` (null on valid
    rows).

    The rules are evaluated in the projection of ``columns``, which holds the
    payload's `rescued_fields` (a lambda, evaluated row by row): Spark runs it as a
    row projection of its own, whose generated code it splits into methods HotSpot
    compiles. Inside the whole-stage code of the staged fields, the rules made one
    36 KB method that neither JIT compiler accepts, so it ran interpreted.

    The error comes out of a generator (one row in, one row out) on purpose: the
    optimizer cannot push a filter on it (`split_valid_invalid`) below it, which
    would inline every staged expression into the filter once per reference.
    """
    checked = records.select(*columns, first_violation(violations).alias("_error"))
    outcome = F.struct(
        F.col("_error.error_code").alias("error_code"),
        F.col("_error.error_detail").alias("error_detail"),
    )
    return checked.select("*", F.inline(F.array(outcome))).drop("_error")


def split_valid_invalid(parsed: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Split rows with an ``error_code`` from rows without one: (valid, invalid)."""
    return parsed.where(F.col("error_code").isNull()), parsed.where(F.col("error_code").isNotNull())


def to_quarantine(invalid: DataFrame, quarantined_at: Column | None = None) -> DataFrame:
    """Rejected rows in the quarantine schema, stamped ``quarantined_at`` (default: now)."""
    stamp = quarantined_at if quarantined_at is not None else F.current_timestamp()
    return invalid.withColumn("quarantined_at", stamp).select(
        [F.col(f.name).cast(f.dataType).alias(f.name) for f in QUARANTINE.fields]
    )


def _day_in_years(day: Column) -> Column:
    return day.between(F.lit(_MIN_DATE).cast("date"), F.lit(_MAX_DATE).cast("date"))


def _instant_in_years(instant: Column) -> Column:
    return F.unix_micros(instant).between(_MIN_MICROS, _MAX_MICROS)
