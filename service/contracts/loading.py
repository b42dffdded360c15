"""Finding, reading and checking contract files: the shipped ones and ``INGEST_CONTRACTS_DIR``'s.

Every ``*.json`` file of this package is a shipped contract; every ``*.json`` file of
``INGEST_CONTRACTS_DIR`` adds one, or replaces the shipped one of the same name. A
document must be a valid JSON Schema (draft 2020-12, checked against its meta-schema)
that uses only the keywords the engine compiles, each where it has an effect: anything
else (an unknown keyword, an extension value of the wrong type or range, a name that
points at nothing, a column the lake adds itself) is refused with one line naming the
file, the JSON pointer and what is wrong (`ContractError`, exit 2), never ignored. Local
references (``$ref`` to the document's ``$defs``) are resolved first
(`resolve_definitions`).
Annotations (``title``, ``description``, ``$comment``, ``examples``,
``default``, ``deprecated``) are kept and have no effect.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match

from service.contracts.model import (
    DERIVED_TYPES,
    FRAMINGS,
    Branch,
    Condition,
    Conditional,
    Contract,
    Derived,
    Field,
    Tables,
    flatten,
)
from service.contracts.silver import duplicates_schema, lake_columns
from service.errors import ContractError

SHIPPED_DIR = Path(__file__).resolve().parent
# The shipped contracts come first, in this order (then the others by name).
SHIPPED_ORDER = ("users", "sensors")
DRAFT = "https://json-schema.org/draft/2020-12/schema"
ANNOTATIONS = {"title", "description", "$comment", "examples", "default", "deprecated"}
VALUE_KEYWORDS = {
    "type", "enum", "const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "minLength", "maxLength", "pattern", "format", "x-lakehouse",
}  # fmt: skip
NUMBER_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_STRING_KEYWORDS = ("minLength", "maxLength", "pattern")
OBJECT_KEYWORDS = {"type", "properties", "required", "additionalProperties"}
_ARRAY_KEYWORDS = {"type", "items", "minItems", "maxItems", "uniqueItems"}
_MAP_KEYWORDS = {"type", "additionalProperties", "minProperties", "maxProperties"}
_ROOT_KEYWORDS = OBJECT_KEYWORDS | {"$schema", "$id", "allOf", "dependentRequired", "x-lakehouse"}
_FORMATS = ("date", "date-time")
_TYPES = ("null", "boolean", "integer", "number", "string", "object", "array")
_EXTENSION_KEYS = {
    "name", "topic", "key", "mode", "id", "order_by", "event_time", "max_future_seconds",
    "dedup_horizon_seconds", "partition_by", "flatten", "derived", "tables", "version",
    "stats_columns", "framing",
}  # fmt: skip
_FIELD_EXTENSION_KEYS = {"for", "minimum", "maximum", "mismatch"}
# Delta refuses these in a column name (without column mapping); a dot would read as a
# nested field's path.
_COLUMN_NAME_REFUSED = set(" ,;{}()\n\t=.")
# The names of an array's objects' properties (each a field of a struct column).
_ITEM_PROPERTY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Seconds whose microseconds still fit a 64-bit integer (the engine compares microseconds).
_MAX_SECONDS = 9_223_372_036_854
_SECONDS = {"type": "integer", "minimum": 0, "maximum": _MAX_SECONDS}
_NAME = {"type": "string", "minLength": 1}
_ANNOTATION_SCHEMAS: dict[str, Any] = {key: {} for key in ANNOTATIONS}
# The value types and ranges of the extension block's keys (its names and fields are
# checked against the document after).
_EXTENSION = Draft202012Validator(
    {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "topic": _NAME,
            "key": {"type": "string"},
            "id": {"type": "string"},
            "order_by": {"type": "string"},
            "event_time": {"type": "string"},
            "max_future_seconds": _SECONDS,
            "dedup_horizon_seconds": _SECONDS,
            "partition_by": {
                "type": "object",
                "required": ["column", "day_of"],
                "properties": {"column": _NAME, "day_of": _NAME},
                "additionalProperties": False,
            },
            "flatten": {"type": "object", "additionalProperties": {"type": "string"}},
            "derived": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["column", "type", "sql"],
                    "properties": {
                        "column": _NAME,
                        "type": {"enum": list(DERIVED_TYPES)},
                        "sql": _NAME,
                        **_ANNOTATION_SCHEMAS,
                    },
                    "additionalProperties": False,
                },
            },
            "tables": {"type": "object"},
            "version": {"type": "integer", "minimum": 0},
            "stats_columns": {"type": "array", "items": {"type": "string"}},
            "framing": {"enum": list(FRAMINGS)},
        },
    }
)
_DAY = {"type": "string", "pattern": "^(today|[0-9]{4}-[0-9]{2}-[0-9]{2})$"}
_FIELD_EXTENSION = Draft202012Validator(
    {
        "type": "object",
        "properties": {"for": _NAME, "minimum": _DAY, "maximum": _DAY, "mismatch": _NAME},
    }
)
# Extension keys only one mode reads, and why: a contract of the other mode that sets one
# is refused rather than ignored.
_MODE_ONLY_KEYS = {
    "events": {
        "id": "an entities contract has no event id (its key names the entity)",
        "dedup_horizon_seconds": "an entities contract keeps the newest change per key,"
        " it drops no duplicates by id",
        "partition_by": "an entities contract's silver table has no partition",
        "derived": "an entities contract's silver table has no derived columns",
    },
    "entities": {
        "order_by": "an events contract appends every record, it orders no changes",
    },
}
# INGEST_ALERTS_TOPIC is gold's alerts topic, not a contract's.
_RESERVED_NAMES = ("alerts",)
# The top-level keys of `reconcile --json` besides the contracts' (it reports each
# contract's check under the contract's name, beside these): "ok" and the fields of
# service.lake.invariants.Reconciliation, which this package cannot import
# (tests/unit/contracts/test_loading_refusals.py keeps the two lists equal).
REPORT_KEYS = (
    "ok", "storage_root", "since", "generated_at", "duration_seconds", "tables", "bronze",
    "checks", "gold", "problems", "skipped", "descriptions", "records",
)  # fmt: skip
# The lake's tables every contract shares (the quarantine, the offset gaps) and those
# written on an operator's word: no contract may name one as its own. service.lake.tables
# defines them, which this package cannot import (the same test keeps the two equal).
SHARED_TABLES = (
    "silver/quarantine",
    "bronze/offset_gaps",
    "silver/quarantine_replays",
    "bronze/skipped_offsets",
    "silver/promotions",
)


@dataclass(frozen=True)
class Contracts:
    """The contracts of a deployment, by name, in a stable order (shipped first)."""

    by_name: Mapping[str, Contract]

    def __iter__(self) -> Any:
        return iter(self.by_name.values())

    def __len__(self) -> int:
        return len(self.by_name)

    def __getitem__(self, name: str) -> Contract:
        return self.by_name[name]


def load_contracts(
    directory: str | None, topics: Mapping[str, str], names: Sequence[str] | None = None
) -> Contracts:
    """The shipped contracts and those of ``directory`` (which replace shipped ones of the
    same name), or only those named ``names``; ``topics`` overrides a contract's topic by
    contract name."""
    files = {p.stem: p for p in sorted(SHIPPED_DIR.glob("*.json"))}
    if directory:
        extra = Path(directory)
        if not extra.is_dir():
            raise ContractError(f"INGEST_CONTRACTS_DIR: {directory} is not a directory")
        files |= {p.stem: p for p in sorted(extra.glob("*.json"))}
    contracts = [read_contract(path, topics) for path in files.values()]
    if names is not None:
        known = {c.name for c in contracts}
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise ContractError(
                f"INGEST_CONTRACT_NAMES: no contract named {', '.join(unknown) or 'at all'} "
                f"(contracts: {', '.join(sorted(known))})"
            )
        contracts = [c for c in contracts if c.name in names]
    contracts.sort(
        key=lambda c: (SHIPPED_ORDER.index(c.name) if c.name in SHIPPED_ORDER else 99, c.name)
    )
    by_name: dict[str, Contract] = {}
    for contract in contracts:
        if contract.name in by_name:
            raise ContractError(
                f"{contract.source}: contract name {contract.name!r} is also that of "
                f"{by_name[contract.name].source}"
            )
        by_name[contract.name] = contract
    _refuse_shared_tables(by_name.values())
    return Contracts(by_name)


def read_contract(path: Path, topics: Mapping[str, str] | None = None) -> Contract:
    """The contract in the file at ``path``; `ContractError` naming what is wrong."""
    source = str(path)
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ContractError(f"{source}: not a readable JSON document: {e}") from None
    return parse_contract(document, source, path.stem, topics or {})


def parse_contract(
    document: Any, source: str, default_name: str, topics: Mapping[str, str]
) -> Contract:
    """Check ``document`` and read it as a contract (pure)."""
    if not isinstance(document, dict):
        raise ContractError(f"{source}: a contract is a JSON object (a JSON Schema document)")
    if document.get("$schema", DRAFT) != DRAFT:
        raise _unsupported(source, "/$schema", "$schema", f"only {DRAFT} is supported")
    try:
        Draft202012Validator.check_schema(document)
    except SchemaError as e:
        where = _pointer("", e.absolute_path)
        raise ContractError(
            _one_line(f"{source}: not a valid JSON Schema at {where}: {e.message}")
        ) from None
    document = type_unions(resolve_definitions(source, document))
    _check_root(source, document)
    extension: Mapping[str, Any] = document.get("x-lakehouse", {})
    _check_extension_values(source, extension)
    name = str(extension.get("name", default_name))
    if not name.isidentifier() or not name.islower() or name in _RESERVED_NAMES:
        raise _bad(source, "/x-lakehouse/name", f"{name!r} is not a lower-case identifier"
                   f" (nor one of {', '.join(_RESERVED_NAMES)})")  # fmt: skip
    if name in REPORT_KEYS:
        raise _bad(source, "/x-lakehouse/name", f"{name!r} is reserved: `reconcile --json`"
                   " reports each contract under its name beside its own keys"
                   f" ({', '.join(REPORT_KEYS)})")  # fmt: skip
    mode = _mode(source, extension)
    for only, keys in _MODE_ONLY_KEYS.items():
        for key, why in keys.items():
            if key in extension and mode != only:
                raise _bad(source, f"/x-lakehouse/{key}", f"{key} is for {only} contracts: {why}")
    prefixes = dict(extension.get("flatten", {}))
    fields = tuple(flatten(document.get("properties", {}), document.get("required", ()), prefixes))
    paths = {f.path: f for f in fields if not f.others}
    conditionals = tuple(_conditionals(source, document, paths))
    partition = extension.get("partition_by")
    contract = Contract(
        name=name,
        source=source,
        document=document,
        topic=topics.get(name, str(extension.get("topic", name))),
        mode=mode,
        fields=fields,
        conditionals=conditionals,
        tables=_tables(source, name, extension),
        id_field=extension.get("id"),
        key=extension.get("key"),
        order_by=extension.get("order_by"),
        event_time=extension.get("event_time"),
        max_future_seconds=_integer(extension.get("max_future_seconds")),
        dedup_horizon_seconds=_integer(extension.get("dedup_horizon_seconds")),
        partition=(partition["column"], partition["day_of"]) if partition else None,
        derived=tuple(
            Derived(d["column"], DERIVED_TYPES[d["type"]], d["sql"])
            for d in extension.get("derived", ())
        ),
        rescue_unknown=document.get("additionalProperties", True) is not False,
        version=_integer(extension.get("version")),
        stats_columns=tuple(extension.get("stats_columns", ())),
        framing=extension.get("framing", "none"),
    )
    _check_extension(contract, extension)
    _check_columns(contract)
    return contract


_DEFS = "#/$defs/"
# The keywords whose values are schemas (or lists or maps of schemas), where a `$ref` may
# stand: a walk into any other keyword's value would read data (`const`, `default`, ...).
_SCHEMA_MAPS = ("properties",)
_SCHEMA_LISTS = ("allOf",)
_SCHEMA_VALUES = ("if", "then", "else", "additionalProperties", "items")


def resolve_definitions(source: str, document: Mapping[str, Any]) -> Mapping[str, Any]:
    """``document`` with each local ``{"$ref": "#/$defs/Name"}`` replaced by that definition
    (pure), and without ``$defs``: the engine, the lake's recorded document and evolution
    see what a reference means, not how it is spelt. A document without ``$defs`` comes
    back as it is.

    Keywords beside a ``$ref`` apply with it, as in JSON Schema: each is added to the
    definition's, an annotation replaces the definition's, and a keyword both set to
    different values is refused (one place says it). A reference to anything but a
    definition of this document, to a missing one, or in a cycle, and a definition no
    reference uses, are refused.
    """
    definitions = document.get("$defs", {})
    if "$defs" not in document and not _mentions(document, ("$ref",)):
        return document

    def resolved(schema: Any, pointer: str, stack: tuple[str, ...]) -> Any:
        if not isinstance(schema, dict):
            return schema
        node = dict(schema)
        if "$ref" in node:
            node = referenced(node, pointer, stack)
        return _with_subschemas(node, pointer, lambda s, at: resolved(s, at, stack))

    def referenced(node: dict[str, Any], pointer: str, stack: tuple[str, ...]) -> dict[str, Any]:
        target = node.pop("$ref")
        at = f"{pointer}/$ref"
        name = target[len(_DEFS) :] if isinstance(target, str) else ""
        if not isinstance(target, str) or not target.startswith(_DEFS) or "/" in name:
            raise _bad(source, at, f"{json.dumps(target)} is not a definition of this document:"
                       ' a $ref names one of its $defs ("#/$defs/Name")')  # fmt: skip
        name = name.replace("~1", "/").replace("~0", "~")
        if name not in definitions:
            raise _bad(source, at, f"{json.dumps(target)}: no definition {name!r} under /$defs")
        if name in stack:
            cycle = " -> ".join((*stack[stack.index(name) :], name))
            raise _bad(source, at, f"the definitions refer to themselves ({cycle}): a contract's"
                       " fields are finite, a recursive type has no column")  # fmt: skip
        used.add(name)
        body = resolved(definitions[name], _pointer("/$defs", [name]), (*stack, name))
        if not isinstance(body, dict):
            raise _bad(source, _pointer("/$defs", [name]), "a boolean schema is not supported"
                       " by the engine: write an object with the keywords docs/contracts.md"
                       " lists")  # fmt: skip
        merged = dict(body)
        for key, value in node.items():
            if key in merged and merged[key] != value and key not in ANNOTATIONS:
                why = f"{key!r} is set here and, to another value, in the definition {target}"
                raise _bad(source, _pointer(pointer, [key]), f"{why}: say it in one place")
            merged[key] = value
        return merged

    used: set[str] = set()
    result: dict[str, Any] = resolved({k: v for k, v in document.items() if k != "$defs"}, "", ())
    for name in definitions:
        if name not in used:
            why = "no $ref of the contract names this definition"
            raise _bad(source, _pointer("/$defs", [name]), f"{why}: remove it (never ignored)")
    return result


def _mentions(schema: Any, keywords: Sequence[str]) -> bool:
    if isinstance(schema, dict):
        return any(k in schema for k in keywords) or any(
            _mentions(v, keywords) for v in schema.values()
        )
    if isinstance(schema, list):
        return any(_mentions(v, keywords) for v in schema)
    return False


def type_unions(document: Mapping[str, Any]) -> Mapping[str, Any]:
    """``document`` with each ``oneOf``/``anyOf`` whose alternatives only name a type each
    (``[{"type": "string"}, {"type": "null"}]``) written as that union of types (pure), where
    the schema declares no ``type`` of its own. A ``oneOf`` of ``integer`` and ``number`` is
    left alone (an integer matches both, so none is valid), as is any other: the keyword
    check refuses it. A document without either keyword comes back as it is."""
    if not _mentions(document, ("oneOf", "anyOf")):
        return document

    def union(alternatives: Any, exclusive: bool) -> list[str] | None:
        if not isinstance(alternatives, list) or not alternatives:
            return None
        kinds: list[str] = []
        for alternative in alternatives:
            if not isinstance(alternative, dict) or not isinstance(alternative.get("type"), str):
                return None
            if set(alternative) - {"type"} - ANNOTATIONS:
                return None
            kinds.append(alternative["type"])
        if exclusive and (len(set(kinds)) < len(kinds) or {"integer", "number"} <= set(kinds)):
            return None
        return list(dict.fromkeys(kinds))

    def rewritten(schema: Any) -> Any:
        if not isinstance(schema, dict):
            return schema
        node = dict(schema)
        for keyword in ("oneOf", "anyOf"):
            kinds = union(node.get(keyword), exclusive=keyword == "oneOf")
            if kinds is not None and "type" not in node:
                del node[keyword]
                node["type"] = kinds[0] if len(kinds) == 1 else kinds
        return _with_subschemas(node, "", lambda s, _: rewritten(s))

    result: dict[str, Any] = rewritten(document)
    return result


def _with_subschemas(
    node: dict[str, Any], pointer: str, apply: Callable[[Any, str], Any]
) -> dict[str, Any]:
    """``node`` with ``apply(schema, its pointer)`` in place of each schema directly under it
    (its properties, allOf entries, if/then/else, additionalProperties)."""
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            node[key] = {
                name: apply(value, _pointer(f"{pointer}/{key}", [name]))
                for name, value in node[key].items()
            }
    for key in _SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            node[key] = [apply(value, f"{pointer}/{key}/{i}") for i, value in enumerate(node[key])]
    for key in _SCHEMA_VALUES:
        if key in node:
            node[key] = apply(node[key], f"{pointer}/{key}")
    return node


def _unsupported(source: str, pointer: str, keyword: str, why: str = "") -> ContractError:
    reason = f": {why}" if why else ""
    return _bad(
        source,
        pointer,
        f"keyword {keyword!r} is not supported by the engine{reason}"
        " (docs/contracts.md lists the keywords it compiles)",
    )


def _bad(source: str, pointer: str, why: str) -> ContractError:
    return ContractError(_one_line(f"{source}: {pointer}: {why}"))


def _one_line(text: str) -> str:
    """``text`` with its unprintable characters escaped (a name may hold a line break)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _pointer(base: str, path: Iterable[Any]) -> str:
    """``base`` followed by the JSON pointer of ``path`` (its keys and indexes)."""
    parts = [str(p).replace("~", "~0").replace("/", "~1") for p in path]
    return base + "".join(f"/{p}" for p in parts) if parts or base else "/"


