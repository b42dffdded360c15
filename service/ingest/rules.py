"""A contract compiled to validation rules: one `Violation` per JSON Schema keyword, and the typed
record a valid payload yields (pure: built-in Column expressions, no Python per record).

Keyword → ``error_code`` (the contract's precedence then decides, by field order within a
code; docs/contracts.md has the table):

- ``required`` (and a ``then``'s, ``dependentRequired``): ``missing_field`` when the field
  is absent, or JSON null where its type does not allow null;
- ``type``: ``type_mismatch``; an integral number beyond 64 bits where an integer is
  expected is ``out_of_range``;
- ``format`` ``date``/``date-time``: a string that is not one is ``type_mismatch``; epoch
  milliseconds outside years 1-9999 are ``out_of_range``;
- ``enum``, ``const``, ``pattern``, ``minLength: 1`` (non-empty), ``additionalProperties:
  false``: ``invalid_value``;
- ``minimum``, ``maximum``, ``exclusive*``, ``minLength`` > 1, ``maxLength``, ``minItems``,
  ``maxItems``, ``minProperties``, ``maxProperties`` and the extension's date bounds:
  ``out_of_range``; ``uniqueItems``: ``invalid_value``; a number beyond double range is
  not finite (``out_of_range``);
- the extension's event time more than the allowed skew after arrival:
  ``event_time_in_future``.

An array's ``items`` and a map's values are checked member by member, each rule naming
the first member that breaks it (``tags[2]``, ``lines[0].sku``, ``counts.north``).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from service.contracts.model import Branch, Condition, Contract, Field
from service.ingest.validation import (
    MAX_EPOCH_MILLIS,
    MIN_EPOCH_MILLIS,
    SCHEMA_ID_COLUMN,
    JsonField,
    Violation,
    json_object,
    shown,
)

# 2^63 as a double: integral JSON numbers at or beyond it do not fit a 64-bit integer.
_LONG_LIMIT = 9.223372036854775807e18
_EXPECTED = {
    "string": "a JSON string",
    "integer": "a JSON integer",
    "number": "a JSON number",
    "boolean": "a JSON boolean",
    "object": "a JSON object",
    "array": "a JSON array",
}


def json_fields(contract: Contract) -> dict[str, JsonField]:
    """The contract's fields staged for checking, by JSON path (objects without a type; a
    nested object's other members are no path's: `staged_field`)."""
    return {f.path: json_field(f) for f in contract.fields if not f.others}


def staged_field(f: Field, fields: Mapping[str, JsonField]) -> JsonField:
    """The staged field of ``f`` among ``fields`` (`json_fields`); a nested object's other
    members, staged by `with_other_members`, are a map field of their own."""
    return json_field(f) if f.others else fields[f.path]


def json_field(f: Field) -> JsonField:
    """The field ``f`` staged for checking and typing."""
    return JsonField(f.path, f.data_type, json_text=f.is_free_form)


def contract_violations(
    contract: Contract, applies: Column, today: Column, max_future_seconds: int | None
) -> list[Violation]:
    """Every rule of ``contract``, in field order; each broken only where ``applies`` (an
    entity's tombstone has no payload to check). They read the columns `stage_fields` and
    `with_member_checks` add."""
    staged = json_fields(contract)
    rules: list[Violation] = []
    for f in contract.fields:
        rules += (
            _map_rules(f, json_field(f), today)
            if f.others
            else _field_rules(contract, f, staged, today)
        )
    if not contract.rescue_unknown:
        rules.append(_unknown_fields(contract))
    root = _document_others(contract)
    if root is not None:
        rules += _map_rules(root, json_field(root), today)
    if contract.event_time is not None and max_future_seconds is not None:
        rules.append(_in_future(staged[contract.event_time], max_future_seconds))
    return [Violation(r.code, applies & r.broken, r.detail) for r in rules]


def _field_rules(
    contract: Contract, f: Field, staged: Mapping[str, JsonField], today: Column
) -> list[Violation]:
    field = staged[f.path]
    parent = f.path.rpartition(".")[0]
    parent_present = staged[parent].present if parent else F.lit(True)
    missing = field.kind.isNull() | ((field.kind == "null") & F.lit(not f.nullable))
    rules = []
    if f.required:
        rules.append(
            Violation("missing_field", parent_present & missing, _detail(f.path, "required"))
        )
    for conditional_when, branch in _branches(contract):
        if f.path in branch.required:
            rules.append(
                Violation(
                    "missing_field",
                    conditional_when(staged) & missing,
                    _detail(f.path, "required" + branch.suffix),
                )
            )
    rules += own_rules(f, field, today)
    for conditional_when, branch in _branches(contract):
        schema = branch.properties.get(f.path)
        if schema is not None:
            suffix = schema.get("x-lakehouse", {}).get("for")
            rules += _value_rules(
                f.path,
                schema,
                field,
                today,
                f" for {suffix}" if suffix else branch.suffix,
                conditional_when(staged),
            )
    if f.is_object and f.schema.get("additionalProperties", True) is False:
        rules.append(_unknown_nested(f, field))
    return rules


def _branches(contract: Contract) -> list[tuple[Any, Branch]]:
    """(when, branch) of every ``then`` and ``else``; ``when`` builds the condition."""
    result: list[tuple[Any, Branch]] = []
    for conditional in contract.conditionals:
        condition = conditional.when
        if conditional.then is not None:
            result.append((lambda s, c=condition: _holds(c, s), conditional.then))
        if conditional.otherwise is not None:
            result.append((lambda s, c=condition: ~_holds(c, s), conditional.otherwise))
    return result


def _holds(condition: Condition, staged: Mapping[str, JsonField]) -> Column:
    """Whether an ``if`` holds: its required fields present, its fields equal to a value.
    A field whose value cannot be compared (another type) makes it false, as in JSON Schema
    (a ``const`` of another type never matches)."""
    holds = F.lit(True)
    for name in condition.required:
        holds = holds & staged[name].kind.isNotNull()
    for name, values in condition.equals.items():
        holds = holds & F.coalesce(_equals_one_of(staged[name], values), F.lit(False))
    return holds


def _equals_one_of(field: JsonField, values: Sequence[Any]) -> Column:
    checks = []
    strings = [v for v in values if isinstance(v, str)]
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    booleans = [v for v in values if isinstance(v, bool)]
    if strings:
        checks.append(field.as_string().isin(*strings))
    if numbers:
        checks.append(field.as_double().isin(*[float(v) for v in numbers]))
    if booleans:
        checks.append(field.as_boolean().isin(*booleans))
    if None in values:
        checks.append(field.kind == "null")
    result = F.lit(False)
    for check in checks:
        result = result | F.coalesce(check, F.lit(False))
    return result


def _value_rules(
    path: str | Column,
    schema: Mapping[str, Any],
    field: JsonField,
    today: Column,
    suffix: str,
    when: Column,
) -> list[Violation]:
    """The rules of one schema node (a property, or its refinement in a ``then``)."""
    rules: list[Violation] = []
    declared = schema.get("type")
    if declared is None:
        kinds: tuple[str, ...] = ()
    else:
        kinds = (declared,) if isinstance(declared, str) else tuple(declared)
    scalar = tuple(k for k in kinds if k != "null")
    fmt = schema.get("format")
    if kinds:
        rules += _type_rules(path, field, kinds, fmt, suffix)
    if fmt == "date-time":
        rules += [
            Violation(
                "type_mismatch",
                (field.kind == "string")
                & field.as_timestamp().isNull()
                & ~field.outside_years("timestamp"),
                _detail(path, "not an ISO-8601 timestamp: ", shown(field.as_string())),
            ),
            Violation(
                "out_of_range",
                (field.kind == "string")
                & field.as_timestamp().isNull()
                & field.outside_years("timestamp"),
                _detail(path, "outside years 1-9999 (UTC): ", shown(field.as_string())),
            ),
            Violation(
                "out_of_range",
                (field.kind == "integer")
                & ~field.as_long().between(MIN_EPOCH_MILLIS, MAX_EPOCH_MILLIS),
                _detail(path, "epoch milliseconds outside years 1-9999"),
            ),
        ]
    elif fmt == "date":
        rules.append(
            Violation(
                "type_mismatch",
                (field.kind == "string") & field.as_date().isNull() & ~field.outside_years("date"),
                _detail(path, "not a YYYY-MM-DD date: ", shown(field.as_string())),
            )
        )
        rules.append(
            Violation(
                "out_of_range",
                (field.kind == "string") & field.as_date().isNull() & field.outside_years("date"),
                _detail(path, "outside years 1-9999: ", shown(field.as_string())),
            )
        )
    extension: Mapping[str, Any] = schema.get("x-lakehouse", {})
    if fmt == "date" and ("minimum" in extension or "maximum" in extension):
        rules.append(_date_bounds(path, field, extension, today))
    text = field.as_string()
    if "minLength" in schema:
        low = int(schema["minLength"])
        if low == 1:
            rules.append(Violation("invalid_value", text == "", _detail(path, "empty string")))
        elif low > 1:
            length = F.char_length(text)
            rules.append(
                Violation(
                    "out_of_range",
                    length < low,
                    _detail(path, length.cast("string"), f" characters is below {low}"),
                )
            )
    if "maxLength" in schema:
        high = int(schema["maxLength"])
        length = F.char_length(text)
        rules.append(
            Violation(
                "out_of_range",
                length > high,
                _detail(path, length.cast("string"), f" characters exceeds {high}"),
            )
        )
    if "enum" in schema or "const" in schema:
        rules.append(_one_of(path, schema, field, suffix))
    if "pattern" in schema:
        mismatch = extension.get("mismatch", f"does not match {schema['pattern']}")
        rules.append(
            Violation(
                "invalid_value",
                ~text.rlike(java_pattern(str(schema["pattern"]))),
                _detail(path, shown(text), f" {mismatch}{suffix}"),
            )
        )
    if scalar and set(scalar) <= {"integer", "number"} and fmt is None:
        if "number" in scalar:
            rules.append(
                Violation(
                    "out_of_range",
                    F.abs(field.as_double()) == float("inf"),
                    _detail(path, "not a finite number"),
                )
            )
        rules += _bounds(path, schema, field, integer="number" not in scalar, suffix=suffix)
    return [Violation(r.code, when & r.broken, r.detail) for r in rules]


def _type_rules(
    path: str | Column, field: JsonField, kinds: tuple[str, ...], fmt: Any, suffix: str
) -> list[Violation]:
    allowed = set(kinds)
    if "number" in allowed:
        allowed.add("integer")  # an integer is a number
    scalar = [k for k in kinds if k != "null"]
    if fmt == "date-time":
        expected = (
            "an ISO-8601 string or integer epoch milliseconds"
            if "integer" in scalar
            else "an ISO-8601 string"
        )
    elif fmt == "date":
        expected = "a YYYY-MM-DD string"
    else:
        expected = " or ".join(_EXPECTED[k] for k in scalar)
    if scalar == ["integer"]:
        beyond = (field.kind == "number") & (
            F.abs(F.try_variant_get(field.raw, "$", "double")) >= _LONG_LIMIT
        )
        return [
            Violation(
                "type_mismatch",
                field.kind.isNotNull() & ~field.kind.isin(*allowed) & ~beyond,
                _detail(path, f"expected {expected}{suffix}, got ", field.kind),
            ),
            Violation("out_of_range", beyond, _detail(path, "integer beyond 64 bits")),
        ]
    return [
        Violation(
            "type_mismatch",
            field.kind.isNotNull() & ~field.kind.isin(*allowed),
            _detail(path, f"expected {expected}{suffix}, got ", field.kind),
        )
    ]


def _bounds(
    path: str | Column, schema: Mapping[str, Any], field: JsonField, integer: bool, suffix: str
) -> list[Violation]:
    value = field.as_long() if integer else field.as_double()

    def shown_bound(bound: Any) -> str:
        return str(int(bound)) if integer and float(bound).is_integer() else f"{float(bound):g}"

    low, high = schema.get("minimum"), schema.get("maximum")
    rules = []
    if low is not None and high is not None:
        rules.append(
            Violation(
                "out_of_range",
                ~value.between(float(low), float(high)),
                _detail(
                    path,
                    value.cast("string"),
                    f" is outside {shown_bound(low)}..{shown_bound(high)}{suffix}",
                ),
            )
        )
    elif low is not None:
        rules.append(
            Violation(
                "out_of_range",
                value < float(low),
                _detail(path, value.cast("string"), f" is below {shown_bound(low)}{suffix}"),
            )
        )
    elif high is not None:
        rules.append(
            Violation(
                "out_of_range",
                value > float(high),
                _detail(path, value.cast("string"), f" is above {shown_bound(high)}{suffix}"),
            )
        )
    for keyword, words in (
        ("exclusiveMinimum", "is not above"),
        ("exclusiveMaximum", "is not below"),
    ):
        if keyword in schema:
            bound = float(schema[keyword])
            broken = value <= bound if keyword == "exclusiveMinimum" else value >= bound
            rules.append(
                Violation(
                    "out_of_range",
                    broken,
                    _detail(path, value.cast("string"), f" {words} {shown_bound(bound)}{suffix}"),
                )
            )
    return rules


def _one_of(
    path: str | Column, schema: Mapping[str, Any], field: JsonField, suffix: str
) -> Violation:
    values: list[Any] = list(schema["enum"]) if "enum" in schema else [schema["const"]]
    listed = ", ".join(str(v) for v in values if v is not None)
    words = f" is not one of {listed}" if "enum" in schema else f" is not {listed}"
    present_value = F.coalesce(field.as_string(), field.raw.cast("string"))
    return Violation(
        "invalid_value",
        field.kind.isNotNull() & ~_equals_one_of(field, values),
        _detail(path, shown(present_value), words + suffix),
    )


def date_range(extension: Mapping[str, Any], today: Column) -> tuple[Column, Column]:
    """The first and last day a date's ``x-lakehouse`` ``minimum``/``maximum`` allow
    ("today": ``today``)."""

    def bound(text: Any) -> Column:
        if text == "today":
            return today
        return F.lit(datetime.date.fromisoformat(str(text)))

    return bound(extension.get("minimum", "0001-01-01")), bound(
        extension.get("maximum", "9999-12-31")
    )


def _date_bounds(
    path: str | Column, field: JsonField, extension: Mapping[str, Any], today: Column
) -> Violation:
    low, high = date_range(extension, today)
    low_text = extension.get("minimum", "0001-01-01")
    shown_range = f"{low_text}..{extension.get('maximum', '9999-12-31')}"
    day = field.as_date()
    return Violation(
        "out_of_range",
        ~day.between(low, high),
        _detail(path, day.cast("string"), f" is outside {shown_range}"),
    )


def _unknown_fields(contract: Contract) -> Violation:
    unknown = F.map_keys(
        F.map_filter(json_object(F.col("_json")), lambda k, _: ~k.isin(*contract.top_level))
    )
    return Violation(
        "invalid_value",
        F.size(unknown) > 0,
        F.concat(F.array_join(unknown, ", "), F.lit(": not a property of the contract")),
    )


def _unknown_nested(f: Field, field: JsonField) -> Violation:
    known = list(f.schema.get("properties", {}))
    members = F.try_variant_get(field.raw, "$", "map<string,variant>")
    unknown = F.map_keys(F.map_filter(members, lambda k, _: ~k.isin(*known)))
    return Violation(
        "invalid_value",
        F.coalesce(F.size(unknown) > 0, F.lit(False)),
        F.concat(
            F.lit(f"{f.path}."),
            F.array_join(unknown, f", {f.path}."),
            F.lit(": not a property of the contract"),
        ),
    )


def _in_future(field: JsonField, max_future_seconds: int) -> Violation:
    ahead_micros = F.unix_micros(field.as_timestamp()) - F.unix_micros(F.col("kafka_timestamp"))
    return Violation(
        "event_time_in_future",
        ahead_micros > max_future_seconds * 1_000_000,
        F.concat(
            F.lit(f"{field.name}: "),
            (ahead_micros / 1_000_000).cast("decimal(20,3)").cast("string"),
            F.lit(f" s after arrival exceeds {max_future_seconds} s"),
        ),
    )


def _detail(path: str | Column, *parts: Column | str) -> Column:
    """``<path>: <parts>``; ``path`` a Column where it is computed (an array element's)."""
    head = [F.lit(f"{path}: ")] if isinstance(path, str) else [path, F.lit(": ")]
    return F.concat(*head, *[F.lit(p) if isinstance(p, str) else p for p in parts])


def own_rules(f: Field, field: JsonField, today: Column) -> list[Violation]:
    """The rules of ``f``'s own schema (its type, format and value keywords; an array's or a
    map's and its members'), without its being required nor the conditional rules: what a
    value of it alone must satisfy."""
    rules = _value_rules(f.path, f.schema, field, today, "", F.lit(True))
    if f.is_array:
        rules += _array_rules(f, field, today)
    elif f.is_map:
        rules += _map_rules(f, field, today)
    return rules


def _array_rules(f: Field, field: JsonField, today: Column) -> list[Violation]:
    """An array's ``minItems``, ``maxItems`` and ``uniqueItems``, then the rules of its
    ``items``, each naming the first element that breaks it (``tags[2]``, from 0)."""
    rules = _size_rules(f, field.as_array(), "minItems", "maxItems", "items")
    if f.schema.get("uniqueItems") is True:
        rules.append(_unique_items(f, field))
    return rules + _member_rules(f, field, today)


def _map_rules(f: Field, field: JsonField, today: Column) -> list[Violation]:
    """A map's ``minProperties`` and ``maxProperties``, then the rules of its values'
    schema, each naming the first member that breaks it (``counts.north``)."""
    rules = _size_rules(f, field.as_map(), "minProperties", "maxProperties", "members")
    return rules + _member_rules(f, field, today)


def _size_rules(
    f: Field, members: Column, low_keyword: str, high_keyword: str, noun: str
) -> list[Violation]:
    """``out_of_range`` where an array or a map has fewer members than ``low_keyword`` says,
    or more than ``high_keyword``."""
    size = F.when(members.isNotNull(), F.size(members))
    rules = []
    if low_keyword in f.schema:
        low = int(f.schema[low_keyword])
        detail = _detail(f.path, size.cast("string"), f" {noun} is below {low}")
        rules.append(Violation("out_of_range", size < low, detail))
    if high_keyword in f.schema:
        high = int(f.schema[high_keyword])
        detail = _detail(f.path, size.cast("string"), f" {noun} exceeds {high}")
        rules.append(Violation("out_of_range", size > high, detail))
    return rules


def _member_rules(f: Field, field: JsonField, today: Column) -> list[Violation]:
    """Each rule of ``f.item``'s schema, broken where a member of the array or map ``field``
    breaks it, its detail that of the first such member: read from the member checks
    `with_member_checks` staged."""
    checks = F.col(_checks_column(f))

    def first(key: str) -> Column:
        broken = F.filter(checks, lambda c: c[key].isNotNull())
        return F.try_element_at(broken, F.lit(1))[key]

    # The rules' codes, read from rules built for a member that is no column.
    placeholder = F.lit(None)
    codes = [r.code for r in _member_checks(f, field, placeholder, F.lit(""), today)]
    firsts = [(code, first(f"d{k}")) for k, code in enumerate(codes)]
    return [Violation(code, detail.isNotNull(), detail) for code, detail in firsts]


def with_member_checks(
    records: DataFrame, fields: Iterable[tuple[Field, JsonField]], today: Column
) -> DataFrame:
    """``records`` (staged by `stage_fields`) with, for each array or map of ``fields`` (and
    `member_fields`), its members' details: one struct per member, each rule's detail where
    the member breaks it, else null. Each rule is evaluated once per member here, whatever
    reads it."""
    columns = [
        F.transform(field.members(), _details(f, field, today)).alias(_checks_column(f))
        for f, field in fields
        if f.is_array or f.is_map
    ]
    return records.select("*", *columns) if columns else records


def member_fields(contract: Contract) -> list[tuple[Field, JsonField]]:
    """Every field of ``contract`` with its staged field, and a map field standing for the
    document's other members when its ``additionalProperties`` is a schema (staged by
    `with_other_members`)."""
    fields = json_fields(contract)
    pairs = [(f, staged_field(f, fields)) for f in contract.fields]
    root = _document_others(contract)
    return pairs + ([(root, json_field(root))] if root is not None else [])


def with_other_members(records: DataFrame, contract: Contract) -> DataFrame:
    """``records`` (staged by `stage_fields`) with the map and the members of each object's
    other members that an ``additionalProperties`` schema checks (the document's: its
    unknown top-level fields, kept in ``_rescued``; a nested object's: its ``<prefix>others``
    column)."""
    sites = [(json_field(f), members) for f, members in _other_members(contract)]
    if not sites:
        return records
    maps = records.select("*", *[field.staged_map(members) for field, members in sites])
    return maps.select("*", *[field.staged_members() for field, _ in sites])


def _other_members(contract: Contract) -> list[tuple[Field, Column]]:
    """(the map field standing for them, their map) of each object's other members an
    ``additionalProperties`` schema checks."""
    sites = []
    root = _document_others(contract)
    if root is not None:
        sites.append((root, _without(json_object(F.col("_json")), contract.top_level)))
    for f in contract.fields:
        if f.others:
            owner = contract.field(f.path)  # the nested object
            members = F.try_variant_get(json_field(owner).raw, "$", "map<string,variant>")
            sites.append((f, _without(members, list(owner.schema.get("properties", {})))))
    return sites


def _without(members: Column, names: Sequence[str]) -> Column:
    """The map ``members`` without the keys ``names``."""
    return F.map_filter(members, lambda k, _: ~k.isin(*names))


def _document_others(contract: Contract) -> Field | None:
    """A map field (path "") whose values' schema is the document's
    ``additionalProperties``, when that is a schema: its other members, kept in
    ``_rescued``."""
    others = contract.document.get("additionalProperties")
    if not isinstance(others, Mapping):
        return None
    map_schema = {"type": "object", "additionalProperties": others}
    return Field("", "", map_schema, "/additionalProperties", required=False)


def _details(f: Field, field: JsonField, today: Column) -> Callable[[Column], Column]:
    """A member's details (a struct of one per rule, null where it holds) as a function of
    the member, a lambda variable: its path ``tags[2]`` or ``counts.north``."""

    def details(member: Column) -> Column:
        path = (
            F.concat(F.lit(f"{f.path}["), member["key"], F.lit("]"))
            if f.is_array
            else F.concat(F.lit(f"{f.path}." if f.path else ""), member["key"])
        )
        rules = _member_checks(f, field, member, path, today)
        return F.struct(
            *[F.when(r.broken, r.detail).alias(f"d{k}") for k, r in enumerate(rules)],
            F.lit(True).alias("member"),  # a struct of no rule still has a field
        )

    return details


def _checks_column(f: Field) -> str:
    return "_checks_" + f.path.replace(".", "__")


def _member_checks(
    f: Field, field: JsonField, member: Column, path: Column, today: Column
) -> list[Violation]:
    """The rules of ``f.item``'s schema on ``member`` (at ``path``), in order."""
    rules = _value_rules(path, f.item.schema, field.item(member), today, "", F.lit(True))
    if f.item.is_object:
        rules += _item_object_rules(f, field, member, path, today)
    return rules


def _item_object_rules(
    f: Field, field: JsonField, member: Column, at: Column, today: Column
) -> list[Violation]:
    """The rules of an array's object ``member`` (at ``at``): each property's ``required``
    and own keywords, then its ``additionalProperties: false``."""
    is_object = field.item(member).kind == "object"
    rules = []
    for p in f.item.properties:
        value = field.item_property(member, p.column)
        where = F.concat(at, F.lit(f".{p.column}"))
        if p.required:
            missing = value.kind.isNull() | ((value.kind == "null") & F.lit(not p.nullable))
            rules.append(
                Violation("missing_field", is_object & missing, _detail(where, "required"))
            )
        rules += _value_rules(where, p.schema, value, today, "", F.lit(True))
    if f.item.schema.get("additionalProperties", True) is False:
        known = [p.column for p in f.item.properties]
        keys = F.map_keys(F.try_variant_get(field.item(member).raw, "$", "map<string,variant>"))
        unknown = F.filter(keys, lambda k: ~k.isin(*known))
        named = F.transform(unknown, lambda k: F.concat(at, F.lit("."), k))
        rules.append(
            Violation(
                "invalid_value",
                F.coalesce(F.size(unknown) > 0, F.lit(False)),
                F.concat(F.array_join(named, ", "), F.lit(": not a property of the contract")),
            )
        )
    return rules


def _unique_items(f: Field, field: JsonField) -> Violation:
    """``uniqueItems``: elements equal as JSON values (numbers by value: 1 and 1.0, 0 and -0
    are equal) are an ``invalid_value`` naming the first repeat and what it repeats."""
    numbers = "number" in f.item.types

    def key(member: Column) -> Column:
        element = field.item(member)
        text = F.to_json(element.raw)
        if not numbers:
            return text
        # + 0.0 turns -0.0 into 0.0.
        value = (element.as_double() + F.lit(0.0)).cast("string")
        return F.when(element.kind.isin("integer", "number"), value).otherwise(text)

    keys = F.transform(field.members(), key)

    def repeat(k: Column, i: Column) -> Column:
        first = F.array_position(keys, k) - 1
        return F.when(first < i, F.concat(
            F.lit(f"{f.path}["), i.cast("string"), F.lit(f"]: repeats {f.path}["),
            first.cast("string"), F.lit("] (uniqueItems)"),
        ))  # fmt: skip

    repeats = F.filter(F.transform(keys, repeat), lambda d: d.isNotNull())
    return Violation(
        "invalid_value",
        F.coalesce(F.size(F.array_distinct(keys)) < F.size(keys), F.lit(False)),
        F.try_element_at(repeats, F.lit(1)),
    )


def typed_record(contract: Contract, fast: FastValues | None = None) -> dict[str, Column]:
    """The typed columns of a valid payload (null where invalid) by name, in document order;
    with ``fast``, those of a row of the typed fast path: its values."""
    fields = json_fields(contract)
    columns = {}
    for f, column in zip(contract.leaves, contract.payload_columns(), strict=True):
        if fast is not None:
            value = fast.value(f)
        else:
            value = staged_field(f, fields).as_type(column.dataType)
        columns[column.name] = value.alias(column.name)
    return columns


class FastValues(Protocol):
    """The typed fast path's value of each leaf on its rows."""

    def value(self, f: Field) -> Column:
        """Leaf ``f``'s typed value on a fast row."""
        ...


def schema_id(contract: Contract) -> list[Column]:
    """The record's schema id column where ``contract`` is framed (`with_unframed_payload`)."""
    return [F.col(SCHEMA_ID_COLUMN).alias(SCHEMA_ID_COLUMN)] if contract.framed else []


def java_pattern(pattern: str) -> str:
    """A JSON Schema ``pattern`` (ECMA-262) as the Java regular expression Spark runs: each
    ``$`` outside a character class becomes ``\\z``, the end of the text, as in ECMA-262
    (Java's ``$`` also matches before a final line terminator)."""
    out, in_class, escaped = [], False, False
    for ch in pattern:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == "[" and not in_class:
            in_class = True
        elif ch == "]" and in_class:
            in_class = False
        elif ch == "$" and not in_class:
            out.append(r"\z")
            continue
        out.append(ch)
    return "".join(out)