def _integer(value: Any) -> int | None:
    # JSON Schema's "integer" admits 60.0: the contract keeps it as 60.
    return None if value is None else int(value)


def _check_schema_object(source: str, schema: Any, pointer: str) -> None:
    if not isinstance(schema, dict):
        # A boolean schema (true: anything, false: nothing) declares no type to compile.
        raise _bad(source, pointer or "/", "a boolean schema is not supported by the engine:"
                   " write an object with the keywords docs/contracts.md lists")  # fmt: skip


# Why the engine does not compile a keyword users reach for, and what to write instead.
_UNSUPPORTED_WHY = {
    "oneOf": "only alternatives that each name a type alone are read (as a union of types);"
    " alternatives of rules are written as if/then/else",
    "anyOf": "only alternatives that each name a type alone are read (as a union of types);"
    " alternatives of rules are written as if/then/else",
    "items": "items types the elements of a property of type array",
    "prefixItems": "an array's elements share one schema (items); a tuple is not typed",
    "contains": "an array's elements share one schema (items)",
    "$defs": "definitions stand under the document's root $defs",
}


def _check_keywords(source: str, schema: Any, pointer: str, allowed: set[str]) -> None:
    _check_schema_object(source, schema, pointer)
    for keyword in schema:
        if keyword not in allowed and keyword not in ANNOTATIONS:
            why = _UNSUPPORTED_WHY.get(keyword, "")
            raise _unsupported(source, f"{pointer}/{keyword}", keyword, why)


def _check_root(source: str, document: Mapping[str, Any]) -> None:
    _check_keywords(source, document, "", _ROOT_KEYWORDS)
    if document.get("type") != "object":
        raise _bad(source, "/type", 'a contract describes a JSON object: "type": "object"')
    _check_object(source, document, "")
    for i, rule in enumerate(document.get("allOf", ())):
        at = f"/allOf/{i}"
        _check_keywords(source, rule, at, {"if", "then", "else"})
        if "if" not in rule:
            raise _bad(source, at, "an allOf entry is an if/then/else rule")
        _check_keywords(source, rule["if"], f"{at}/if", {"required", "properties"})
        for name, condition in rule["if"].get("properties", {}).items():
            where = f"{at}/if/properties/{name}"
            _check_keywords(source, condition, where, {"const", "enum"})
            if not {"const", "enum"} & set(condition):
                raise _bad(source, where, "an if names the values it holds for: const or enum")
            _check_scalar_values(source, condition, where)
        for branch in ("then", "else"):
            if branch in rule:
                _check_branch(source, document, rule[branch], f"{at}/{branch}")


def _check_object(source: str, schema: Mapping[str, Any], pointer: str) -> None:
    additional = schema.get("additionalProperties", True)
    if isinstance(additional, dict):
        _check_others(source, additional, f"{pointer}/additionalProperties")
    declared = schema.get("properties", {})
    for i, name in enumerate(schema.get("required", ())):
        if name not in declared:
            # A validator would refuse every record without it; the engine checks only
            # the fields it declares.
            raise _bad(
                source, f"{pointer}/required/{i}",
                f"{name!r} is required but not a property (declare it under properties)",
            )  # fmt: skip
    for name, prop in declared.items():
        at = _pointer(f"{pointer}/properties", [name])
        _check_schema_object(source, prop, at)
        types = prop.get("type")
        if types is None:
            for keyword in ("oneOf", "anyOf"):
                if keyword in prop:  # alternatives `type_unions` could not read as types
                    why = _UNSUPPORTED_WHY[keyword]
                    raise _unsupported(source, f"{at}/{keyword}", keyword, why)
            raise _bad(source, at, "every property declares its type")
        kinds = [types] if isinstance(types, str) else list(types)
        for kind in kinds:
            if kind not in _TYPES:
                raise _unsupported(source, f"{at}/type", "type", f"type {kind!r}")
        if "object" in kinds:
            if set(kinds) - {"object", "null"}:
                raise _unsupported(source, f"{at}/type", "type", "an object or null, not both")
            if "properties" not in prop and isinstance(prop.get("additionalProperties"), dict):
                _check_members(source, prop, at, kinds, "map")
                continue
            if "x-lakehouse" in prop:
                raise _bad(source, f"{at}/x-lakehouse", "a nested object has no x-lakehouse"
                           " block: its columns' prefix is the contract's x-lakehouse.flatten,"
                           " its fields' annotations go on each field")  # fmt: skip
            _check_keywords(source, prop, at, OBJECT_KEYWORDS)
            _check_object(source, prop, at)
            continue
        if "array" in kinds:
            _check_members(source, prop, at, kinds, "array")
            continue
        _check_value(source, prop, at, kinds, in_branch=False)


# An array's and a map's: their own type, the keyword of their members' schema and its
# words, their other keywords, the words of their members, and their size keywords.
_MEMBERS = {
    "array": ("array", "items", "its elements'", _ARRAY_KEYWORDS, "elements",
              ("minItems", "maxItems")),
    "map": ("object", "additionalProperties", "its values'", _MAP_KEYWORDS, "values",
            ("minProperties", "maxProperties")),
}  # fmt: skip


def _check_item_object(
    source: str, item: Mapping[str, Any], pointer: str, kinds: list[str]
) -> None:
    """An array's elements as objects (or null) of scalar properties."""
    if set(kinds) - {"object", "null"}:
        raise _unsupported(source, f"{pointer}/type", "type", "an object or null, not both")
    if "x-lakehouse" in item:
        raise _bad(source, f"{pointer}/x-lakehouse", "an array's objects have no x-lakehouse"
                   " block: their properties' annotations go on each property")  # fmt: skip
    _check_keywords(source, item, pointer, OBJECT_KEYWORDS)
    if isinstance(item.get("additionalProperties"), dict):
        raise _unsupported(source, f"{pointer}/additionalProperties", "additionalProperties",
                           "an array's objects take true or false, not a schema")  # fmt: skip
    if "properties" not in item:
        raise _bad(source, pointer, "an array's objects declare their properties (an array"
                   " of free-form objects is not typed: leave the property undeclared, it is"
                   " kept in _rescued)")  # fmt: skip
    seen: dict[str, str] = {}
    for name, prop in item["properties"].items():
        at = _pointer(f"{pointer}/properties", [name])
        if not _ITEM_PROPERTY_NAME.fullmatch(name):
            raise _bad(source, at, f"{name!r} cannot name a field of an array's objects:"
                       " letters, digits and _, not first a digit")  # fmt: skip
        if name.lower() in seen:
            raise _bad(source, at, f"{name!r} and {seen[name.lower()]!r} name one field of an"
                       " array's objects (Spark compares names ignoring case)")  # fmt: skip
        seen[name.lower()] = name
        types = prop.get("type") if isinstance(prop, dict) else None
        prop_kinds = [types] if isinstance(types, str) else list(types or ())
        for compound in ("object", "array"):
            if compound in prop_kinds:
                raise _unsupported(source, f"{at}/type", "type", f"an array's objects hold"
                                   f" scalars (or null), not {compound}s: leave the property"
                                   " undeclared, it is kept in _rescued")  # fmt: skip
    _check_object(source, item, pointer)


def _check_others(source: str, schema: Mapping[str, Any], pointer: str) -> None:
    """An ``additionalProperties`` schema beside ``properties``: a scalar field's, which
    every other member of the object must meet."""
    _check_scalar_schema(
        source, schema, pointer, "additionalProperties declares the other members' type",
        lambda compound: f"the other members are scalars (or null), not {compound}s: true"
        " keeps them unchecked",
    )  # fmt: skip


def _check_scalar_schema(
    source: str, schema: Any, pointer: str, untyped: str, not_scalar: Callable[[str], str]
) -> None:
    """A schema of a scalar type (or null) that members of an array, a map or an object
    meet: ``untyped`` refuses one without a type, ``not_scalar`` words an object or array
    type's refusal."""
    _check_schema_object(source, schema, pointer)
    kinds = _kinds(schema)
    if not kinds:
        raise _bad(source, pointer, untyped)
    for compound in ("object", "array"):
        if compound in kinds:
            raise _unsupported(source, f"{pointer}/type", "type", not_scalar(compound))
    for kind in kinds:
        if kind not in _TYPES:
            raise _unsupported(source, f"{pointer}/type", "type", f"type {kind!r}")
    _check_value(source, schema, pointer, kinds, in_branch=False)


def _kinds(schema: Mapping[str, Any]) -> list[str]:
    """The types a schema's ``type`` names (none without one)."""
    types = schema.get("type")
    return [types] if isinstance(types, str) else list(types or ())


def _a(noun: str) -> str:
    """``noun`` with its indefinite article."""
    return f"an {noun}" if noun[0] in "aeiou" else f"a {noun}"


def _check_members(
    source: str, schema: Mapping[str, Any], pointer: str, kinds: list[str], what: str
) -> None:
    """An array (``items``) or a map (``additionalProperties``), or null, whose members have
    one scalar field's schema."""
    kind, keyword, their, allowed, members, (low_keyword, high_keyword) = _MEMBERS[what]
    if set(kinds) - {kind, "null"}:
        raise _unsupported(source, f"{pointer}/type", "type", f"{_a(what)} or null, not both")
    if "x-lakehouse" in schema:
        raise _bad(source, f"{pointer}/x-lakehouse", f"{_a(what)} has no x-lakehouse block:"
                   f" {their} annotations go in its {keyword}")  # fmt: skip
    _check_keywords(source, schema, pointer, allowed)
    if keyword not in schema:
        raise _bad(source, pointer, f"{_a(what)} declares {their} schema ({keyword})")
    at, member = f"{pointer}/{keyword}", schema[keyword]
    _check_schema_object(source, member, at)
    if what == "array" and "object" in _kinds(member):
        _check_item_object(source, member, at, _kinds(member))
        if "uniqueItems" in schema:
            raise _unsupported(source, f"{pointer}/uniqueItems", "uniqueItems", "it compares"
                               " scalars, and this array's elements are objects")  # fmt: skip
    else:
        also = ", or objects" if what == "array" else ""
        _check_scalar_schema(
            source, member, at, f"{keyword} declares {their} type",
            lambda compound: f"{_a(what)}'s {members} are scalars (or null){also}, not"
            f" {compound}s: leave the property undeclared, it is kept in _rescued",
        )  # fmt: skip
    low, high = schema.get(low_keyword), schema.get(high_keyword)
    if low is not None and high is not None and low > high:
        raise _bad(source, pointer, f"{low_keyword} {low} is above {high_keyword} {high}:"
                   " every value would be out of range")  # fmt: skip


def _check_value(
    source: str, schema: Mapping[str, Any], pointer: str, kinds: list[str], in_branch: bool
) -> None:
    _check_keywords(source, schema, pointer, VALUE_KEYWORDS)
    fmt = schema.get("format")
    if fmt is not None:
        if fmt not in _FORMATS:
            raise _unsupported(source, f"{pointer}/format", "format", f"{fmt!r}")
        if fmt == "date" and set(kinds) - {"string", "null"}:
            raise _bad(source, pointer, 'format "date" is a string (or null)')
        if fmt == "date-time" and set(kinds) - {"string", "integer", "null"}:
            raise _bad(source, pointer, 'format "date-time" is a string or epoch milliseconds')
    scalar = [k for k in kinds if k != "null"]
    if not scalar:
        raise _bad(source, f"{pointer}/type", "a field of type null only holds nothing")
    if len(scalar) > 1 and set(scalar) not in ({"integer", "number"}, {"string", "integer"}):
        raise _unsupported(source, f"{pointer}/type", "type", f"the union {scalar}")
    if set(scalar) == {"string", "integer"} and fmt != "date-time":
        raise _bad(source, f"{pointer}/type", 'string or integer only as "format": "date-time"')
    shown = " or ".join(scalar) + (f' ("format": "{fmt}")' if fmt else "")
    for keyword in NUMBER_KEYWORDS:
        # The engine bounds numbers without a format (as JSON Schema, it leaves other
        # values alone): elsewhere the bound would never be checked.
        if keyword in schema and (fmt is not None or not {"integer", "number"} & set(scalar)):
            raise _bad(source, f"{pointer}/{keyword}", f"{keyword} bounds a number without a"
                       f" format, and this property is {shown}: it would never apply")  # fmt: skip
    for keyword in _STRING_KEYWORDS:
        if keyword in schema and "string" not in scalar:
            raise _bad(source, f"{pointer}/{keyword}", f"{keyword} applies to strings, and this"
                       f" property is {shown}: it would never apply")  # fmt: skip
    _check_scalar_values(source, schema, pointer)
    _check_field_extension(source, schema, pointer, in_branch)


def _check_scalar_values(source: str, schema: Mapping[str, Any], pointer: str) -> None:
    """``enum`` and ``const`` hold strings, numbers, booleans or null: what a field is."""
    values = [("const", schema["const"])] if "const" in schema else []
    values += [(f"enum/{i}", v) for i, v in enumerate(schema.get("enum", ()))]
    for where, value in values:
        if isinstance(value, dict | list):
            raise _bad(source, f"{pointer}/{where}", f"{json.dumps(value)} is not a string,"
                       " number, boolean or null: no field of the contract holds it")  # fmt: skip


def _check_field_extension(
    source: str, schema: Mapping[str, Any], pointer: str, in_branch: bool
) -> None:
    extension = schema.get("x-lakehouse", {})
    at = f"{pointer}/x-lakehouse"
    if not isinstance(extension, dict):
        raise _bad(source, at, "an x-lakehouse annotation is a JSON object")
    for key in extension:
        if key not in _FIELD_EXTENSION_KEYS:
            raise _unsupported(source, f"{at}/{key}", key)
    error = best_match(_FIELD_EXTENSION.iter_errors(extension))
    if error is not None:
        raise _bad(source, _pointer(at, error.absolute_path), error.message)
    if "for" in extension and not in_branch:
        raise _bad(source, f"{at}/for", "for labels the rules of a then/else; a property's"
                   " own rules have no label")  # fmt: skip
    if "mismatch" in extension and "pattern" not in schema:
        raise _bad(source, f"{at}/mismatch", "mismatch words the detail of the property's"
                   " pattern, and it has none")  # fmt: skip
    days = {}
    for key in ("minimum", "maximum"):
        if key not in extension:
            continue
        if schema.get("format") != "date":
            raise _bad(source, f"{at}/{key}", f"x-lakehouse {key} bounds a"
                       ' "format": "date" property, and this one is not')  # fmt: skip
        if extension[key] != "today":
            try:
                days[key] = datetime.date.fromisoformat(extension[key])
            except ValueError:
                raise _bad(source, f"{at}/{key}", f"{extension[key]!r} is not a day of"
                           " years 1-9999 (YYYY-MM-DD) nor today") from None  # fmt: skip
    if len(days) == 2 and days["minimum"] > days["maximum"]:
        raise _bad(source, at, f"minimum {days['minimum']} is after maximum {days['maximum']}:"
                   " every value would be out of range")  # fmt: skip


def _branch_properties(
    document: Mapping[str, Any], branch: Mapping[str, Any]
) -> dict[str, Mapping[str, Any]]:
    """A ``then``/``else``'s properties, each without a ``type`` given its base property's
    ``type`` and ``format``: as in JSON Schema, its keywords narrow what the record's field
    already is (``{"maximum": 1000}`` bounds the number the property declares)."""
    base = document.get("properties", {})
    result = {}
    for name, schema in branch.get("properties", {}).items():
        if isinstance(schema, dict) and "type" not in schema and name in base:
            inherited = {k: base[name][k] for k in ("type", "format") if k in base[name]}
            schema = {**inherited, **schema}
        result[name] = schema
    return result


def _check_branch(
    source: str, document: Mapping[str, Any], branch: Mapping[str, Any], pointer: str
) -> None:
    _check_keywords(source, branch, pointer, {"required", "properties", "x-lakehouse"})
    extension = branch.get("x-lakehouse", {})
    if not isinstance(extension, dict):
        raise _bad(source, f"{pointer}/x-lakehouse", "an x-lakehouse annotation is a JSON object")
    for key, value in extension.items():
        if key != "for":
            raise _unsupported(source, f"{pointer}/x-lakehouse/{key}", key,
                               "a then/else's x-lakehouse holds only its label, for")  # fmt: skip
        if not isinstance(value, str) or not value:
            raise _bad(source, f"{pointer}/x-lakehouse/for", "the label is a non-empty string")
    base = document.get("properties", {})
    for name, prop in _branch_properties(document, branch).items():
        at = _pointer(f"{pointer}/properties", [name])
        if name not in base:
            raise _bad(source, f"{pointer}/properties",
                       f"{name!r} is not a top-level property of the contract")  # fmt: skip
        _check_schema_object(source, prop, at)
        types = prop["type"]
        kinds = [types] if isinstance(types, str) else list(types)
        for compound in ("object", "array"):
            if compound in kinds or compound in base[name].get("type", ()):
                raise _bad(source, at, f"{name!r} is an {compound}: a then/else has no rules"
                           " for one")  # fmt: skip
        _check_value(source, prop, at, kinds, in_branch=True)


def _conditionals(
    source: str, document: Mapping[str, Any], fields: Mapping[str, Field]
) -> Iterable[Conditional]:
    # The rules apply to the record itself: they name its top-level properties (a nested
    # field's path, "geolocation.city", is to JSON Schema a top-level name with a dot).
    top_level = {path for path, f in fields.items() if f.pointer == f"/properties/{path}"}

    def known(names: Sequence[str], pointer: str) -> tuple[str, ...]:
        for name in names:
            if name not in top_level:
                raise _bad(source, pointer, f"{name!r} is not a top-level property of the contract")
        return tuple(names)

    for i, rule in enumerate(document.get("allOf", ())):
        at = f"/allOf/{i}"
        condition = rule["if"]
        equals = {
            name: (tuple(c["enum"]) if "enum" in c else (c["const"],))
            for name, c in condition.get("properties", {}).items()
        }
        when = Condition(known(condition.get("required", ()), f"{at}/if"), equals)
        known(list(equals), f"{at}/if")
        for name in equals:
            if fields[name].is_array or fields[name].is_map:
                noun = "array" if fields[name].is_array else "map"
                where = _pointer(f"{at}/if/properties", [name])
                raise _bad(source, where, f"{name!r} is {_a(noun)}: an if compares a field"
                           f" with values, which no {noun} is")  # fmt: skip
        default = " when " + " and ".join(
            f"{k} is {'/'.join(map(str, v))}" for k, v in equals.items()
        )
        branches: list[Branch | None] = []
        for kind in ("then", "else"):
            if kind not in rule:
                branches.append(None)
                continue
            b = rule[kind]
            known(b.get("required", ()), f"{at}/{kind}/required")
            known(list(b.get("properties", {})), f"{at}/{kind}/properties")
            label = b.get("x-lakehouse", {}).get("for")
            suffix = f" for {label}" if label else (default if kind == "then" else " otherwise")
            branches.append(
                Branch(
                    tuple(b.get("required", ())),
                    _branch_properties(document, b),
                    suffix,
                    f"{at}/{kind}",
                )
            )
        yield Conditional(when, branches[0], branches[1])
    for name, needed in document.get("dependentRequired", {}).items():
        at = f"/dependentRequired/{name}"
        known([name, *needed], at)
        yield Conditional(
            Condition((name,), {}),
            Branch(tuple(needed), {}, f" when {name} is present", at),
            None,
        )


def _mode(source: str, extension: Mapping[str, Any]) -> Any:
    mode = extension.get("mode")
    if mode not in ("events", "entities"):
        raise _bad(source, "/x-lakehouse/mode", '"events" (append) or "entities" (upsert by key)')
    return mode


def _tables(source: str, name: str, extension: Mapping[str, Any]) -> Tables:
    given = dict(extension.get("tables", {}))
    unknown = set(given) - {"bronze", "silver", "duplicates"}
    if unknown:
        raise _bad(source, "/x-lakehouse/tables", f"unknown table kinds {sorted(unknown)}")
    if "duplicates" in given and extension["mode"] == "entities":
        raise _bad(source, "/x-lakehouse/tables/duplicates", "an entities contract has no"
                   " duplicates table: it keeps the newest change per key")  # fmt: skip
    duplicates = given.get("duplicates", f"silver/{name}_duplicates")
    tables = Tables(
        bronze=given.get("bronze", f"bronze/{name}"),
        silver=given.get("silver", f"silver/{name}"),
        duplicates=duplicates if extension["mode"] == "events" else None,
    )
    named = [("bronze", "bronze", tables.bronze), ("silver", "silver", tables.silver)]
    if tables.duplicates is not None:
        named.append(("duplicates", "silver", tables.duplicates))
    for kind, layer, table in named:
        pointer = f"/x-lakehouse/tables/{kind}"
        prefix, _, rest = table.partition("/") if isinstance(table, str) else ("", "", "")
        if prefix != layer or rest in ("", ".", "..") or "/" in rest:
            raise _bad(source, pointer, f"{table!r} is not {layer}/<name>")
        if table in SHARED_TABLES:
            raise _bad(source, pointer, f"{table} is one of the lake's own tables"
                       f" ({', '.join(SHARED_TABLES)}), not a contract's")  # fmt: skip
    return tables


def _check_extension_values(source: str, extension: Any) -> None:
    """The extension block's keys are known and their values of the right type and range."""
    if not isinstance(extension, dict):
        raise _bad(source, "/x-lakehouse", "the extension block is a JSON object")
    for key in extension:
        if key not in _EXTENSION_KEYS:
            raise _unsupported(source, f"/x-lakehouse/{key}", key)
    error = best_match(_EXTENSION.iter_errors(extension))
    if error is not None:
        raise _bad(source, _pointer("/x-lakehouse", error.absolute_path), error.message)


def _check_extension(contract: Contract, extension: Mapping[str, Any]) -> None:
    source = contract.source

    def top_field(key: str, value: str | None, formats: tuple[str | None, ...]) -> Field:
        pointer = f"/x-lakehouse/{key}"
        if value is None or value not in contract.top_level:
            raise _bad(source, pointer, f"{value!r} is not a top-level property of the contract")
        f = contract.field(value)
        if not f.required or f.nullable or f.format not in formats:
            raise _bad(source, pointer, f"{value!r} must be a required, non-null "
                       + " or ".join(x or "plain" for x in formats) + " property")  # fmt: skip
        return f

    if contract.mode == "events":
        if top_field("id", contract.id_field, (None,)).types != ("string",):
            raise _bad(source, "/x-lakehouse/id", "the id of an events contract is a string")
        # The key only says what the Kafka key holds, but it must say it of a field.
        if contract.key is not None and contract.key not in contract.top_level:
            raise _bad(source, "/x-lakehouse/key",
                       f"{contract.key!r} is not a top-level property of the contract")  # fmt: skip
    else:
        entity_key = top_field("key", contract.key, (None,))
        if set(entity_key.types) - {"integer", "string"}:
            raise _bad(source, "/x-lakehouse/key", "an entity key is an integer or a string")
        top_field("order_by", contract.order_by, ("date-time",))
    if contract.event_time is not None:
        top_field("event_time", contract.event_time, ("date-time",))
    if contract.partition is not None:
        top_field("partition_by/day_of", contract.partition[1], ("date-time",))
    objects = {f.path for f in contract.fields if f.is_object}
    for path in extension.get("flatten", {}):
        if path not in objects:
            nested = ", ".join(sorted(objects)) or "none"
            raise _bad(
                source,
                _pointer("/x-lakehouse/flatten", [path]),
                f"{path!r} is not a nested object of the contract (those: {nested})",
            )


def _check_columns(contract: Contract) -> None:
    """Every column the contract makes (its fields', its derived ones, its partition) has a
    name Delta takes, and one of its own: not another's, nor one the lake adds to silver
    (compared as Spark does, ignoring case)."""
    source = contract.source
    made = [(f.column, f.pointer) for f in contract.leaves]
    made += [(d.column, f"/x-lakehouse/derived/{i}/column") for i, d in enumerate(contract.derived)]
    if contract.partition is not None:
        made.append((contract.partition[0], "/x-lakehouse/partition_by/column"))
    lake = [c.name for c in lake_columns(contract.mode)]
    seen: dict[str, str] = {}
    for column, pointer in made:
        if not column or set(column) & _COLUMN_NAME_REFUSED:
            raise _bad(source, pointer, f"{column!r} cannot name a column: Delta refuses"
                       " spaces and ,;{}()=, tabs and newlines, a dot would read as a nested"
                       " field")  # fmt: skip
        if column.lower() in {c.lower() for c in lake}:
            raise _bad(source, pointer, f"column {column!r} is one the lake adds to"
                       f" {contract.tables.silver} ({', '.join(lake)})")  # fmt: skip
        if column.lower() in seen:
            raise _bad(source, pointer, f"column {column!r} is also made by"
                       f" {seen[column.lower()]}")  # fmt: skip
        seen[column.lower()] = pointer
    names = {column.lower() for column, _ in made}
    compounds = {f.column.lower(): f for f in contract.leaves if f.is_array or f.is_map}
    for i, column in enumerate(contract.stats_columns):
        if column.lower() not in names:
            raise _bad(source, f"/x-lakehouse/stats_columns/{i}", f"{column!r} is not a column"
                       " the contract makes (a field's, a derived one)")  # fmt: skip
        if column.lower() in compounds:
            noun = "array" if compounds[column.lower()].is_array else "map"
            raise _bad(source, f"/x-lakehouse/stats_columns/{i}", f"{column!r} is {_a(noun)}:"
                       " Delta keeps no file statistics of one")  # fmt: skip
    if contract.tables.duplicates is not None:
        kept = [c.name.lower() for c in duplicates_schema(contract).fields]
        if len(set(kept)) < len(kept):
            raise _bad(source, "/x-lakehouse/id", f"{contract.id_field!r} is a column the lake"
                       f" adds to {contract.tables.duplicates}"
                       f" ({', '.join(kept[1:])})")  # fmt: skip


def _refuse_shared_tables(contracts: Iterable[Contract]) -> None:
    owners: dict[str, str] = {}
    readers: dict[str, str] = {}
    for contract in contracts:
        # One ingest query per topic: replay, reconcile and promote find a contract by it.
        if contract.topic in readers:
            raise ContractError(
                f"{contract.source}: topic {contract.topic} is also read by contract "
                f"{readers[contract.topic]}"
            )
        readers[contract.topic] = contract.name
        for table in (contract.tables.bronze, contract.tables.silver, contract.tables.duplicates):
            if table is None:
                continue
            if table in owners:
                raise ContractError(
                    f"{contract.source}: table {table} is also written by contract {owners[table]}"
                )
            owners[table] = contract.name
